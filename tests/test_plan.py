"""The `plan` tool: the run's task list survives a worker kill and continue-as-new, is shown in
`status`, the Web UI details and the export, and the skip rung drops its open optional items."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import render
from durable_agent.model_server import ModelServer, is_summary_request
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import start, wait_for
from tests.scripts import Script, tool_results, tools
from tests.test_cli import cli_env, durable_agent
from tests.test_crash import SlowTurn, worker_env
from workflows.plan import PlanItem, drop_optional, unfinished_lines
from workflows.types import AgentStatus

ITEMS = [
    {"text": "fix the parser", "required": True, "status": "in_progress"},
    {"text": "add a test", "required": True},
    {"text": "polish the README", "required": False},
    {"text": "rename a variable", "required": False, "status": "done"},
]


def texts(request: dict[str, Any]) -> list[str]:
    return [m.get("content") or "" for m in request["messages"]]


async def test_the_plan_survives_a_kill_and_continue_as_new_and_the_skip_rung_drops_optional_items(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    slow = SlowTurn(tools(("list_files", {})), delay_s=120)
    # Step 1 writes the plan; the kill lands during step 2's model call; step 10 continues as
    # new; the skip rung (the wrap-up warning) comes before step 14, which answers.
    model_server.responder = Script(
        [tools(("plan", {"items": ITEMS})), slow, *[tools(("list_files", {}))] * 11], final="required work done"
    )
    env = worker_env(temporal_server, model_server, task_queue)
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(
            client,
            task_queue,
            goal="fix the parser",
            workspace=str(workspace),
            continue_as_new_every=10,
            limits={"soft_steps": 12, "hard_steps": 15},
        )
        await asyncio.get_running_loop().run_in_executor(None, slow.asked.wait, 60)
        before = await wait_for(handle, lambda s: len(s.plan) == 4)
        kill_hard(worker)
        slow.release()
        worker = spawn_worker(env, tmp_path / "w1.log")
        after = await wait_for(handle, lambda s: s.step >= 3)  # a new worker, from history
        assert after.plan == before.plan
        continued = await wait_for(client.get_workflow_handle(handle.id), lambda s: s.step >= 11)
        assert [i.text for i in continued.plan] == [i["text"] for i in ITEMS]  # carried across continue-as-new
        metadata = await client.get_workflow_handle(handle.id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
        assert "**Plan:**" in metadata.current_details
        assert "\\[in\\_progress\\] fix the parser (required)" in metadata.current_details
        result = await asyncio.wait_for(handle.result(), timeout=120)
        final = await client.get_workflow_handle(handle.id).query("status", result_type=AgentStatus)
    finally:
        stop_gently(worker)

    assert result.state == "completed" and result.steps == 14
    runs = [run async for run in client.list_workflows(f'WorkflowId="{handle.id}"')]
    assert len(runs) == 2
    by_text = {item.text: item for item in result.plan}
    assert by_text["polish the README"].status == "skipped" and by_text["polish the README"].skipped_at_step == 13
    assert by_text["rename a variable"].status == "done"  # done already: not dropped
    assert by_text["add a test"].status == "pending"  # required items are never dropped
    assert result.unfinished == ["plan item skipped (optional): polish the README"]
    skips = [d for d in final.degradations if d.kind == "skip_optional"]
    assert [(d.step, d.detail) for d in skips] == [(13, "dropped: polish the README")]
    turns = [r for r in model_server.requests if not is_summary_request(r)]
    assert tool_results(turns[1])[0].startswith("Plan (4 items, 1 done):\n1. [in_progress] fix the parser (required)")
    told = [t for t in texts(turns[-1]) if "drop the optional work" in t]
    assert len(told) == 1 and "- polish the README" in told[0] and "rename a variable" not in told[0]
    assert not any("drop the optional work" in t for t in texts(turns[-2]))  # told once, at the rung

    report = await durable_agent("export", handle.id, "--format", "markdown", env=cli_env())
    assert report.returncode == 0, report
    assert "## Plan\n\nPlan (4 items, 1 done):\n" in report.stdout
    assert "3. [skipped] polish the README (optional)" in report.stdout


async def test_a_bad_plan_is_a_tool_error_and_status_shows_the_plan(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script(
        [
            tools(("plan", {"items": [{"text": "x", "status": "finished"}]})),
            tools(("plan", {"items": [{"text": "write it", "required": False}]})),
            tools(("plan", {})),
        ],
        final="done",
    )
    handle = await start(client, task_queue, goal="plan", workspace=str(workspace))
    result = await handle.result()
    results = tool_results(model_server.requests[-1])
    assert results[0].startswith("ERROR: not run: bad arguments for plan: items.0.status")
    assert results[2] == "Plan (1 items, 0 done):\n1. [pending] write it (optional)"  # read back
    assert result.unfinished == []  # completed: an open optional item is not listed
    status = await handle.query("status", result_type=AgentStatus)
    assert "1. [pending] write it (optional)" in render.status_lines(handle.id, status)


def test_a_run_that_did_not_complete_lists_its_open_required_items() -> None:
    plan = [PlanItem(text="a", status="done"), PlanItem(text="b"), PlanItem(text="c", required=False)]
    kept, dropped = drop_optional(plan, step=7)
    assert [i.text for i in dropped] == ["c"] and kept[2].skipped_at_step == 7
    assert unfinished_lines(kept, completed=False) == [
        "plan item skipped (optional): c",
        "plan item not done (required): b",
    ]
    assert unfinished_lines(kept, completed=True) == ["plan item skipped (optional): c"]
