"""The embedded server's start survives losing a race for a port it picked itself
(durable_agent/server.py): a real `temporal server start-dev`, a real socket in its way."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from durable_agent import server as server_module
from durable_agent.server import PORT_RACE_ATTEMPTS, ServerError, free_port, port_open, start_server


def _http_port(port: int) -> list[str]:
    """The port the server would otherwise pick at random, named: the test can take it first."""
    return ["--http-port", str(port)]


def _bound(port: int) -> socket.socket:
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", port))
    taken.listen()
    return taken


def _release_after_first_failure(taken: socket.socket, log: Path) -> threading.Thread:
    def release() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log.exists() and "address already in use" in log.read_text(errors="replace"):
                break
            time.sleep(0.05)
        taken.close()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


def test_a_server_whose_http_port_was_taken_as_it_started_is_started_again(tmp_path: Path) -> None:
    port, http_port = free_port(), free_port()
    taken = _bound(http_port)
    releaser = _release_after_first_failure(taken, tmp_path / f"server-{port}.log")
    server = start_server(tmp_path, port=port, ui_port=None, persistent=False, extra_args=_http_port(http_port))
    try:
        releaser.join()
        log = (tmp_path / f"server-{port}.log").read_text(errors="replace")
        assert log.count("address already in use") >= 1, log[-2000:]  # the first launch lost the port
        assert server.process.poll() is None
    finally:
        server.stop()


def test_a_port_that_stays_taken_fails_the_start_with_the_servers_words(tmp_path: Path) -> None:
    port, http_port = free_port(), free_port()
    with _bound(http_port):
        with pytest.raises(ServerError, match="address already in use"):
            start_server(tmp_path, port=port, ui_port=None, persistent=False, extra_args=_http_port(http_port))
    log = (tmp_path / f"server-{port}.log").read_text(errors="replace")
    assert log.count("address already in use") == PORT_RACE_ATTEMPTS, log[-2000:]  # tried again, then gave up


LOST_LISTENER_LINE = (
    '{"time":"2026-12-03T19:09:30.822454755Z","level":"ERROR","msg":"Failed to start gRPC listener",'
    '"error":"listen tcp 127.0.0.1:33125: bind: address already in use","service":"worker",'
    '"address":"127.0.0.1:33125"}\n'
)
"""The line a real server logged when its worker service lost its port to another process; it
answered health checks, then exited with a nil-pointer panic a few seconds later."""


def test_a_server_that_lost_an_internal_port_is_stopped_and_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The internal services' ports cannot be named on the command line, so the test cannot
    take one first: the first launch, a real server, gets the line its log would hold."""
    launched: list[subprocess.Popen[bytes]] = []

    def launch(args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
        launched.append(real_launch(args, log_file))
        if len(launched) == 1:
            with open(log_file, "a") as log:
                log.write(LOST_LISTENER_LINE)
        return launched[-1]

    real_launch = server_module._launch
    monkeypatch.setattr(server_module, "_launch", launch)
    port = free_port()
    server = start_server(tmp_path, port=port, ui_port=None, persistent=False)
    try:
        assert len(launched) == 2
        assert launched[0].poll() is not None  # the server that would have died is gone
        assert server.process is launched[1] and server.process.poll() is None
        assert port_open("127.0.0.1", port)
    finally:
        server.stop()
