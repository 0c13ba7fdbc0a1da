"""Compaction, the index, summaries and the degradation ladder as pure decisions (no server)."""

from __future__ import annotations

import json
import random

import pytest

from workflows import compaction
from workflows.context import calibrated, estimate_tokens
from workflows.ladder import RUNGS, pressure, rungs_due
from workflows.limits import Spend
from workflows.state import ModelView, StructuredSummary
from workflows.types import Limits, Message, ToolCall, Usage


def step_messages(step: int, calls: int, output: str = "ok") -> list[Message]:
    tool_calls = [
        ToolCall(id=f"c{step}-{i}", name="run_command", arguments=json.dumps({"command": f"echo {step}.{i}"}))
        for i in range(calls)
    ]
    messages = [Message(role="assistant", content=None, tool_calls=tool_calls, step=step)]
    messages += [
        Message(
            role="tool",
            content=f"exit code: {i % 2}\n{output}",
            tool_call_id=c.id,
            step=step,
            kind="tool_result",
            tool_name=c.name,
        )
        for i, c in enumerate(tool_calls)
    ]
    return messages


def transcript(steps: int, seed: int = 0) -> list[Message]:
    rng = random.Random(seed)
    messages: list[Message] = []
    for step in range(1, steps + 1):
        messages += step_messages(step, rng.randint(1, 3))
        if rng.random() < 0.2:
            messages.append(Message(role="user", content=f"note {step}", step=step, kind="user"))
    return messages


SESSION = [
    Message(role="system", content="system prompt", kind="system_prompt"),
    Message(role="user", content="THE GOAL", kind="goal"),
]


@pytest.mark.parametrize("seed", range(5))
def test_a_tool_call_is_never_split_from_its_result(seed: int) -> None:
    messages = transcript(30, seed)
    for current in range(1, 31):
        for keep in (1, 3, 6):
            fold = compaction.plan_fold(messages, current, keep)
            for part in (fold.folded, fold.kept):
                calls = {c.id for m in part for c in m.tool_calls}
                results = {m.tool_call_id for m in part if m.role == "tool"}
                assert calls == results
            assert fold.folded + fold.kept == messages  # nothing dropped, order kept
            assert all(m.step > current - keep for m in fold.kept)


def test_a_loaded_skill_is_session_layer_and_never_folded() -> None:
    skill = Message(role="user", content="SKILL.md: how to release", step=2, kind="skill")
    messages = [*step_messages(1, 1), *step_messages(2, 1), skill, *step_messages(3, 1)]
    fold = compaction.plan_fold(messages, current_step=3, keep_recent_steps=1)
    assert skill in fold.kept and skill not in fold.folded and fold.steps == [1, 2]


def test_the_index_lists_every_folded_step_as_lines_and_then_a_digest() -> None:
    index = compaction.FoldIndex()
    messages = transcript(100)
    for first in range(1, 101, 10):  # ten compactions of ten steps
        folded = [m for m in messages if first <= m.step < first + 10]
        index = compaction.add_to_index(index, compaction.index_steps(folded), line_limit=25)
    assert compaction.indexed_steps(index) == list(range(1, 101))
    assert index.digest is not None and (index.digest.first_step, index.digest.last_step) == (1, 75)
    assert [s.step for s in index.steps] == list(range(76, 101))
    calls_in_digest = sum(len(m.tool_calls) for m in messages if m.step <= 75)
    assert index.digest.commands == calls_in_digest == index.digest.tool_counts["run_command"]
    text = compaction.render_index(index)
    assert text.startswith("Folded steps 1-100;") and "steps 1-75:" in text
    assert all(f"step {n}: " in text for n in range(76, 101))
    assert "`echo 100.0` -> exit 0" in text and compaction.folded_through(text) == 100


def test_index_lines_name_files_commands_exit_codes_and_errors() -> None:
    call = ToolCall(id="w", name="write_file", arguments=json.dumps({"path": "src/a.py", "content": "x"}))
    bad = ToolCall(id="r", name="read_file", arguments=json.dumps({"path": "missing.txt"}))
    messages = [
        Message(role="assistant", tool_calls=[call, bad], step=3),
        Message(role="tool", content="wrote src/a.py", tool_call_id="w", step=3, tool_name="write_file"),
        Message(
            role="tool", content="ERROR: missing.txt: no such file", tool_call_id="r", step=3, tool_name="read_file"
        ),
        *step_messages(4, 2),
    ]
    [three, four] = compaction.index_steps(messages)
    assert three.files == ["src/a.py", "missing.txt"] and three.errors == ["ERROR: missing.txt: no such file"]
    assert [(c.command, c.exit_code) for c in four.commands] == [("echo 4.0", 0), ("echo 4.1", 1)]


def valid_summary(**changes: object) -> dict[str, object]:
    return {"goal": "g", "inputs": ["i"], "outputs": ["o"], "key_decisions": ["k"], "open_issues": [], **changes}


