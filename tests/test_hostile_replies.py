"""Hostile or broken model replies get a clear error; the run goes on or stops cleanly and
never calls the model again and again (issue 13, items 5 and 6). The stub counts calls."""

from __future__ import annotations

import asyncio
import random
import string
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer, Reply
from tests.helpers import start, wait_for
from tests.scripts import Script, answer, tool_results, tools
from workflows.limits import MAX_TOOL_CALLS_PER_STEP
from workflows.types import AgentResult


async def test_duplicate_tool_call_ids_get_unique_ids_before_anything_is_recorded(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    twice = Reply(
        tool_calls=[
            ("run_command", {"command": "sleep 0.5; echo one > one.txt"}),
            ("run_command", {"command": "echo two > two.txt"}),
            ("write_file", {"path": "three.txt", "content": "3"}),
            ("write_file", {"path": "four.txt", "content": "4"}),
        ],
        call_ids=["dup", "dup", "dup", ""],
    )
    model_server.responder = Script([twice, answer("all four")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    result = await handle.result()
    assert result.output == "all four"
    for name, text in {"one.txt": "one\n", "two.txt": "two\n", "three.txt": "3", "four.txt": "4"}.items():
        assert (workspace / name).read_text() == text
    sent = model_server.requests[-1]["messages"]
    assistant = next(m for m in sent if m.get("tool_calls"))
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 4 and all(ids)
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids
    assert not any("interrupted" in r for r in tool_results(model_server.requests[-1]))


ARGUMENT_CASES = {
    "unpaired surrogate": ("write_file", '{"path": "s.txt", "content": "bad \\ud800 text"}', "surrogate"),
    "timeout infinity": ("run_command", '{"command": "echo hi", "timeout_s": Infinity}', "timeout_s"),
    "timeout nan": ("run_command", '{"command": "echo hi", "timeout_s": NaN}', "timeout_s"),
    "timeout overflow": ("run_command", '{"command": "echo hi", "timeout_s": 1e999}', "timeout_s"),
    "nested 5,000 deep": ("write_file", '{"path": "n.txt", "content": ' + "[" * 5_000 + "]" * 5_000 + "}", "deep"),
}


@pytest.mark.parametrize("case", list(ARGUMENT_CASES))
async def test_hostile_tool_arguments_reach_the_model_as_a_tool_error(
    case: str, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    tool, raw, said = ARGUMENT_CASES[case]
    model_server.responder = Script([tools((tool, raw)), answer("went on")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.output == "went on"
    assert len(model_server.requests) == 2
    [error] = tool_results(model_server.requests[-1])
    assert error.startswith("ERROR:") and said in error, error
    assert not (workspace / "s.txt").exists() and not (workspace / "n.txt").exists()


async def test_an_unpaired_surrogate_in_the_reply_text_is_replaced(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="half \ud800 a pair")
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.output == "half \ufffd a pair" and len(model_server.requests) == 1


REPLY_CASES: dict[str, tuple[Reply, str]] = {
    "2^63 tokens": (Reply(content="x", input_tokens=2**63), "token"),
    "negative tokens": (Reply(content="x", output_tokens=-5), "token"),
    "3 MB reply": (Reply(content="y" * 3_000_000), "bytes"),
}


@pytest.mark.parametrize("case", list(REPLY_CASES))
async def test_a_broken_reply_needs_attention_after_one_call(
    case: str, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    reply, said = REPLY_CASES[case]
    model_server.responder = lambda request: reply
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: s.state == "needs_attention")
    assert status.attention is not None and said in status.attention.last_error, status.attention
    await asyncio.sleep(2)  # no call in the background
    assert len(model_server.requests) == 1 and model_server.requests[0]["stream"]  # streamed, the default
    await handle.execute_update("resolve", {"action": "terminate"})
    result = await handle.result()
    assert (result.state, result.stop_reason) == ("terminated", "terminated")
    assert len(model_server.requests) == 1


async def test_two_thousand_tool_calls_in_one_reply(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    many = Reply(tool_calls=[("list_files", {})] * 2_000)
    model_server.responder = Script([many, answer("listed")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), limits={"max_tool_calls": 10_000})
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == "listed" and len(model_server.requests) == 2
    results = tool_results(model_server.requests[-1])
    assert len(results) == 2_000
    refused = [r for r in results if r.startswith("ERROR:") and "at most" in r]
    assert len(refused) == 2_000 - MAX_TOOL_CALLS_PER_STEP
    # With the default limits the tool-call budget stops it cleanly, before any tool runs.
    model_server.requests.clear()
    default = await start(client, task_queue, goal="x", workspace=str(workspace))
    # The same 2,000-call reply as above, so the same wait.
    stopped = await asyncio.wait_for(default.result(), 60)
    assert (stopped.state, stopped.stop_reason) == ("stopped", "tool_call_budget")
    assert len(model_server.requests) == 1


async def test_a_huge_goal_is_refused_at_start(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    goal = "".join(random.choices(string.ascii_letters + string.digits, k=1_000_000))
    with pytest.raises(ValidationError, match="goal"):
        await start(client, task_queue, goal=goal, workspace=str(workspace))
    # From the Temporal CLI (no client-side check) the run closes with the same clear error.
    model_server.responder = Script([tools(("list_files", {}))] * 12, final="never")
    handle = await client.start_workflow(
        "AgentWorkflow",
        {"goal": goal, "workspace": str(workspace), "continue_as_new_every": 10},
        id=f"huge-goal-{task_queue}",
        task_queue=task_queue,
        result_type=AgentResult,
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 60)
    assert "goal" in str(failure.value.cause) and "workspace file" in str(failure.value.cause)
    assert len(model_server.requests) == 0
