"""The pure policy in workflows/ (limits, approval, livelock, context, tool calls): no server."""

from __future__ import annotations

import pytest

from workflows import limits
from workflows.approval import approval_reason
from workflows.context import estimate_tokens, last_answer, model_context, openai_message, tokens_of
from workflows.livelock import LIVELOCK_REPEATS, LivelockTracker, call_key
from workflows.state import Carry
from workflows.tool_specs import ToolArgumentError, parse_tool_call, unique_call_ids
from workflows.types import ALL_TOOLS, Approval, Limits, Message, Price, ToolCall, Usage

NO_CALL = limits.NextCallEstimate(tokens=0, cost_usd=0.0)


def spend(step: int = 0, elapsed_s: float = 0.0, **usage: float) -> limits.Spend:
    return limits.Spend(step=step, usage=Usage(**usage), elapsed_s=elapsed_s)


# --- limits ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "reason"),
    [
        (spend(step=10), "hard_step_limit"),
        (spend(model_calls=5), "model_call_budget"),
        (spend(elapsed_s=60), "time_limit"),
        (spend(input_tokens=1_001), "token_budget"),
        (spend(cost_usd=1.01), "cost_budget"),
        (spend(step=9, model_calls=4, elapsed_s=59, input_tokens=999, cost_usd=0.99), None),
    ],
)
def test_hard_stop_names_the_budget_that_is_used_up(used: limits.Spend, reason: str | None) -> None:
    capped = Limits(hard_steps=10, max_model_calls=5, max_duration_s=60, max_tokens=1_000, max_cost_usd=1.0)
    assert limits.hard_stop(used, capped, NO_CALL) == reason


def test_hard_stop_counts_the_next_call_before_it_is_made() -> None:
    capped = Limits(max_tokens=1_000, max_cost_usd=1.0)
    assert limits.hard_stop(spend(input_tokens=500), capped, limits.NextCallEstimate(500, 0.0)) is None
    assert limits.hard_stop(spend(input_tokens=500), capped, limits.NextCallEstimate(501, 0.0)) == "token_budget"
    assert limits.hard_stop(spend(), capped, limits.NextCallEstimate(0, 1.01)) == "cost_budget"


def test_the_expected_reply_is_the_run_average_or_a_default() -> None:
    price = Price(input_per_million=1.0, output_per_million=2.0)
    assert limits.estimate_next_call(100, [], None) == limits.NextCallEstimate(
        100 + limits.DEFAULT_EXPECTED_OUTPUT_TOKENS, 0.0
    )
    estimate = limits.estimate_next_call(1_000_000, [10, 30], price)
    assert estimate.tokens == 1_000_020 and estimate.cost_usd == pytest.approx(1.0 + 20 * 2 / 1e6)


def test_tool_calls_may_use_the_budget_exactly() -> None:
    capped = Limits(max_tool_calls=5)
    assert not limits.tool_calls_exceed(Usage(tool_calls=3), capped, 2)
    assert limits.tool_calls_exceed(Usage(tool_calls=3), capped, 3)


def test_soft_tier_starts_at_the_soft_ratio_and_soft_steps() -> None:
    capped = Limits(soft_steps=4, hard_steps=5, max_tokens=1_000, soft_ratio=0.8)
    assert limits.soft_tier(spend(step=3, input_tokens=799), capped) == []
    assert limits.soft_tier(spend(step=4, input_tokens=800), capped) == ["steps", "tokens"]


def test_a_spike_needs_enough_samples_and_twice_the_average() -> None:
    assert not limits.is_spike(1_000, [10, 10])  # too few samples to judge
    assert not limits.is_spike(20, [10, 10, 10])
    assert limits.is_spike(21, [10, 10, 10])


def test_runway_is_steps_left_at_the_current_rate() -> None:
    capped = Limits(hard_steps=50, max_tokens=1_000, max_duration_s=100)
    assert limits.runway(spend(), capped).steps == 50 and limits.runway(spend(), capped).tokens is None
    left = limits.runway(spend(step=2, input_tokens=200, elapsed_s=10), capped)
    assert (left.steps, left.tokens, left.time, left.cost) == (48, 8, 18, None)


def test_warning_text_names_each_budget_and_asks_to_finish() -> None:
    text = limits.warning_text(["tokens"], spend(step=2, input_tokens=200), Limits(max_tokens=1_000))
    assert "tokens: about 8 step(s) left" in text and "now at step 2" in text and "Finish" in text


# --- approval ----------------------------------------------------------------------


def test_approval_by_tool_and_by_command_pattern() -> None:
    gate = Approval(tools=["write_file"], commands=[r"\brm\b", r"^git push"])
    assert approval_reason("write_file", {"path": "a"}, gate) == "every write_file call needs approval"
    assert "rm" in (approval_reason("run_command", {"command": "ls && rm -rf x"}, gate) or "")
    assert approval_reason("run_command", {"command": "git push origin"}, gate) is not None
    assert approval_reason("run_command", {"command": "echo git push"}, gate) is None
    assert approval_reason("run_command", {"command": "form x"}, gate) is None  # \b: not a word
    assert approval_reason("read_file", {"path": "rm"}, gate) is None


def test_an_invalid_approval_pattern_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="not a valid regex"):
        Approval(commands=["(unclosed"])


# --- livelock ----------------------------------------------------------------------


