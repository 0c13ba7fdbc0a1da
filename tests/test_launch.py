"""Where `run` links to the Web UI: the UI of a server this home started, or the one the person names; never a guess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agent.launch import LaunchError, auto_ui_port, ui_url
from durable_agent.server import free_port


@pytest.fixture
def listener() -> Iterator[int]:
    """Something listening on a local port, as another user's server would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DURABLE_AGENT_HOME", str(tmp_path))
    monkeypatch.delenv("DURABLE_AGENT_UI_URL", raising=False)
    monkeypatch.delenv("DURABLE_AGENT_UI_PORT", raising=False)
    return tmp_path


def record(home: Path, port: int, ui_port: int | None, pid: int) -> None:
    (home / f"server-{port}.json").write_text(json.dumps({"port": port, "ui_port": ui_port, "pid": pid}))


def test_a_port_that_merely_listens_gets_no_link(home: Path, listener: int) -> None:
    # The old guess: UI = gRPC port + 1000, taken because something listened there.
    assert ui_url(f"127.0.0.1:{listener - 1000}") is None


def test_the_ui_of_a_server_this_home_started(home: Path, listener: int) -> None:
    port = free_port()
    record(home, port, listener, os.getpid())
    assert ui_url(f"127.0.0.1:{port}") == f"http://localhost:{listener}"
    assert ui_url(f"localhost:{port}") == f"http://localhost:{listener}"


def test_a_record_left_by_a_dead_server_is_not_trusted(home: Path, listener: int) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    port = free_port()
    record(home, port, listener, gone.pid)
    assert ui_url(f"127.0.0.1:{port}") is None


def test_the_person_names_the_ui(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENT_UI_URL", "https://temporal.example.com/")
    assert ui_url("temporal.example.com:7233") == "https://temporal.example.com"


def test_the_auto_started_servers_ui_port_can_be_chosen(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert auto_ui_port(47233) == 48233
    monkeypatch.setenv("DURABLE_AGENT_UI_PORT", "47999")
    assert auto_ui_port(47233) == 47999
    monkeypatch.setenv("DURABLE_AGENT_UI_PORT", "0")
    assert auto_ui_port(47233) is None
    monkeypatch.setenv("DURABLE_AGENT_UI_PORT", "http")
    with pytest.raises(LaunchError, match="not a port number"):
        auto_ui_port(47233)
