"""The worker log of expected closes: one line each, no traceback (#23 item 13).

A refused workspace and a cancel are outcomes a run reports to its user; the worker's log
is for what went wrong in the worker. A real worker process, its log read as written.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError

from durable_agent.model_server import ModelServer, Reply
from durable_agent.processes import spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import start, until, wait_for
from tests.scripts import Script, answer, tools
from tests.test_crash import SlowTurn, worker_env


async def test_a_refused_workspace_and_a_cancel_leave_no_traceback_in_the_worker_log(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    worker = spawn_worker(worker_env(temporal_server, model_server, task_queue), log)
    try:
        refused = await start(client, task_queue, goal="x", workspace="/etc")
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(refused.result(), 60)
        assert "a system folder is never a workspace" in str(failure.value.cause)

        # A cancel during a command, then one during a model call.
        model_server.responder = Script([tools(("run_command", {"command": "touch started; sleep 60"}))])
        during_command = await start(client, task_queue, goal="x", workspace=str(workspace))
        await wait_for(during_command, lambda s: (workspace / "started").exists(), timeout_s=60)
        await during_command.cancel()
        assert (await asyncio.wait_for(during_command.result(), 60)).state == "cancelled"

        slow = SlowTurn(answer("late"), delay_s=120)
        answered = threading.Event()

        def respond(request: dict[str, Any]) -> Reply:
            reply = slow(request)
            answered.set()
            return reply

        model_server.responder = respond
        during_model_call = await start(client, task_queue, goal="x", workspace=str(workspace))
        await until(slow.asked.is_set)
        await during_model_call.cancel()
        assert (await asyncio.wait_for(during_model_call.result(), 60)).state == "cancelled"
        slow.release()
        await until(answered.is_set)  # the abandoned call has ended on the worker too
    finally:
        stop_gently(worker)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
