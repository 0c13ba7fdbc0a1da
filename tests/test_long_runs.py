"""Long runs continue as new, carrying their state losslessly, with the transcript packed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

import workflows.types as types
from durable_agent.model_server import ModelServer
from durable_agent.runs import chain_histories
from tests.helpers import start
from tests.scripts import Script, answer, tool_results, tools
from tests.test_replay import replay_failure
from workflows.types import PACKED_MESSAGES, AgentStatus, Carry, Message, ToolCall, pack_messages


def transcript_of(steps: int) -> list[Message]:
    messages = [Message(role="user", content="the goal", kind="goal")]
    for n in range(1, steps + 1):
        call = ToolCall(id=f"call-{n}", name="run_command", arguments=json.dumps({"command": f"echo {n}"}))
        messages += [
            Message(role="assistant", tool_calls=[call], step=n),
            Message(role="tool", content=f"exit code: 0\n{n}\n", tool_call_id=call.id, step=n),
        ]
    return messages


def test_a_carried_transcript_is_packed_and_unpacks_to_the_same_messages() -> None:
    carry = Carry(step=50, messages=transcript_of(50))
    encoded = carry.model_dump_json()
    assert json.loads(encoded)["messages"].startswith(PACKED_MESSAGES)
    plain = len(json.dumps(carry.model_dump()["messages"]))
    assert len(encoded) * 3 < plain  # packed, the whole carry is a fraction of its messages alone
    assert Carry.model_validate_json(encoded) == carry
    # A carry written as a plain list (by hand, or by an earlier version) is accepted as is.
    assert Carry.model_validate({"step": 50, "messages": carry.model_dump()["messages"]}) == carry


def test_a_damaged_or_oversized_carried_transcript_is_a_clear_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="the carried transcript is damaged"):
        Carry.model_validate({"messages": PACKED_MESSAGES + "bm90IHpsaWI="})
    monkeypatch.setattr(types, "MAX_UNPACKED_BYTES", 1_000)
    with pytest.raises(ValidationError, match="unpacks to more than 1,000 bytes"):
        Carry.model_validate({"messages": pack_messages(transcript_of(20))})


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
        limits={"soft_steps": 15, "hard_steps": 40},
    )
    result = await handle.result()

    assert result.state == "completed" and result.output == "all written"
    assert result.steps == steps + 1
    assert result.usage.model_calls == steps + 1 and result.usage.tool_calls == 2 * steps
    assert sorted(p.name for p in (workspace / "out").iterdir()) == sorted(f"{n}.txt" for n in range(1, steps + 1))

    runs = await chain_histories(client, handle.id)
    assert len(runs) == 3  # after steps 10 and 20
    for history in runs[:-1]:
        [last] = history.events[-1:]
        assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        carried = json.loads(last.workflow_execution_continued_as_new_event_attributes.input.payloads[0].data)
        assert carried["carry"]["messages"].startswith(PACKED_MESSAGES)
    for history in runs:  # each run of the chain replays, the later ones from a packed carry
        assert await replay_failure(history) is None

    # The last model call saw the whole context: the goal and the first step's results.
    last_request = model_server.requests[-1]
    assert any("write many files" in (m.get("content") or "") for m in last_request["messages"])
    assert len(tool_results(last_request)) == 2 * steps
    # One soft-step warning, given in the second run and not repeated after the next continue-as-new.
    transcript = await handle.query("transcript", result_type=list[Message])
    assert [m.step for m in transcript if m.kind == "warning"] == [15]
    assert {m.step for m in transcript} == set(range(steps + 2))
    status = await handle.query("status", result_type=AgentStatus)
    assert status.step == steps + 1 and status.usage.tool_calls == 2 * steps
