"""SIGKILL the worker during a command, between steps and during a model call; the run finishes.

Workers are real subprocesses (`python worker.py`); the model is the scripted HTTP stub.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from temporalio.client import Client

from activities.tools import INTERRUPTED
from durable_agent.model_server import Failure, ModelServer, Reply, count_assistant_turns
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import run_cli, start, until, wait_for
from tests.scripts import Script, answer, tool_results, tools


class SlowTurn:
    """A model turn held the first time it is asked, until `release()` or at most `delay_s`;
    it says when it was asked. A test that must kill a worker during the call holds it
    longer than a loaded machine could take to get there, and releases it after the kill."""

    def __init__(self, reply: Reply, delay_s: float) -> None:
        self.reply = reply
        self.delay_s = delay_s
        self.asked = threading.Event()
        self.released = threading.Event()

    def __call__(self, request: dict[str, Any]) -> Reply:
        if not self.asked.is_set():
            self.asked.set()
            self.released.wait(self.delay_s)
        return self.reply

    def release(self) -> None:
        self.released.set()


def worker_env(server: EmbeddedServer, model: ModelServer, task_queue: str) -> dict[str, str]:
    """What a worker subprocess needs: the test's server, task queue and model stub."""
    return {
        "TEMPORAL_ADDRESS": server.address,
        "DURABLE_AGENT_TASK_QUEUE": task_queue,
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "test-key",
    }


def ledger_lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def test_run_survives_worker_kills_at_three_points(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    ledger = workspace / "ledger.txt"
    slow_model = SlowTurn(tools(("run_command", {"command": "echo 3 >> ledger.txt"})), delay_s=120)
    model_server.responder = Script(
        [
            # It waits for the test's go, which comes after the kill: the kill lands during it.
            tools(("run_command", {"command": "echo 1 >> ledger.txt; until [ -e go ]; do sleep 0.05; done"})),
            tools(
                ("write_file", {"path": "f.txt", "content": "one"}),
                ("run_command", {"command": "echo 2 >> ledger.txt"}),
            ),
            slow_model,
            tools(("edit_file", {"path": "f.txt", "old_text": "one", "new_text": "two"})),
            answer("all done"),
        ]
    )
    env = worker_env(temporal_server, model_server, task_queue)
    logs = tmp_path / "workers"
    worker = spawn_worker(env, logs / "w0.log")
    kills = 0

    async def kill_and_replace() -> None:
        nonlocal worker, kills
        kill_hard(worker)
        kills += 1
        await asyncio.sleep(0.5)
        worker = spawn_worker(env, logs / f"w{kills}.log")

    try:
        handle = await start(client, task_queue, goal="crash me", workspace=str(workspace))
        await until(lambda: ledger_lines(ledger) == ["1"])  # during the command
        await kill_and_replace()
        (workspace / "go").touch()  # had the command outlived its worker, it would end now
        await until(lambda: "2" in ledger_lines(ledger))  # between steps
        await kill_and_replace()
        await until(slow_model.asked.is_set)  # during a model call
        await kill_and_replace()
        slow_model.release()
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        stop_gently(worker)

    assert result.state == "completed" and result.output == "all done"
    assert ledger_lines(ledger) == ["1", "2", "3"]  # every side effect exactly once
    # The first kill landed during the command: the model was told it was cut short.
    assert tool_results(model_server.requests[-1])[0].startswith(f"ERROR: {INTERRUPTED}")
    assert (workspace / "f.txt").read_text() == "two"  # the edit applied once, not twice
    model_calls = len(model_server.requests)
    assert model_calls <= result.steps + kills
    turns = sorted(count_assistant_turns(r) for r in model_server.requests)
    assert len(turns) - len(set(turns)) <= kills  # at most one repeated model call per kill
    # The call repeated on a new worker read its context from the run (its cache was
    # empty), and was sent exactly what the first attempt was.
    sent: dict[int, list[Any]] = {}
    for request in model_server.requests:
        sent.setdefault(count_assistant_turns(request), []).append(request["messages"])
    assert all(context == contexts[0] for contexts in sent.values() for context in contexts)


async def test_waiting_states_survive_worker_kills(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    healed = threading.Event()

    def flaky_second_turn(request: dict[str, Any]) -> Reply | Failure:
        if not healed.is_set():
            return Failure(503, "overloaded", headers={"retry-after-ms": "20"})
        return Reply(tool_calls=[("list_files", {})])

    model_server.responder = Script(
        [tools(("run_command", {"command": "echo ran >> ledger.txt"})), flaky_second_turn], final="survived"
    )
    env = worker_env(temporal_server, model_server, task_queue)
    workers = [spawn_worker(env, tmp_path / "w0.log")]

    async def restart_worker() -> None:
        kill_hard(workers[-1])
        await asyncio.sleep(0.5)
        workers.append(spawn_worker(env, tmp_path / f"w{len(workers)}.log"))

    try:
        handle = await start(
            client, task_queue, goal="wait a lot", workspace=str(workspace), approval={"tools": ["run_command"]}
        )
        before = await wait_for(handle, lambda s: s.state == "awaiting_approval")
        await restart_worker()
        after = await wait_for(handle, lambda s: s.state == "awaiting_approval")
        assert after.pending_approvals == before.pending_approvals
        await handle.execute_update("approve", {"call_id": after.pending_approvals[0].call_id, "approved": True})

        await wait_for(handle, lambda s: s.state == "needs_attention")
        await handle.signal("pause", {"reason": "after the fix"})
        await restart_worker()
        status = await wait_for(handle, lambda s: s.state == "needs_attention")
        assert status.attention is not None and "503" in status.attention.last_error
        healed.set()
        await handle.execute_update("resolve", {"action": "retry"})

        await wait_for(handle, lambda s: s.state == "paused")
        listed = await run_cli(
            temporal_server.address, "workflow", "list", "--query", f'AgentState="paused" AND WorkflowId="{handle.id}"'
        )
        assert handle.id in listed.stdout
        await restart_worker()
        assert (await wait_for(handle, lambda s: s.state == "paused")).paused_reason == "after the fix"
        await handle.signal("resume")
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        stop_gently(workers[-1])
    assert result.state == "completed" and result.output == "survived"
    assert ledger_lines(workspace / "ledger.txt") == ["ran"]
