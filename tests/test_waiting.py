"""A run that waits (on a model, a person, a pause): cancel, per-call attention, messages
added while it waits, time that does not count, and what closed runs show (issue 13,
items 3, 4, 7, 8 and 11)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from durable_agent.model_server import Failure, ModelServer, Reply
from durable_agent.server import EmbeddedServer
from tests.helpers import HELD_COMMAND, rejected_update, release, run_cli, start, wait_for
from tests.scripts import Script, answer, tool_results, tools
from tests.test_cli import durable_agent
from workflows.types import AgentStatus


def failing_then(text: str):
    """A model endpoint that fails with HTTP 400 (no retries) until `fixed` is set."""
    state = {"fixed": False}

    def respond(request: dict[str, Any]) -> Reply | Failure:
        return Reply(content=text) if state["fixed"] else Failure(400, "bad request")

    return respond, state


WAITS = ["model_call", "needs_attention", "awaiting_approval", "paused"]


@pytest.mark.parametrize("waiting_in", WAITS)
async def test_cancel_ends_the_run_as_cancelled_whatever_it_waits_for(
    waiting_in: str,
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
) -> None:
    fields: dict[str, Any] = {}
    if waiting_in == "model_call":
        model_server.latency_s = 5
        model_server.responder = Script([], final="too late")
    elif waiting_in == "needs_attention":
        model_server.responder = failing_then("too late")[0]
    elif waiting_in == "awaiting_approval":
        model_server.responder = Script([tools(("run_command", {"command": "echo hi"}))])
        fields["approval"] = {"tools": ["run_command"]}
    elif waiting_in == "paused":  # the pause lands while step 1's command runs (held: the cancel ends it)
        model_server.responder = Script([tools(("run_command", {"command": HELD_COMMAND}))])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), **fields)
    if waiting_in == "paused":
        await wait_for(handle, lambda s: (workspace / "started").exists())
        await handle.signal("pause")
        await wait_for(handle, lambda s: s.state == "paused")
    elif waiting_in == "model_call":
        await wait_for(handle, lambda s: len(model_server.requests) == 1)
    else:
        await wait_for(handle, lambda s: s.state == waiting_in)
    cancelled = await run_cli(temporal_server.address, "workflow", "cancel", "--workflow-id", handle.id)
    assert cancelled.returncode == 0, cancelled.stderr
    result = await asyncio.wait_for(handle.result(), 30)
    assert (result.state, result.stop_reason) == ("cancelled", "cancelled")
    assert len(model_server.requests) == 1


async def test_messages_added_while_a_run_needs_attention_reach_the_retried_call(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    respond, state = failing_then("done")
    model_server.responder = respond
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await wait_for(handle, lambda s: s.state == "needs_attention")
    await handle.signal("add_message", {"text": "use the short format"})
    state["fixed"] = True
    await handle.execute_update("resolve", {"action": "retry"})
    result = await handle.result()
    assert result.output == "done"
    sent = model_server.requests[-1]["messages"]
    assert {"role": "user", "content": "use the short format"} in sent


def two_stubborn_calls(request: dict[str, Any]) -> Reply:
    results = tool_results(request)
    if any("skipped by a person" in r for r in results) and any("retried" in r for r in results):
        return Reply(content="moved on")
    return Reply(tool_calls=[("read_file", {"path": "one.txt"}), ("read_file", {"path": "two.txt"})])


async def test_parallel_livelocked_calls_are_reported_and_resolved_one_by_one(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = two_stubborn_calls
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: len(s.attention_reports) == 2)
    assert status.state == "needs_attention" and status.attention is not None
    one, two = sorted(status.attention_reports, key=lambda r: r.what_failed)
    assert "one.txt" in one.what_failed and "two.txt" in two.what_failed and one.call_id != two.call_id
    assert "no open attention report" in await rejected_update(
        handle, "resolve", {"action": "skip", "call_id": "3:nope"}
    )
    await handle.execute_update("resolve", {"action": "skip", "call_id": one.call_id})
    status = await wait_for(handle, lambda s: len(s.attention_reports) == 1)
    assert status.attention_reports[0].call_id == two.call_id and status.state == "needs_attention"
    (workspace / "two.txt").write_text("retried")
    await handle.execute_update("resolve", {"action": "retry"})  # no id: every open report (one left)
    result = await handle.result()
    assert result.output == "moved on"


async def test_the_command_line_shows_every_report_and_resolves_one_call(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
) -> None:
    model_server.responder = two_stubborn_calls
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: len(s.attention_reports) == 2)
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server.address}
    shown = await durable_agent("status", handle.id, env=env)
    for report in status.attention_reports:
        assert f"resolve {handle.id} retry|skip|terminate --call {report.call_id}" in shown.stdout, shown.stdout
    one = next(r for r in status.attention_reports if "one.txt" in r.what_failed)
    done = await durable_agent("resolve", handle.id, "skip", "--call", one.call_id or "", env=env)
    assert done.returncode == 0, done.stderr
    status = await wait_for(handle, lambda s: len(s.attention_reports) == 1)
    assert "two.txt" in status.attention_reports[0].what_failed
    await handle.execute_update("resolve", {"action": "terminate"})
    assert (await handle.result()).state == "terminated"


@pytest.mark.parametrize("waiting_in", ["paused", "awaiting_approval"])
async def test_time_waiting_for_a_person_does_not_count_against_max_duration(
    waiting_in: str, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("list_files", {})), answer("in time")])
    # The budget leaves room for a loaded machine's slow steps; the wait is longer than it.
    fields: dict[str, Any] = {"limits": {"max_duration_s": 8}}
    if waiting_in == "awaiting_approval":
        fields["approval"] = {"tools": ["list_files"]}
    if waiting_in == "paused":  # signal-with-start: the pause holds before the first step
        handle = await start(client, task_queue, start_signal="pause", goal="x", workspace=str(workspace), **fields)
    else:
        handle = await start(client, task_queue, goal="x", workspace=str(workspace), **fields)
    await wait_for(handle, lambda s: s.state == waiting_in)
    # The state says so as the signal (or the call) lands; the run's clock stops a moment
    # later, when it reaches the wait. From then on two readings 0.3 s apart agree.
    before = await stopped_clock(handle)
    await asyncio.sleep(8.5)  # longer than the whole time budget
    status = await handle.query("status", result_type=AgentStatus)
    assert status.state == waiting_in and status.usage.elapsed_s == before  # the wait does not count
    resumed = time.monotonic()
    if waiting_in == "paused":
        await handle.signal("resume")
    else:
        await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
    result = await handle.result()
    assert (result.state, result.output) == ("completed", "in time"), result
    # After the wait, only the time since the resume was added.
    assert result.usage.elapsed_s - before <= time.monotonic() - resumed + 0.01, (before, result.usage)


async def stopped_clock(handle: WorkflowHandle, within_s: float = 30) -> float:
    """The run's elapsed time once it stands still (a wait for a person has begun)."""

    async def poll() -> float:
        last = None
        while True:
            elapsed = (await handle.query("status", result_type=AgentStatus)).usage.elapsed_s
            if elapsed == last:
                return elapsed
            last = elapsed
            await asyncio.sleep(0.3)

    return await asyncio.wait_for(poll(), timeout=within_s)


