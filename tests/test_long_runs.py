"""Long runs continue as new, carrying their state losslessly, with the transcript packed."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Worker

import workflows.types as types
from activities.archive import read_archive
from bench.long_run import LongRunScript, agent_requests, expected_usage, reported_input, run_long
from durable_agent.export import with_archive
from durable_agent.history import replay_histories
from durable_agent.model_server import ModelServer
from durable_agent.runs import chain_histories
from tests.helpers import start
from tests.scripts import Script, answer, tool_results, tools
from tests.test_replay import replay_failure
from workflows.state import Carry, ModelView
from workflows.types import PACKED_MESSAGES, AgentStatus, Message, ToolCall, pack_messages


def transcript_of(steps: int) -> list[Message]:
    messages = [Message(role="user", content="the goal", kind="goal")]
    for n in range(1, steps + 1):
        call = ToolCall(id=f"call-{n}", name="run_command", arguments=json.dumps({"command": f"echo {n}"}))
        messages += [
            Message(role="assistant", tool_calls=[call], step=n),
            Message(role="tool", content=f"exit code: 0\n{n}\n", tool_call_id=call.id, step=n),
        ]
    return messages


def test_carried_messages_are_packed_and_unpack_to_the_same_messages() -> None:
    transcript = transcript_of(50)
    carry = Carry(step=50, view=ModelView(session=transcript[:1], messages=transcript[1:]))
    encoded = carry.model_dump_json()
    assert json.loads(encoded)["view"]["messages"].startswith(PACKED_MESSAGES)
    plain = len(json.dumps(carry.model_dump()["view"]["messages"]))
    assert len(encoded) * 3 < plain  # packed, the whole carry is a fraction of its messages alone
    assert Carry.model_validate_json(encoded) == carry
    # An earlier version's carry (every message as `messages`, packed or plain) becomes the view.
    for old in (pack_messages(transcript), [m.model_dump() for m in transcript]):
        assert Carry.model_validate({"step": 50, "messages": old}) == carry


def test_a_damaged_or_oversized_carried_transcript_is_a_clear_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="the carried transcript is damaged"):
        Carry.model_validate({"view": {"messages": PACKED_MESSAGES + "bm90IHpsaWI="}})
    monkeypatch.setattr(types, "MAX_UNPACKED_BYTES", 1_000)
    with pytest.raises(ValidationError, match="unpacks to more than 1,000 bytes"):
        Carry.model_validate({"view": {"messages": pack_messages(transcript_of(20))}})


async def test_a_long_run_continues_as_new_and_loses_nothing(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    steps = 24
    model_server.responder = Script(
        [
            tools(
                ("write_file", {"path": f"out/{n}.txt", "content": f"{n}\n"}),
                ("run_command", {"command": f"echo {n}"}),
                input_tokens=500,  # even steps: no token spike to warn about early
                output_tokens=20,
            )
            for n in range(1, steps + 1)
        ]
        + [answer("all written")]
    )
    handle = await start(
        client,
        task_queue,
        goal="write many files",
        workspace=str(workspace),
        continue_as_new_every=10,
        # The ladder: compaction at step 11, the wrap-up warning a third of the way to 26.
        limits={"soft_steps": 11, "hard_steps": 26},
    )
    result = await handle.result()

    assert result.state == "completed" and result.output == "all written"
    assert result.steps == steps + 1
    # One model call a step, and one more: the summary of the soft tier's compaction.
    assert result.usage.model_calls == steps + 2 and result.usage.tool_calls == 2 * steps
    assert sorted(p.name for p in (workspace / "out").iterdir()) == sorted(f"{n}.txt" for n in range(1, steps + 1))

    runs = await chain_histories(client, handle.id)
    assert len(runs) == 3  # after steps 10 and 20
    for history in runs[:-1]:
        [last] = history.events[-1:]
        assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        carried = json.loads(last.workflow_execution_continued_as_new_event_attributes.input.payloads[0].data)
        assert carried["carry"]["view"]["messages"].startswith(PACKED_MESSAGES)
    for history in runs:  # each run of the chain replays, the later ones from a packed carry
        assert await replay_failure(history) is None

    # The last model call saw the goal, the summary of the folded steps 1-5 and the rest verbatim.
    last_request = model_server.requests[-1]
    assert any("write many files" in (m.get("content") or "") for m in last_request["messages"])
    assert any("Folded steps 1-5;" in (m.get("content") or "") for m in last_request["messages"])
    assert len(tool_results(last_request)) == 2 * (steps - 5)
    # One soft-step warning, given in the second run and not repeated after the next continue-as-new.
    transcript = await handle.query("transcript", result_type=list[Message])
    assert [m.step for m in transcript if m.kind == "warning"] == [16]
    # Nothing lost: the archive holds the folded steps, and at the end the rest too.
    status = await handle.query("status", result_type=AgentStatus)
    assert status.context is not None
    archived = read_archive(workspace / status.context.archive_dir)
    assert {m.step for m in archived} == set(range(1, steps + 2))
    assert sum(1 for m in archived if m.role == "tool") == 2 * steps
    assert status.step == steps + 1 and status.usage.tool_calls == 2 * steps

    # export after retention deleted the earlier runs' histories: the last run's history,
    # replayed, holds what it carried (steps 6-20) and says where steps 1-5 went; the
    # archive puts them back.
    only_last = await replay_histories(client, handle.id, runs[-1:])
    kept = only_last.transcript()
    assert {m.step for m in kept if m.kind != "archived"} == {0, *range(6, steps + 2)}
    [note] = [m for m in kept if m.kind == "archived"]
    assert "Steps 1-5 were folded in earlier runs" in (note.content or "")
    exported = with_archive(kept, status.context.archive_path)
    assert {m.step for m in exported} == set(range(steps + 2)) and not any(m.kind == "archived" for m in exported)
    assert [m.step for m in exported] == sorted(m.step for m in exported)
    assert sum(1 for m in exported if m.role == "tool") == 2 * steps


@pytest.mark.benchmark
async def test_a_long_run_stays_bounded_across_a_kill_and_continue_as_new_and_recalls_an_early_fact() -> None:
    """The 1,000-step benchmark (`python -m bench long-run`), CI-sized: 120 steps."""
    steps, max_tokens = 120, 2_000
    run = await run_long(steps, every=25, max_context_tokens=max_tokens)
    assert run.result["state"] == "completed" and run.result["steps"] == steps + 1
    assert run.kills == 1 and len(run.carries) >= 3

    # Every request under max_context_tokens plus one step's worth (the newest step's messages).
    by_step = agent_requests(run.requests)
    assert sorted(by_step) == list(range(1, steps + 2))
    one_step = max(newest_step_tokens(r) for r in by_step.values())
    assert all(reported_input(r) <= max_tokens + one_step for r in by_step.values())
    # The goal in every request; never a tool call without its result.
    for request in by_step.values():
        assert request["messages"][1]["content"] == "long run: print the steps"
        calls = {c["id"] for m in request["messages"] for c in m.get("tool_calls") or []}
        assert calls == {m["tool_call_id"] for m in request["messages"] if m["role"] == "tool"}

    # Exact usage: what the stub reported, each distinct request once (the kill repeated one).
    usage = {k: run.result["usage"][k] for k in ("input_tokens", "output_tokens", "model_calls")}
    assert usage == expected_usage(run.requests, steps)

    # The fact printed at step 5 came back through recall, long after it was folded.
    assert run.found_at == LongRunScript(steps).recall_at + 1

    # Continue-as-new carries every field and stays bounded; history per step stays flat.
    for carried in run.carried:
        assert set(carried) == set(Carry.model_fields)
        carry = Carry.model_validate(carried)
        assert carry.view.index.folded_through <= carry.archived_through < carry.step
        assert carry.archive_dir == Carry.model_validate(run.carried[0]).archive_dir
        assert carry.first_run_id == Carry.model_validate(run.carried[0]).first_run_id
    assert [step for step, _ in run.carries] == [25, 50, 75, 100]
    sizes = [size for _, size in run.carries]
    assert max(sizes) < 12_000 and max(sizes) <= 1.3 * min(sizes)
    whole_runs = [size / (last - first + 1) for first, last, size in run.runs[:-1]]
    assert max(whole_runs) <= 1.3 * min(whole_runs)


def newest_step_tokens(request: dict[str, Any]) -> int:
    messages = request["messages"]
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return len(json.dumps(messages[last:])) // 4


async def test_every_run_of_a_chain_shows_its_current_details_and_only_the_first_its_summary(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # Temporal carries no summary across continue-as-new, and the SDK cannot set one there:
    # what README.md says of the Web UI after continue-as-new.
    release = threading.Event()

    def held(request: dict[str, Any]) -> Any:
        release.wait(30)
        return answer("done")

    model_server.responder = Script([*[tools(("list_files", {}))] * 10, held])
    first = await start(client, task_queue, goal="summarise me", workspace=str(workspace), continue_as_new_every=10)
    latest = client.get_workflow_handle(first.id)
    try:
        while (await latest.query("status", result_type=AgentStatus)).step < 11:
            await asyncio.sleep(0.1)
        description = await latest.describe()
        assert description.run_id != first.result_run_id  # the chain's second run
        metadata = await latest.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "calling" in metadata.current_details
        assert await description.static_summary() is None
        first_run = client.get_workflow_handle(first.id, run_id=first.result_run_id)
        assert await (await first_run.describe()).static_summary() == "summarise me"
    finally:
        release.set()
    assert (await first.result()).output == "done"  # the handle follows the chain to its end
