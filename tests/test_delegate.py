"""`delegate`: child runs with their own context, carved budgets, roll-up, control and waits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer, Reply, count_assistant_turns
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import start, until, wait_for
from tests.scripts import ByGoal, Script, goal_of, tool_results
from tests.test_crash import ledger_lines, worker_env
from workflows.delegation import DelegateRefused, Delegates, carve_limits
from workflows.types import AgentInput, AgentResult, ChildRun, Limits, PendingApproval, Usage, WaitLink
from workflows.wait_graph import chain_text, find_cycle, wait_chains

TOKENS = {"input_tokens": 100, "output_tokens": 10}


def step(*calls: tuple[str, dict]) -> Reply:
    return Reply(tool_calls=list(calls), **TOKENS)


def say(text: str) -> Reply:
    return Reply(content=text, **TOKENS)


def delegate(goal: str, **fields: object) -> tuple[str, dict]:
    return ("delegate", {"goal": goal, **fields})


async def child_result(client: Client, child_id: str) -> AgentResult:
    return await client.get_workflow_handle(child_id, result_type=AgentResult).result()


def child_ids(status_or_history) -> list[str]:
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in status_or_history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


def totals(*usages: Usage) -> tuple[int, int, int, int]:
    return (
        sum(u.input_tokens for u in usages),
        sum(u.output_tokens for u in usages),
        sum(u.model_calls for u in usages),
        sum(u.tool_calls for u in usages),
    )


async def test_parallel_delegates_finish_one_stops_on_its_share_and_usage_rolls_up_exactly(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("CHILD-ONLY-CONTENT\n")
    model_server.responder = ByGoal(
        {
            "plan": Script(
                [
                    step(delegate("write a", tools=["write_file", "read_file"]), delegate("write b")),
                    step(delegate("loop forever", budget_share=0.1)),
                    say("all delegated"),
                ]
            ),
            "write a": Script(
                [
                    step(("read_file", {"path": "notes.txt"}), ("write_file", {"path": "a.txt", "content": "a"})),
                    say("a done"),
                ]
            ),
            "write b": Script([step(("write_file", {"path": "b.txt", "content": "b"})), say("b done")]),
            "loop forever": Script([step(("list_files", {}))] * 50),
        }
    )
    handle = await start(client, task_queue, goal="plan", workspace=str(workspace), limits={"max_model_calls": 40})
    result = await handle.result()

    assert result.state == "completed" and result.output == "all delegated"
    assert (workspace / "a.txt").read_text() == "a" and (workspace / "b.txt").read_text() == "b"
    history = await handle.fetch_history()
    ids = child_ids(history)
    assert len(ids) == 3
    types = [e.event_type for e in history.events]
    # Both delegates of the first reply were started before either finished: in parallel.
    first_done = types.index(EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED)
    started = [i for i, t in enumerate(types) if t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED]
    assert started[1] < first_done
    a, b, looping = [await child_result(client, i) for i in ids]
    assert (a.state, a.output, b.output) == ("completed", "a done", "b done")
    assert looping.state == "stopped" and looping.stop_reason == "model_call_budget"
    # Its share: a tenth of the 40 - 1 - 4 (a and b) = 35 calls left when it was asked for.
    assert looping.usage.model_calls == 3
    # Exact roll-up: the parent's three calls plus every delegate's spend.
    own = Usage(input_tokens=300, output_tokens=30, model_calls=3, tool_calls=3)
    assert totals(result.usage) == totals(own, a.usage, b.usage, looping.usage)
    per_call = a.usage.cost_usd / a.usage.model_calls  # every reply has the same token counts
    assert abs(result.usage.cost_usd - per_call * result.usage.model_calls) < 1e-9
    # The parent's model got each delegate's summary and answer, never its transcript.
    parent_requests = [r for r in model_server.requests if goal_of(r) == "plan"]
    second = tool_results(parent_requests[1])
    assert "completed (final_answer)" in second[0] and "a done" in second[0]
    summary = json.loads(second[0].split("summary: ", 1)[1].split("\noutput:", 1)[0])
    assert summary["goal"] == "write a" and "step 1: read notes.txt" in summary["inputs"]
    assert "step 1: write_file a.txt" in summary["outputs"] and "answer: a done" in summary["outputs"]
    assert all("CHILD-ONLY-CONTENT" not in json.dumps(r) for r in parent_requests)
    third = tool_results(parent_requests[2])
    assert "stopped (model_call_budget)" in third[-1]


async def test_pause_resume_and_cancel_reach_a_running_delegate(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    slow = "echo started > started.txt; sleep 30; echo late > never.txt"
    model_server.responder = ByGoal(
        {"plan": Script([step(delegate("sleepy"))]), "sleepy": Script([step(("run_command", {"command": slow}))])}
    )
    handle = await start(client, task_queue, goal="plan", workspace=str(workspace))
    status = await wait_for(handle, lambda s: bool(s.children) and (workspace / "started.txt").exists())
    child = client.get_workflow_handle(status.children[0].workflow_id, result_type=AgentResult)

    await handle.signal("pause", {"reason": "lunch"})
    paused = await wait_for(child, lambda s: s.state == "paused")
    assert paused.paused_reason == f"parent {handle.id} paused: lunch"
    assert (await wait_for(handle, lambda s: s.children[0].state == "paused")).state == "paused"
    await handle.signal("resume")
    await wait_for(child, lambda s: s.state == "running")

    await handle.cancel()
    result = await handle.result()
    partial = await child.result()
    assert result.state == "cancelled" and partial.state == "cancelled"
    assert not (workspace / "never.txt").exists()  # the delegate's command was killed
    # Its partial spend was charged exactly: one model call each.
    assert (result.usage.model_calls, partial.usage.model_calls) == (2, 1)
    assert result.usage.tokens == 2 * partial.usage.tokens


async def test_a_delegate_awaiting_approval_shows_in_the_parent_and_a_stall_needs_attention(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = ByGoal(
        {
            "plan": Script([step(delegate("check")), say("checked")]),
            "check": Script([step(("run_command", {"command": "echo ok"})), say("ok")]),
        }
    )
    handle = await start(
        client,
        task_queue,
        goal="plan",
        workspace=str(workspace),
        approval={"commands": ["^echo"]},
        delegation={"stall_after_s": 3},  # the test sees the chain before the stall
    )
    status = await wait_for(handle, lambda s: bool(s.wait_chains))
    child_id = status.children[0].workflow_id
    chain = status.wait_chains[0]
    assert [link.workflow_id for link in chain] == [handle.id, child_id]
    assert chain[1].waiting_for.startswith("awaiting approval of call 1:call_0_0 (run_command: echo ok)")
    assert chain[1].command == f"durable-agent approve {child_id} 1:call_0_0"

    # No progress for stall_after_s while its delegate waits: the parent needs attention,
    # with the chain as its report.
    stalled = await wait_for(handle, lambda s: s.state == "needs_attention")
    assert stalled.attention is not None
    assert stalled.attention.what_failed == f"delegate {child_id} has made no progress for 3 s"
    assert f"{handle.id} → {child_id} → awaiting approval of call 1:call_0_0" in stalled.attention.last_error
    # The child is approved before the parent is told to go on: the stall timer re-arms at
    # the resolve, and on a slow machine an approval sent after it could come too late.
    child = client.get_workflow_handle(child_id, result_type=AgentResult)
    await child.execute_update("approve", {"call_id": "1:call_0_0", "approved": True})
    await handle.execute_update("resolve", {"action": "retry", "note": "I approved it"})
    result = await handle.result()
    assert result.state == "completed" and result.output == "checked"
    assert (await child.result()).output == "ok"


async def test_a_worker_killed_while_a_delegate_runs_starts_no_second_delegate_and_redoes_nothing(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    command = "echo once >> ledger.txt; sleep 2; echo slept"
    model_server.responder = ByGoal(
        {
            "plan": Script([step(delegate("work")), say("planned")]),
            "work": Script([step(("run_command", {"command": command})), say("worked")]),
        }
    )
    env = worker_env(temporal_server, model_server, task_queue)
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(client, task_queue, goal="plan", workspace=str(workspace))
        await until(lambda: ledger_lines(workspace / "ledger.txt") == ["once"])  # the delegate's command runs
        kill_hard(worker)
        worker = spawn_worker(env, tmp_path / "w1.log")
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        stop_gently(worker)

    assert result.state == "completed" and result.output == "planned"
    assert ledger_lines(workspace / "ledger.txt") == ["once"]  # the command ran once
    children = [w async for w in client.list_workflows(f'ParentWorkflowId="{handle.id}"')]
    assert len(children) == 1 and children[0].status == WorkflowExecutionStatus.COMPLETED
    # Each model turn of each run was asked once: nothing was redone.
    asked = sorted((goal_of(r), count_assistant_turns(r)) for r in model_server.requests)
    assert asked == [("plan", 0), ("plan", 1), ("work", 0), ("work", 1)]
    assert result.usage.model_calls == 4


async def test_fan_out_and_depth_limits_are_clear_tool_errors(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = ByGoal(
        {
            "plan": Script([step(delegate("deep"), delegate("second")), say("planned")]),
            "deep": Script([step(delegate("deeper"))], final="deep done"),
        }
    )
    handle = await start(
        client, task_queue, goal="plan", workspace=str(workspace), delegation={"max_depth": 1, "max_children": 1}
    )
    result = await handle.result()
    assert result.state == "completed"
    parent_results = tool_results([r for r in model_server.requests if goal_of(r) == "plan"][-1])
    assert "deep done" in parent_results[0]
    assert parent_results[1] == (
        "ERROR: fan-out limit reached: 1 delegates already running (delegation.max_children 1); wait for their results"
    )
    deep = [r for r in model_server.requests if goal_of(r) == "deep"]
    # At the deepest level the delegate is not offered `delegate`, and a call to it is refused.
    assert "delegate" not in {t["function"]["name"] for t in deep[0]["tools"]}
    assert tool_results(deep[-1])[0].startswith("ERROR: not run: unknown tool 'delegate'")


def test_the_depth_limit_and_a_budget_too_small_are_refused() -> None:
    root = AgentInput(goal="g", workspace="/w", delegation={"max_depth": 0})
    with pytest.raises(
        DelegateRefused, match=r"depth limit reached: this run is at depth 0 \(delegation.max_depth 0\)"
    ):
        Delegates().check_fan_out(root)
    spent = Usage(input_tokens=499_000, model_calls=10)
    with pytest.raises(DelegateRefused, match="not enough budget left to delegate"):
        carve_limits(Limits(), spent, 0.0, [], 0.5)
    held = Limits(max_model_calls=20, max_tokens=100_000, max_cost_usd=1.0, max_tool_calls=100)
    carved = carve_limits(Limits(), Usage(model_calls=10, input_tokens=100_000), 0.0, [held], 0.5)
    # Half of what is left after what was used and what a running delegate holds.
    assert (carved.max_model_calls, carved.max_tokens, carved.max_cost_usd, carved.max_tool_calls) == (
        35,
        150_000,
        2.0,
        100,
    )


def link(run: str, waiting_for: str) -> WaitLink:
    return WaitLink(workflow_id=run, waiting_for=waiting_for)


def test_wait_chains_run_through_delegates_and_a_cycle_is_found() -> None:
    approval = PendingApproval(call_id="2:call_1_0", tool="run_command", summary="run_command: ls", step=2, reason="r")
    child_chains = wait_chains("b", "awaiting_approval", [approval], [], None, [])
    assert chain_text(child_chains[0]) == (
        "b → awaiting approval of call 2:call_1_0 (run_command: ls) (unblock: durable-agent approve b 2:call_1_0)"
    )
    child = ChildRun(workflow_id="b", goal="g", limits=Limits(), wait_chains=child_chains)
    parent_chains = wait_chains("a", "running", [], [], None, [child])
    assert [lk.workflow_id for lk in parent_chains[0]] == ["a", "b"]
    assert find_cycle(parent_chains) is None
    # b waits on c, which waits on a: a cycle, cut where it closes.
    looped = [[link("a", "delegate b"), link("b", "delegate c"), link("c", "delegate a"), link("a", "delegate b")]]
    assert [lk.workflow_id for lk in find_cycle(looped) or []] == ["a", "b", "c", "a"]
    assert wait_chains("a", "running", [], [], None, []) == []


async def test_a_cycle_in_the_wait_chains_needs_attention_at_once(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # Delegates alone cannot wait in a cycle (a delegate's id derives from its parent's), so
    # the test sends the parent what a delegate would report if one did: the delegate waits
    # on the parent, which waits on the delegate.
    model_server.responder = ByGoal(
        {
            "plan": Script([step(delegate("hold")), say("went on")]),
            "hold": Script([step(("run_command", {"command": "sleep 30"}))]),
        }
    )
    handle = await start(client, task_queue, goal="plan", workspace=str(workspace))
    child_id = (await wait_for(handle, lambda s: s.children and s.children[0].step == 1)).children[0].workflow_id
    cycle = [
        {"workflow_id": child_id, "waiting_for": f"delegate {handle.id}"},
        {"workflow_id": handle.id, "waiting_for": f"delegate {child_id}"},
    ]
    report = {"workflow_id": child_id, "seq": 1_000, "state": "running", "step": 1, "usage": {}, "wait_chains": [cycle]}
    await handle.signal("child_report", report)
    stalled = await wait_for(handle, lambda s: s.state == "needs_attention")
    assert stalled.attention is not None and stalled.attention.what_failed == "a cycle of waits (deadlock)"
    assert f"{handle.id} → {child_id} → {handle.id} → delegate {child_id}" in stalled.attention.last_error
    await handle.execute_update("resolve", {"action": "skip"})  # cancels the delegate
    result = await handle.result()
    assert result.state == "completed" and result.output == "went on"
    cancelled = await child_result(client, child_id)
    assert cancelled.state == "cancelled"
    parent_requests = [r for r in model_server.requests if goal_of(r) == "plan"]
    assert "cancelled (cancelled)" in tool_results(parent_requests[-1])[-1]
