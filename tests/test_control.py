"""Human control: pause, resume, messages, approvals, raised limits, needs-attention, cancel."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

from durable_agent.model_server import Failure, ModelServer, Reply, count_assistant_turns
from durable_agent.server import EmbeddedServer
from tests.helpers import (
    HELD_COMMAND,
    cli_start_agent,
    host_processes_named,
    rejected_update,
    release,
    run_cli,
    start,
    step_done,
    until,
    wait_for,
)
from tests.scripts import Script, answer, tool_results, tools
from worker import build_worker
from workflows.agent import AGENT_STATE
from workflows.types import AgentInput, AgentResult, AgentStatus, Limits, Message


async def cli(server: EmbeddedServer, *args: str) -> subprocess.CompletedProcess[str]:
    return await run_cli(server.address, *args)


async def test_pause_holds_with_no_model_call_then_resume_continues(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": HELD_COMMAND})), answer("finished")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await until(lambda: (workspace / "started").exists())  # step 1's command runs
    await handle.signal("pause", {"reason": "lunch"})
    status = await wait_for(handle, lambda s: s.state == "paused")
    assert status.paused_reason == "lunch"
    calls = len(model_server.requests)
    release(workspace)
    await step_done(handle, 1)  # the in-flight command finished ...
    await asyncio.sleep(1)  # ... and no next model call starts
    assert len(model_server.requests) == calls == 1
    assert (await handle.query("status", result_type=AgentStatus)).state == "paused"
    assert "does not need attention" in await rejected_update(handle, "resolve", {"action": "skip"})
    await handle.signal("add_message", {"text": "please also say thanks"})
    await handle.signal("resume")
    result = await handle.result()
    assert result.state == "completed" and result.output == "finished"
    last = model_server.requests[-1]["messages"]
    assert last[-1] == {"role": "user", "content": "please also say thanks"}


def gated_script() -> Script:
    return Script(
        [
            tools(
                ("run_command", {"command": "echo approved >> ledger.txt"}),
                ("run_command", {"command": "rm -rf important"}),
                ("list_files", {}),
            ),
            answer("done"),
        ]
    )


async def test_approve_and_deny_through_the_python_client(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    (workspace / "important").mkdir()
    (workspace / "notes.txt").write_text("n")
    model_server.responder = gated_script()
    handle = await start(
        client,
        task_queue,
        goal="x",
        workspace=str(workspace),
        approval={"commands": [r"^echo", r"\brm\b"]},
    )
    status = await wait_for(handle, lambda s: len(s.pending_approvals) == 2)
    assert status.state == "awaiting_approval"
    echo, rm = sorted(status.pending_approvals, key=lambda p: "rm" in p.summary)
    assert "rm -rf important" in rm.summary and rm.reason

    assert "no pending approval" in await rejected_update(handle, "approve", {"call_id": "1:nope", "approved": True})
    await handle.execute_update("approve", {"call_id": echo.call_id, "approved": True})
    again = await rejected_update(handle, "approve", {"call_id": echo.call_id, "approved": True})
    assert "no pending approval" in again  # already decided
    await handle.execute_update("approve", {"call_id": rm.call_id, "approved": False, "note": "never delete that"})

    result = await handle.result()
    assert result.state == "completed"
    assert (workspace / "ledger.txt").read_text() == "approved\n" and (workspace / "important").exists()
    results = tool_results(model_server.requests[-1])
    assert "denied by a person: never delete that" in results[1]
    assert "notes.txt" in results[2]  # the ungated call ran without waiting


async def test_approve_through_the_temporal_cli(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
) -> None:
    model_server.responder = gated_script()
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), approval={"tools": ["run_command"]})
    status = await wait_for(handle, lambda s: len(s.pending_approvals) == 2)
    listed = await cli(
        temporal_server, "workflow", "list", "--query", f'AgentState="awaiting_approval" AND WorkflowId="{handle.id}"'
    )
    assert handle.id in listed.stdout
    rejected = await cli(
        temporal_server,
        "workflow",
        "update",
        "execute",
        "--workflow-id",
        handle.id,
        "--name",
        "approve",
        "--input",
        json.dumps({"call_id": "9:zzz", "approved": True}),
    )
    assert rejected.returncode != 0 and "no pending approval" in (rejected.stdout + rejected.stderr)
    for pending in status.pending_approvals:
        done = await cli(
            temporal_server,
            "workflow",
            "update",
            "execute",
            "--workflow-id",
            handle.id,
            "--name",
            "approve",
            "--input",
            json.dumps({"call_id": pending.call_id, "approved": "echo" in pending.summary}),
        )
        assert done.returncode == 0, done.stderr
    result = await handle.result()
    assert result.state == "completed" and (workspace / "ledger.txt").exists()


async def test_approval_timeout_denies(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = gated_script()
    handle = await start(
        client,
        task_queue,
        goal="x",
        workspace=str(workspace),
        approval={"tools": ["run_command"], "timeout_s": 1, "on_timeout": "deny"},
    )
    result = await handle.result()
    assert result.state == "completed" and not (workspace / "ledger.txt").exists()
    assert "no decision within 1 s" in tool_results(model_server.requests[-1])[0]


async def test_raise_limits_validates_and_applies(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # The first command holds step 1 open until the pause has landed.
    first = tools(("run_command", {"command": HELD_COMMAND}))
    model_server.responder = Script([first] + [tools(("list_files", {}))] * 4, final="finished late")
    handle = await start(
        client, task_queue, goal="x", workspace=str(workspace), limits={"soft_steps": 2, "hard_steps": 3}
    )
    await handle.signal("pause")
    await wait_for(handle, lambda s: s.state == "paused")
    release(workspace)
    assert "greater than or equal to 0" in await rejected_update(handle, "raise_limits", {"max_cost_usd": -1})
    assert "hard_steps" in await rejected_update(handle, "raise_limits", {"hard_steps": 1})
    assert "hard_stpes: unknown field" in await rejected_update(handle, "raise_limits", {"hard_stpes": 9})
    new = await handle.execute_update("raise_limits", {"hard_steps": 10, "soft_steps": 8}, result_type=Limits)
    assert new.hard_steps == 10 and new.max_tokens == 500_000
    await handle.signal("resume")
    result = await handle.result()
    assert result.state == "completed" and result.steps == 6


def always_500(request: dict[str, Any]) -> Failure | Reply:
    # retry-after-ms keeps the six attempts quick while still going through every retry.
    return Failure(500, "upstream exploded", headers={"retry-after-ms": "50"})


@pytest.mark.parametrize("action", ["retry", "skip", "terminate"])
async def test_needs_attention_from_a_failing_model_endpoint(
    action: str, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = always_500
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: s.state == "needs_attention")
    report = status.attention
    assert report is not None and "500" in report.last_error and report.attempts == 6
    assert "call_model" in report.what_failed and report.step == 1 and len(report.suggested_actions) == 3
    assert len(model_server.requests) == 6
    model_server.responder = Script([], final="back")
    await handle.execute_update("resolve", {"action": action, "note": "endpoint fixed"})
    result = await handle.result()
    if action == "terminate":
        assert result.state == "terminated" and result.unfinished
    else:
        assert result.state == "completed" and result.output == "back"


async def test_needs_attention_from_a_livelocked_tool(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    def stubborn(request: dict[str, Any]) -> Reply:
        if any("skipped by a person" in (m.get("content") or "") for m in request["messages"]):
            return Reply(content="gave up on it")
        return Reply(tool_calls=[("read_file", {"path": "missing.txt"})])

    model_server.responder = stubborn
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: s.state == "needs_attention")
    assert status.attention is not None and status.attention.attempts == 3 and status.step == 3
    assert "read_file: missing.txt" in status.attention.what_failed
    await handle.execute_update("resolve", {"action": "skip", "note": "file is gone for good"})
    result = await handle.result()
    assert result.state == "completed" and result.output == "gave up on it"


async def test_cancel_ends_cleanly_with_a_result(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    marker = f"cancel-me-{uuid.uuid4().hex[:12]}"
    model_server.responder = Script([tools(("run_command", {"command": f"touch started; exec -a {marker} sleep 60"}))])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await wait_for(handle, lambda s: (workspace / "started").exists() and bool(host_processes_named(marker)))
    await handle.cancel()
    result = await handle.result()
    assert result.state == "cancelled" and result.stop_reason == "cancelled" and result.unfinished
    assert not host_processes_named(marker)  # the run closes only once the command's processes are killed


@pytest.mark.parametrize("task_timeout_s", [1.5, 30.0], ids=["start_agent's", "restarted with the short one"])
async def test_a_cancel_sent_before_the_first_task_still_gives_a_result(
    task_timeout_s: float, client: Client, model_server: ModelServer, workspace: Path
) -> None:
    # The cancel arrives with the start: the first task must close the run as `cancelled`
    # with its result, not fail it before the loop (or continue it as new).
    queue = f"cancel-first-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(
        "AgentWorkflow",
        {"goal": "x", "workspace": str(workspace)},
        id=f"cancel-first-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
        task_timeout=timedelta(seconds=task_timeout_s),
        result_type=AgentResult,
    )
    await handle.cancel()
    async with build_worker(client, queue):
        result = await asyncio.wait_for(handle.result(), 30)
    assert (result.state, result.stop_reason, result.steps) == ("cancelled", "cancelled", 0)
    assert model_server.requests == []
    described = await handle.describe()
    assert described.run_id == handle.result_run_id  # the run that was started, not a successor
    assert described.typed_search_attributes.get(AGENT_STATE) == "cancelled"


async def test_transcript_by_step(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("list_files", {})), tools(("list_files", {})), answer("ok")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await handle.result()
    messages = await handle.query("transcript", {"from_step": 2}, result_type=list[Message])
    assert {m.step for m in messages} == {2, 3}
    assert count_assistant_turns({"messages": [m.model_dump() for m in messages]}) == 2


async def test_a_pause_sent_with_the_start_holds_before_the_first_step(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="after the pause")
    handle = await client.start_workflow(  # signal-with-start: the pause is in the first task
        "AgentWorkflow",
        AgentInput(goal="x", workspace=str(workspace)),
        id=f"early-{task_queue}",
        task_queue=task_queue,
        result_type=AgentResult,
        start_signal="pause",
        start_signal_args=[{"reason": "read the goal first"}],
    )
    status = await wait_for(handle, lambda s: s.state == "paused")
    assert status.step == 0 and not model_server.requests
    await handle.signal("resume")
    assert (await handle.result()).output == "after the pause"


async def workflow_tasks_failed(handle: WorkflowHandle) -> int:
    history = await handle.fetch_history()
    return sum(1 for event in history.events if event.HasField("workflow_task_failed_event_attributes"))


@pytest.mark.parametrize(
    "bad",
    [
        {"approval": {"tools": ["run_command"], "timeout_s": 1e15}},
        {"approval": {"tools": ["run_command"]}, "limits": {"max_duration_s": 1e15}},
        {"approval": {"tools": ["run_command"]}, "delegation": {"stall_after_s": 1e15}},
        {"approval": {"tools": ["run_command"]}, "context": {"max_context_tokens": 10**30}},
    ],
)
async def test_a_huge_duration_or_count_from_the_temporal_cli_closes_the_run_with_a_clear_error(
    bad: dict[str, Any],
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
) -> None:
    model_server.responder = gated_script()
    run_id = f"huge-{uuid.uuid4().hex[:8]}"
    started = await cli_start_agent(
        temporal_server.address, task_queue, run_id, {"goal": "x", "workspace": str(workspace), **bad}
    )
    assert started.returncode == 0, started.stderr
    handle = client.get_workflow_handle(run_id)
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), timeout=30)
    message = str(failure.value.cause)
    assert "invalid AgentInput" in message and "less than or equal" in message, message
    assert await workflow_tasks_failed(handle) == 0


async def test_raise_limits_with_infinity_or_huge_values_is_rejected_and_the_run_goes_on(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": HELD_COMMAND})), answer("finished")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await handle.signal("pause")
    await wait_for(handle, lambda s: s.state == "paused")
    release(workspace)
    # Raw JSON text, as a person types it: 1e309 is infinity to the workflow's JSON decoder.
    for patch in ('{"max_duration_s": 1e309}', '{"max_duration_s": 1e15}', '{"hard_steps": 1' + "0" * 30 + "}"):
        rejected = await cli(
            temporal_server, "workflow", "update", "execute", "--workflow-id", handle.id, "--name", "raise_limits",
            "--input", patch,
        )  # fmt: skip
        said = rejected.stdout + rejected.stderr
        assert rejected.returncode != 0 and ("less than or equal" in said or "finite" in said), said
    raised = await cli(
        temporal_server, "workflow", "update", "execute", "--workflow-id", handle.id, "--name", "raise_limits",
        "--input", '{"max_duration_s": 7200}',
    )  # fmt: skip
    assert raised.returncode == 0, raised.stderr
    await handle.signal("resume")
    result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.state == "completed" and result.output == "finished"
    assert await workflow_tasks_failed(handle) == 0


async def test_identical_calls_of_one_reply_are_not_a_livelock(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    same = [("read_file", {"path": "missing.txt"})] * 30
    model_server.responder = Script([tools(*same), tools(*same)], final="read what exists")
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    result = await asyncio.wait_for(handle.result(), timeout=60)
    # Two steps of 30 side by side: two repeats, not 60 (three would need a person).
    assert result.state == "completed" and result.output == "read what exists"
    status = await handle.query("status", result_type=AgentStatus)
    assert status.attention_reports == []


async def test_the_result_summary_lists_as_run_only_the_commands_that_ran(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    calls = [("run_command", {"command": f"echo ran-{n}"}) for n in range(66)]
    calls[0] = ("run_command", {"command": "echo never-denied"})
    model_server.responder = Script([tools(*calls)], final="done")
    handle = await start(
        client,
        task_queue,
        goal="x",
        workspace=str(workspace),
        approval={"commands": ["never-denied"], "timeout_s": 1, "on_timeout": "deny"},
    )
    result = await asyncio.wait_for(handle.result(), timeout=120)
    assert result.state == "completed" and result.summary is not None
    said_ran = "\n".join(result.summary.outputs)
    # 64 calls is a reply's cap: calls 64 and 65 never ran, nor did the denied one. (The
    # summary keeps only its newest items.)
    assert "step 1: ran `echo ran-63` (exit 0)" in said_ran, said_ran
    assert "ran-64" not in said_ran and "ran-65" not in said_ran and "never-denied" not in said_ran
    results = tool_results(model_server.requests[-1])
    assert results[0].startswith("ERROR: not run: denied by a person") and results[65].startswith("ERROR: not run:")
