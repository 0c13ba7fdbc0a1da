"""The fleet benchmark's plain Temporal loop (bench/plain_temporal.py) does the benchmark
agent's work, with the peers' tools and with durable-agent's own tool activities, a reply's
tool calls at once or in order."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.harness import StepScript
from bench.plain_temporal import PLAIN_WORKFLOW, PlainCall, plain_worker
from bench.task import goal_for
from durable_agent.model_server import ModelServer

STEPS = 3


@pytest.mark.parametrize("product_tools", [False, True], ids=["peer tools", "durable-agent's tools"])
async def test_plain_loop_does_the_benchmark_agents_work(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, product_tools: bool
) -> None:
    model_server.responder = StepScript(STEPS)
    call = PlainCall.start(goal_for(0, STEPS), str(workspace), product_tools)
    async with plain_worker(client, task_queue):
        await client.execute_workflow(PLAIN_WORKFLOW, call, id=f"plain-{uuid.uuid4().hex[:8]}", task_queue=task_queue)

    assert (workspace / "ledger.txt").read_text() == "".join(f"{n}\n" for n in range(1, STEPS + 1))
    assert sorted(p.name for p in (workspace / "out").iterdir()) == [f"step-{n}.txt" for n in range(1, STEPS + 1)]
    # Only durable-agent's activities keep a journal: the last step's two calls are in it.
    done = list((workspace / ".durable-agent" / "journal").glob(f"*/step-{STEPS:06d}/*.done.json"))
    assert len(done) == (2 if product_tools else 0)
    tool_results = [m for m in model_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 2 * STEPS
    assert not any(m["content"].startswith("ERROR") for m in tool_results)


@pytest.mark.parametrize("in_order", [False, True], ids=["at once", "in order"])
async def test_plain_loop_runs_a_replys_tool_calls_at_once_or_in_order(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, in_order: bool
) -> None:
    model_server.responder = StepScript(STEPS)
    call = PlainCall.start(goal_for(0, STEPS), str(workspace), tools_in_order=in_order)
    async with plain_worker(client, task_queue):
        handle = await client.start_workflow(
            PLAIN_WORKFLOW, call, id=f"plain-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        await handle.result()

    # How many tool activities were open at once, read from history: scheduled and not yet closed.
    open_tools: set[int] = set()
    most_open = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == "plain_tool":
                open_tools.add(event.event_id)
                most_open = max(most_open, len(open_tools))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            open_tools.discard(event.activity_task_completed_event_attributes.scheduled_event_id)
    assert most_open == (1 if in_order else 2)
    assert (workspace / "ledger.txt").read_text() == "".join(f"{n}\n" for n in range(1, STEPS + 1))