async def test_status_elapsed_is_live_while_a_command_runs(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # No workflow task runs while the command does, so workflow.now() stands still.
    model_server.responder = Script([tools(("run_command", {"command": HELD_COMMAND}))], final="slow")
    began = time.monotonic()
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await wait_for(handle, lambda s: (workspace / "started").exists())

    async def elapsed_now() -> tuple[float, float, float]:
        sent = time.monotonic()
        elapsed = (await handle.query("status", result_type=AgentStatus)).usage.elapsed_s
        return sent, elapsed, time.monotonic()

    sent_1, first, answered_1 = await elapsed_now()
    await asyncio.sleep(2)
    sent_2, second, answered_2 = await elapsed_now()
    # Live: it grew by the time between the two answers (each read the clock while it was
    # asked), however late the run's first workflow task started.
    grown = second - first
    assert sent_2 - answered_1 - 0.01 <= grown <= answered_2 - sent_1 + 0.01, (first, second)
    assert second <= time.monotonic() - began
    release(workspace)
    await handle.result()


async def count_runs(client: Client, query: str) -> int:
    return len([run async for run in client.list_workflows(query)])


async def test_no_closed_run_keeps_agent_state_running(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("list_files", {}))] * 24, final="long done")
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), continue_as_new_every=10)
    result = await handle.result()
    assert result.output == "long done"
    chain = f'WorkflowId="{handle.id}"'

    async def settled() -> None:  # visibility is eventually consistent
        while await count_runs(client, f'{chain} AND ExecutionStatus != "Running"') < 3:
            await asyncio.sleep(0.2)

    await asyncio.wait_for(settled(), 30)
    assert await count_runs(client, f'{chain} AND AgentState="running"') == 0
    assert await count_runs(client, f'{chain} AND AgentState="completed"') == 1


async def test_list_shows_a_terminated_run_as_closed(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
) -> None:
    # `temporal workflow terminate` runs no workflow code: AgentState stays as it was.
    model_server.responder = Script([tools(("run_command", {"command": "echo hi"}))])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), approval={"tools": ["run_command"]})
    await wait_for(handle, lambda s: s.state == "awaiting_approval")
    done = await run_cli(temporal_server.address, "workflow", "terminate", "--workflow-id", handle.id)
    assert done.returncode == 0, done.stderr

    async def closed() -> None:
        query = f'WorkflowId="{handle.id}" AND ExecutionStatus="Terminated"'
        while await count_runs(client, query) < 1:
            await asyncio.sleep(0.2)

    await asyncio.wait_for(closed(), 30)
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server.address}
    waiting = await durable_agent("list", "--state", "awaiting_approval", "--limit", "1000", env=env)
    assert waiting.returncode == 0 and handle.id not in waiting.stdout, waiting
    listed = await durable_agent("list", "--limit", "1000", env=env)
    [row] = [line.split() for line in listed.stdout.splitlines() if line.startswith(handle.id)]
    assert row[1] == "terminated", row
