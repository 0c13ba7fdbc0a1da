"""A worker waits for its Temporal server, at start and while it runs (durable_agent/server_wait.py).

Real processes: `python worker.py` and `durable-agent worker` against a dev server of the
test's own, started after the worker and stopped (SIGKILL) and restarted under it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from durable_agent.connection import connect
from durable_agent.model_server import ModelServer
from durable_agent.processes import WORKER_SCRIPT, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer, free_port, start_server
from durable_agent.server_wait import gone_at_start
from tests.helpers import start, until
from tests.scripts import Script, answer, tools


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


async def _start_server(data: Path, port: int) -> EmbeddedServer:
    return await asyncio.to_thread(start_server, data, port=port, ui_port=None, persistent=True)


async def test_a_worker_waits_for_the_server_and_rides_out_its_restart(
    model_server: ModelServer, task_queue: str, workspace: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "DURABLE_AGENT_TASK_QUEUE": task_queue,
        "OPENAI_BASE_URL": model_server.base_url,
        "OPENAI_API_KEY": "test-key",
    }
    log = tmp_path / "worker.log"
    worker = spawn_worker(env, log)
    server: EmbeddedServer | None = None
    try:
        await until(lambda: "waiting for the Temporal server" in _log(log) or worker.poll() is not None)
        assert worker.poll() is None, _log(log)

        server = await _start_server(tmp_path / "temporal", port)
        await until(lambda: "worker polling task queue" in _log(log))
        assert "connected to the Temporal server" in _log(log)

        server.stop(signal.SIGKILL)
        await until(lambda: "lost the Temporal server" in _log(log) or worker.poll() is not None)
        # An outage long enough for the core to retry each poll several times (it warned from
        # the 6th retry, ~7 s in); the worker must stay up and quiet through it.
        await asyncio.sleep(12)
        assert worker.poll() is None, _log(log)
        server = await _start_server(tmp_path / "temporal", port)
        try:  # the client's reconnect backs off while the server is away: allow a loaded machine more
            await until(lambda: "answers again" in _log(log), within_s=120)
        except AssertionError:
            raise AssertionError(f"the worker never said the server answers again:\n{_log(log)}") from None

        # The same worker serves a run on the restarted server.
        model_server.responder = Script([tools(("run_command", {"command": "echo ran >> ledger.txt"})), answer("ok")])
        client = await connect(server.address)
        handle = await start(client, task_queue, goal="run one command", workspace=str(workspace))
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.state == "completed" and (workspace / "ledger.txt").read_text() == "ran\n"
    finally:
        stop_gently(worker)
        if server is not None:
            server.stop()
    text = _log(log)
    assert worker.returncode == 0, text
    # One line each way, not a traceback nor the core's warning for every retried poll.
    assert "Traceback" not in text and "retried" not in text, text


async def _exit_of(*command: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, err.decode()


async def test_a_connect_timeout_fails_fast_with_one_line() -> None:
    nothing_there = {**os.environ, "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}

    code, err = await _exit_of(
        sys.executable, str(WORKER_SCRIPT), env={**nothing_there, "DURABLE_AGENT_CONNECT_TIMEOUT_S": "1"}
    )
    assert code == 1 and err.count("\n") == 1 and "no Temporal server answered" in err, err

    code, err = await _exit_of(
        sys.executable, "-m", "durable_agent.cli", "worker", "--connect-timeout", "0", env=nothing_there
    )
    assert code == 2 and err.startswith("error: no Temporal server answered") and err.count("\n") == 1, err


async def test_ctrl_c_stops_a_worker_that_waits_for_its_server(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = spawn_worker({"TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}, log)
    try:
        await until(lambda: "waiting for the Temporal server" in _log(log) or worker.poll() is not None)
    finally:
        stop_gently(worker)  # SIGINT, as Ctrl-C sends
    assert worker.returncode == 0 and "Traceback" not in _log(log), _log(log)
    assert _log(log).splitlines()[-1] == "worker stopped before the server answered"


def test_a_server_lost_between_connect_and_the_workers_start_up_check_is_waited_for() -> None:
    # The message the SDK's bridge gives when the server went away after the worker connected
    # (seen in CI): the worker waits for the server and starts again, it does not exit.
    seen = RuntimeError(
        "Worker validation failed: Namespace default was not found or otherwise could not be described: "
        'Status { code: Unavailable, message: "tcp connect error" }'
    )
    assert gone_at_start(seen)
    assert not gone_at_start(RuntimeError("Worker validation failed: Namespace nope is not found"))
    assert not gone_at_start(RuntimeError("some other failure: Unavailable"))