def test_a_livelock_is_the_same_failure_of_the_same_call_in_a_row() -> None:
    tracker = LivelockTracker()
    key = call_key("read_file", {"path": "a", "limit": 5})
    assert key == call_key("read_file", {"limit": 5, "path": "a"})  # argument order is irrelevant
    assert [tracker.record(key, "missing") for _ in range(LIVELOCK_REPEATS)] == [1, 2, 3]
    assert tracker.record(key, "another error") == 1  # a different failure starts again
    assert tracker.record(key, None) == 0 and key not in tracker.streaks  # a success clears it
    other = call_key("read_file", {"path": "b"})
    tracker.record(key, "x")
    assert tracker.record(other, "x") == 1  # per call
    tracker.clear(key)
    assert tracker.record(key, "x") == 1


# --- context -----------------------------------------------------------------------


def test_record_only_messages_never_reach_the_model() -> None:
    messages = [
        Message(role="user", content="goal", kind="goal"),
        Message(role="system", content="switched model", kind="degradation"),
        Message(role="assistant", content="  "),
        Message(role="assistant", content="the answer"),
        Message(role="assistant", content=None),
    ]
    assert [m.kind for m in model_context(messages)] == ["goal", None, None, None]
    assert last_answer(messages) == "the answer"
    assert last_answer(messages[:3]) is None


def test_estimate_tokens_counts_text_and_tool_calls() -> None:
    call = ToolCall(id="c", name="run_command", arguments="x" * 400)
    assert estimate_tokens([Message(role="user", content="y" * 400)]) == (400 + 16) // 4 + 1
    assert estimate_tokens([Message(role="assistant", tool_calls=[call])]) > 100
    # The transcript's estimate is that of its texts: each content (empty when none), each call's name and arguments.
    messages = [Message(role="assistant", content=None, tool_calls=[call, call]), Message(role="tool", content="ok")]
    texts = ["", "run_command" + "x" * 400, "run_command" + "x" * 400, "ok"]
    assert estimate_tokens(messages) == tokens_of(texts) == (2 * 411 + 2 + 16 * 4) // 4 + 1


def test_wire_format_of_tool_calls_and_results() -> None:
    call = ToolCall(id="c1", name="list_files", arguments="{}")
    assert openai_message(Message(role="assistant", tool_calls=[call])) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}],
    }
    assert openai_message(Message(role="tool", tool_call_id="c1", content=None)) == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "",
    }
    assert openai_message(Message(role="assistant"))["content"] == ""


# --- tool calls --------------------------------------------------------------------


def test_repeated_or_empty_call_ids_become_unique_and_stable() -> None:
    calls = [ToolCall(id=i, name="list_files", arguments="{}") for i in ("a", "a", "", "a-1", "b")]
    ids = [c.id for c in unique_call_ids(calls)]
    assert len(set(ids)) == 5 and ids[0] == "a" and ids[3] == "a-1" and ids[4] == "b" and all(ids)
    assert ids == [c.id for c in unique_call_ids(calls)]  # deterministic: replays give the same ids
    assert unique_call_ids(calls[4:]) == calls[4:]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"path": "a", "content": "\\ud800"}', "surrogate"),
        ('{"path": "a", "content": ' + "[" * 5_000 + "]" * 5_000 + "}", "nested too deeply"),
        ('{"path": "a"}', "content"),
        ('{"path": "a", "content": "x", "mode": 1}', "mode"),
    ],
)
def test_bad_tool_arguments_are_a_message_for_the_model(arguments: str, said: str) -> None:
    with pytest.raises(ToolArgumentError, match=said):
        parse_tool_call("write_file", arguments, list(ALL_TOOLS))


@pytest.mark.parametrize("timeout", ["Infinity", "NaN", "1e999", "-1", "0"])
def test_a_command_timeout_must_be_a_finite_positive_number(timeout: str) -> None:
    with pytest.raises(ToolArgumentError, match="timeout_s"):
        parse_tool_call("run_command", '{"command": "x", "timeout_s": ' + timeout + "}", ["run_command"])


def test_an_unknown_or_disabled_tool_is_named_with_the_available_ones() -> None:
    with pytest.raises(ToolArgumentError, match="available tools: read_file"):
        parse_tool_call("write_file", "{}", ["read_file"])


# --- the carried state -------------------------------------------------------------


def test_a_carry_written_before_the_rename_keeps_its_output_token_window() -> None:
    old = Carry.model_validate({"output_tokens": [10, 20]})
    assert old.recent_output_tokens == [10, 20]
    assert "output_tokens" not in Carry(recent_output_tokens=[5]).model_dump()
    assert Carry.model_validate_json(Carry(recent_output_tokens=[5]).model_dump_json()).recent_output_tokens == [5]


def test_pending_approvals_are_listed_in_the_order_the_model_asked_for_the_calls() -> None:
    """Each approval is listed once its diff activity returns, and those return in any order."""
    from types import SimpleNamespace

    from workflows.tool_steps import ToolSteps
    from workflows.types import PendingApproval

    def pending(call_id: str) -> PendingApproval:
        return PendingApproval(call_id=f"3:{call_id}", tool="write_file", summary=call_id, step=3, reason="r")

    positions = {"3:call_a": 0, "3:call:b": 1, "3:call_c": 2}
    steps = SimpleNamespace(_call_positions=positions, _pending_approvals={})
    for finished in ("call_c", "call:b", "call_a"):  # the diffs' finishing order
        steps._pending_approvals[f"3:{finished}"] = pending(finished)
        ToolSteps._list_in_call_order(steps)  # type: ignore[arg-type]
    assert list(steps._pending_approvals) == ["3:call_a", "3:call:b", "3:call_c"]
