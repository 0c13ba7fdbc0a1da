"""`commands.on_interrupt`: what follows a command whose worker was SIGKILLed under it.

Real worker subprocesses; the command writes a ledger line each time it starts, prints a
marker, and waits for the test's go (which comes after the kill).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.snapshots import STORE_ENV, Store
from activities.tools import INTERRUPTED
from durable_agent.model_server import ModelServer
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from durable_agent.step_history import chain_steps
from tests.helpers import start, until, wait_for
from tests.scripts import Script, tool_results, tools
from tests.test_crash import ledger_lines, worker_env

COMMAND = "echo run >> ledger.txt; echo partial-marker; until [ -e go ]; do sleep 0.05; done; echo finished"
BEAT_S = 2.5
"""Past a command's first heartbeat (a third of its 5 s timeout): the beat carries its output."""

MODES: dict[str, dict[str, Any]] = {
    "tell_model": {"on_interrupt": "tell_model"},
    "rerun": {"on_interrupt": "rerun", "rerun_patterns": [r"ledger\.txt"]},
    "rerun_other_commands": {"on_interrupt": "rerun", "rerun_patterns": [r"^make "]},
    "ask": {"on_interrupt": "ask"},
    "ask_then_skip": {"on_interrupt": "ask"},
}


@pytest.mark.parametrize("mode", list(MODES))
async def test_an_interrupted_command_follows_on_interrupt(
    mode: str,
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": COMMAND}))], final="done")
    env = {**worker_env(temporal_server, model_server, task_queue), STORE_ENV: str(tmp_path / "store")}
    workers = [spawn_worker(env, tmp_path / "w0.log")]
    ledger = workspace / "ledger.txt"
    try:
        handle = await start(client, task_queue, goal="x", workspace=str(workspace), commands=MODES[mode])
        await until(lambda: ledger_lines(ledger) == ["run"])
        await asyncio.sleep(BEAT_S)
        kill_hard(workers[-1])
        (workspace / "go").touch()
        workers.append(spawn_worker(env, tmp_path / "w1.log"))
        if mode.startswith("ask"):
            status = await wait_for(handle, lambda s: s.state == "needs_attention", timeout_s=60)
            report = status.attention
            assert report is not None and "until [ -e go ]" in report.what_failed, report
            assert "was interrupted" in report.what_failed
            assert INTERRUPTED in report.last_error and "partial-marker" in report.last_error, report
            assert ledger_lines(ledger) == ["run"]  # nothing ran again before the person's decision
            (workspace / "by-a-person.txt").write_text("tidied up\n")
            await handle.execute_update("resolve", {"action": "skip" if mode == "ask_then_skip" else "retry"})
        result = await asyncio.wait_for(handle.result(), 90)
    finally:
        stop_gently(workers[-1])
    assert result.state == "completed" and result.output == "done"
    # The step's snapshot was taken after all of it: the rerun, and what a person did meanwhile.
    [point] = [p for p in (await chain_steps(client, handle.id)).points if p.step == 1]
    snapshot = Store(tmp_path / "store").files(point.digest)
    assert "go" in snapshot and ("by-a-person.txt" in snapshot) == mode.startswith("ask")
    told = tool_results(model_server.requests[-1])[0]
    if mode in ("rerun", "ask"):
        assert ledger_lines(ledger) == ["run", "run"]
        assert told.startswith("[run 2 times: the worker running it died") and "finished" in told, told
    else:
        assert ledger_lines(ledger) == ["run"]
        assert told.startswith(f"ERROR: {INTERRUPTED}") and "partial-marker" in told, told