def test_a_summary_must_be_json_with_exactly_the_five_fields() -> None:
    assert compaction.parse_summary(json.dumps(valid_summary())).outputs == ["o"]
    assert compaction.parse_summary("```json\n" + json.dumps(valid_summary()) + "\n```").goal == "g"
    malformed = {
        "not json": "Here is a summary: it went well",
        "a missing field": json.dumps({k: v for k, v in valid_summary().items() if k != "open_issues"}),
        "an extra field": json.dumps(valid_summary(mood="good")),
        "a wrong type": json.dumps(valid_summary(outputs="one string")),
        "not an object": json.dumps([valid_summary()]),
        "nothing": None,
    }
    for case, text in malformed.items():
        with pytest.raises(ValueError):
            compaction.parse_summary(text)
            pytest.fail(case)


def test_the_extractive_summary_has_the_five_fields_merges_and_stays_bounded() -> None:
    previous = StructuredSummary(goal="THE GOAL", inputs=["old input"], outputs=[], key_decisions=[], open_issues=[])
    folded = transcript(40)
    folded.append(Message(role="assistant", content="I will use plan B", step=40))
    summary = compaction.extractive_summary(previous, folded, "THE GOAL")
    assert set(summary.model_dump()) == {"goal", "inputs", "outputs", "key_decisions", "open_issues"}
    assert summary.goal == "THE GOAL" and summary.key_decisions == ["step 40: I will use plan B"]
    assert summary.outputs[-1].startswith("step 40: ran `echo 40.")  # the newest kept
    assert summary.inputs[0] == "old input"  # merged with the previous one
    for items in (summary.inputs, summary.outputs, summary.key_decisions, summary.open_issues):
        assert len(items) <= compaction.SUMMARY_ITEMS and all(len(i) <= compaction.ITEM_CHARS for i in items)


def test_summary_and_index_fit_their_share_of_the_context() -> None:
    folded = transcript(200)
    summary = compaction.extractive_summary(None, folded, "THE GOAL", max_chars=compaction.summary_chars(2_000))
    assert len(summary.model_dump_json(indent=1)) <= compaction.summary_chars(2_000) == 1_200
    assert summary.outputs and summary.outputs[-1].startswith("step 200:")  # the newest survive
    index = compaction.add_to_index(
        compaction.FoldIndex(), compaction.index_steps(folded), compaction.index_chars(2_000)
    )
    assert len(compaction.render_index(index)) <= compaction.index_chars(2_000)
    assert compaction.indexed_steps(index) == list(range(1, 201))


def test_the_goal_leads_every_request_and_the_summary_follows_the_session() -> None:
    view = ModelView(session=SESSION, messages=transcript(10))
    assert compaction.request_messages(view)[:2] == SESSION
    fold = compaction.plan_fold(view.messages, 10, 3)
    view.summary = StructuredSummary(**valid_summary())
    view.index = compaction.add_to_index(view.index, compaction.index_steps(fold.folded))
    view.messages = fold.kept + [Message(role="system", content="note", step=10, kind="compaction")]
    sent = compaction.request_messages(view)
    assert sent[:2] == SESSION and sent[2].kind == "summary"
    assert "Folded steps 1-7;" in (sent[2].content or "") and '"key_decisions"' in (sent[2].content or "")
    assert sent[3:] == fold.kept  # the record-only note is not sent


def test_fewer_recent_steps_are_kept_when_they_alone_would_not_fit() -> None:
    big = "x" * 4_000  # ~1,000 tokens a step
    view = ModelView(session=SESSION, messages=[m for s in range(1, 11) for m in step_messages(s, 1, big)])
    assert compaction.steps_to_keep(view, 10, 6, max_context_tokens=100_000) == 6
    assert compaction.steps_to_keep(view, 10, 6, max_context_tokens=6_000) == 2
    assert compaction.steps_to_keep(view, 10, 6, max_context_tokens=1_000) == 1


def test_the_estimate_is_calibrated_by_the_last_reported_usage() -> None:
    messages = transcript(5)
    raw = estimate_tokens(messages)
    assert calibrated(raw, last_estimate=0, last_reported=0) == raw
    assert calibrated(raw, last_estimate=1_000, last_reported=1_200) == round(raw * 1.2)
    assert calibrated(raw, last_estimate=1_000, last_reported=10) == round(raw * 0.5)  # bounded


def spend(step: int = 0, tokens: int = 0) -> Spend:
    return Spend(step=step, usage=Usage(input_tokens=tokens), elapsed_s=0.0)


def test_the_ladder_climbs_in_the_seeds_order_one_threshold_at_a_time() -> None:
    limits = Limits(soft_steps=10, hard_steps=16)
    climbed: list[str] = []
    seen: list[tuple[int, str]] = []
    for step in range(0, 17):
        for rung in rungs_due(climbed, pressure(spend(step), limits)):
            climbed.append(rung)
            seen.append((step, rung))
    assert seen == [(10, "compaction"), (12, "soft_warning"), (14, "fallback_model")]
    assert [r for r, _ in RUNGS] == ["compaction", "soft_warning", "fallback_model"]


def test_a_jump_climbs_every_rung_passed_in_order_and_a_spike_starts_at_the_first() -> None:
    limits = Limits(max_tokens=1_000)
    assert pressure(spend(tokens=700), limits) is None
    assert rungs_due([], pressure(spend(tokens=990), limits)) == ["compaction", "soft_warning", "fallback_model"]
    assert rungs_due([], pressure(spend(tokens=10), limits, early_soft_tier=True)) == ["compaction"]
    assert rungs_due(["compaction"], pressure(spend(tokens=10), limits, early_soft_tier=True)) == []
