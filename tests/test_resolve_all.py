"""`durable-agent resolve --all ACTION`: one decision for every live run that needs attention."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent.model_server import Failure, ModelServer, Reply
from tests.helpers import start, wait_for
from worker import build_worker


async def durable_agent(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, against the session's server (TEMPORAL_ADDRESS)."""
    command = [sys.executable, "-m", "durable_agent.cli", *args]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120)


async def test_resolve_all_retries_every_run_that_needs_attention_and_no_other(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    healed = False

    def respond(request: dict) -> Reply | Failure:
        return Reply(content="back") if healed else Failure(401, "bad key")  # not retried: attention at once

    model_server.responder = respond
    stuck = [await start(client, task_queue, goal=f"run {i}", workspace=str(workspace)) for i in range(3)]
    paused = await start(client, task_queue, start_signal="pause", goal="paused", workspace=str(workspace))
    for handle in stuck:
        await wait_for(handle, lambda s: s.state == "needs_attention")
    await wait_for(paused, lambda s: s.state == "paused")

    refused = await durable_agent("resolve", "retry")
    assert refused.returncode == 2 and "either a run's ID or --all" in refused.stderr + refused.stdout

    healed = True
    only_ours = f"TaskQueue = '{task_queue}'"
    decided = await durable_agent("resolve", "--all", "retry", "--note", "key fixed", "--query", only_ours)
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert "retry: 3 of 3 run(s) in needs_attention" in decided.stdout, decided.stdout
    results = [await asyncio.wait_for(handle.result(), 60) for handle in stuck]
    assert [(r.state, r.output) for r in results] == [("completed", "back")] * 3
    assert (await wait_for(paused, lambda s: True)).state == "paused"  # not in the state: untouched

    again = await durable_agent("resolve", "--all", "retry", "--query", only_ours)
    assert again.returncode == 0 and "no live runs in state needs_attention" in again.stdout
    await paused.cancel()


async def test_a_run_no_worker_takes_the_decision_for_is_reported_and_the_exit_code_says_so(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = lambda request: Failure(401, "bad key")
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="orphan", workspace=str(workspace))
        await wait_for(handle, lambda s: s.state == "needs_attention")
    # Its worker is gone: the update cannot be taken.
    decided = await durable_agent("resolve", "--all", "skip", "--wait", "3", "--query", f"TaskQueue = '{task_queue}'")
    assert decided.returncode == 1, decided
    assert f"{handle.id}: not resolved: no worker took the decision within 3 s" in decided.stdout
    assert "skip: 0 of 1 run(s) in needs_attention" in decided.stdout
    await handle.terminate()


async def test_a_wait_that_is_not_a_number_of_seconds_is_a_usage_error() -> None:
    for bad in ("0", "nan", "soon"):
        refused = await durable_agent("resolve", "--all", "skip", "--wait", bad)
        assert refused.returncode == 2, refused
        assert "error: argument --wait: " in refused.stderr and "Traceback" not in refused.stderr, refused
