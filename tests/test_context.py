"""The model's context: its wire format, compaction into a summary and an index, recall, the archive."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.archive import read_archive
from durable_agent.model_server import ModelServer, Reply, is_summary_request, stub_summary
from tests.helpers import start
from tests.scripts import Script, tool_results, tools
from workflows import compaction
from workflows.context import WireContext, openai_message
from workflows.context_handoff import context_ref
from workflows.state import StructuredSummary
from workflows.types import AgentStatus, Message, ToolCall


def test_each_message_is_rendered_once_and_the_result_follows_the_transcript() -> None:
    call = ToolCall(id="c1", name="list_files", arguments="{}")
    messages = [
        Message(role="system", content="s"),
        Message(role="assistant", content=None, tool_calls=[call], step=1),
        Message(role="tool", content="a.txt", tool_call_id="c1", step=1),
    ]
    wire = WireContext()
    first = wire.render(messages)
    assert first == [openai_message(m) for m in messages]
    assert first[1]["tool_calls"][0]["function"] == {"name": "list_files", "arguments": "{}"}
    assert first[2] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}

    messages.append(Message(role="assistant", content="done", step=2))
    second = wire.render(messages)
    assert all(a is b for a, b in zip(first, second[:3], strict=False))  # not rendered again
    assert second[3] == {"role": "assistant", "content": "done"}

    messages[1] = Message(role="user", content="replaced")  # a transcript rewritten in place
    third = wire.render(messages)
    assert third[1] == {"role": "user", "content": "replaced"} and len(third) == 4


def test_a_calls_digest_from_cached_encodings_is_that_of_the_whole_contexts_json() -> None:
    """The digest a worker checks a cached or queried context against: byte for byte the one of
    the list's compact JSON, whether each message's encoding came from the cache or not."""
    messages = [Message(role="system", content="s"), Message(role="user", content="é ünïcode \u2028", step=1)]
    wire = WireContext()
    rendered = wire.render(messages)
    whole = json.dumps(rendered, separators=(",", ":"), ensure_ascii=False).encode()
    expected = hashlib.blake2b(whole, digest_size=16).hexdigest()
    assert context_ref("run", rendered).digest == expected
    assert context_ref("run", rendered, wire.encode).digest == expected
    assert context_ref("run", rendered, wire.encode).digest == expected  # now from the cache
    assert context_ref("run", []).digest == hashlib.blake2b(b"[]", digest_size=16).hexdigest()

    messages.append(Message(role="assistant", content="more", step=1))
    longer = wire.render(messages)
    assert context_ref("run", longer, wire.encode) == context_ref("run", longer)
    assert context_ref("run", longer).digest != expected


def test_an_assistant_message_without_text_or_calls_sends_empty_text() -> None:
    assert openai_message(Message(role="assistant", content=None)) == {"role": "assistant", "content": ""}


# --- compaction, recall and the archive, end to end ------------------------------------

FACT = "FACT: the vault code is 7319-ALPHA"
PADDING = "a" * 400


def command_turns(steps: int, fact_at: int) -> list[Reply]:
    """One command a step, ~170 tokens of output each; step `fact_at` prints the fact."""
    return [
        tools(
            ("run_command", {"command": f"echo '{FACT if n == fact_at else f'step {n}'} {PADDING}'"}), output_tokens=20
        )
        for n in range(1, steps + 1)
    ]


def summary_in(request: dict[str, Any]) -> StructuredSummary | None:
    for m in request["messages"]:
        text = m.get("content") or ""
        if m["role"] == "user" and text.startswith("Earlier steps were folded"):
            body = text.split("Summary of them:\n", 1)[1].split("\n\nIndex of folded steps:", 1)[0]
            assert set(json.loads(body)) == {"goal", "inputs", "outputs", "key_decisions", "open_issues"}
            return StructuredSummary.model_validate_json(body)
    return None


async def test_compaction_keeps_every_request_bounded_and_recall_returns_the_folded_text(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    steps, max_tokens = 14, 1_200
    model_server.responder = Script(
        [
            *command_turns(steps, fact_at=2),
            tools(("recall", {"steps": "2"}), output_tokens=20),
            tools(("recall", {"query": "VAULT code"}), output_tokens=20),
        ],
        final="done",
    )
    handle = await start(
        client,
        task_queue,
        goal="THE GOAL: print things",
        workspace=str(workspace),
        context={"max_context_tokens": max_tokens, "keep_recent_steps": 2},
    )
    result = await handle.result()
    assert result.state == "completed" and result.steps == steps + 3

    agent_requests = [r for r in model_server.requests if not is_summary_request(r)]
    assert len(agent_requests) == steps + 3
    one_step = 300  # a step's messages: its call and its output (~120 tokens each), or one step recalled
    for request in agent_requests:
        messages = request["messages"]
        assert len(json.dumps(messages)) // 4 <= max_tokens + one_step  # what the stub reports
        assert messages[1] == {"role": "user", "content": "THE GOAL: print things"}  # the goal, every time
        calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
        assert calls == {m["tool_call_id"] for m in messages if m["role"] == "tool"}  # never split
    summaries = [summary_in(r) for r in agent_requests]
    assert summaries[0] is None and summaries[-1] is not None

    status = await handle.query("status", result_type=AgentStatus)
    context = status.context
    assert context is not None and context.counters.compactions >= 2
    size_triggered = [c for c in context.compactions if c.trigger == "size"]
    assert size_triggered and all(c.summary_source == "model" for c in context.compactions)
    for record in size_triggered:  # compacted when the request would not fit, to well under it
        assert record.tokens_before > max_tokens >= record.tokens_after
    assert compaction.indexed_steps(context.index) == list(range(1, context.index.folded_through + 1))
    assert context.counters.folded_steps == context.index.folded_through >= 2
    # Usage counts the summarising calls too, as reported.
    assert result.usage.model_calls == steps + 3 + context.counters.compactions

    # recall: the folded step 2 comes back verbatim, by range and by search.
    [original] = [m for m in agent_requests[2]["messages"] if FACT in (m.get("content") or "")]
    recalled = [tool_results(r)[-1] for r in agent_requests[steps + 1 : steps + 3]]
    for text in recalled:
        assert "--- step 2 ---" in text and original["content"] in text
    # The archive has every folded step, whole; the transcript and export show them.
    archived = read_archive(workspace / context.archive_dir)
    assert {m.step for m in archived} == set(range(1, steps + 4))  # the rest joined at the end
    transcript = await handle.query("transcript", result_type=list[Message])
    assert {m.step for m in transcript} == set(range(0, steps + 4))
    notes = [m for m in transcript if m.kind == "compaction"]
    assert len(notes) == context.counters.compactions and "Index of folded steps" in (notes[0].content or "")


async def test_a_malformed_summary_is_asked_for_again_then_extracted(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    asked: list[dict[str, Any]] = []

    def summarizer(request: dict[str, Any]) -> Reply:
        asked.append(request)
        if len(asked) == 2:  # the first compaction's second try is valid
            return stub_summary(request)
        return Reply(content="Sure! Here is what happened: lots of echo.")

    model_server.summarizer = summarizer
    model_server.responder = Script(command_turns(12, fact_at=3), final="done")
    handle = await start(
        client,
        task_queue,
        goal="g",
        workspace=str(workspace),
        context={"max_context_tokens": 1_200, "keep_recent_steps": 2},
    )
    result = await handle.result()
    assert result.state == "completed"
    status = await handle.query("status", result_type=AgentStatus)
    assert status.context is not None
    sources = [c.summary_source for c in status.context.compactions]
    assert sources[:2] == ["model_retry", "extractive"] and set(sources[2:]) <= {"extractive"}
    assert status.context.counters.extractive_summaries == len(sources) - 1
    assert len(asked) == 2 * len(sources)  # one retry each, never more
    assert "That was not valid: not JSON" in asked[1]["messages"][-1]["content"]
    # The extractive summary still has the five fields and names what the folded steps did.
    final = status.context.summary
    assert final is not None and final.goal == "g" and any("ran `echo" in o for o in final.outputs)
    transcript = await handle.query("transcript", result_type=list[Message])
    assert any("summary by extraction" in (m.content or "") for m in transcript if m.kind == "compaction")
