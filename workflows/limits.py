"""Limits and budgets as pure functions of what the run has recorded.

Nothing here reads a clock or estimates from wall time: usage comes from activity
results, elapsed time from `workflow.now()`, both passed in. Three tiers per budget:
under the soft ratio nothing happens; past it the model is told and the run degrades;
at 100 % (or when the next model call would not fit) the run stops cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass

from workflows.types import Limits, Price, Runway, StopReason, Usage

DEFAULT_EXPECTED_OUTPUT_TOKENS = 1_000
"""Pre-charge for a model call's reply until the run has its own average."""

MAX_TOOL_CALLS_PER_STEP = 64
"""Tool calls run from one reply; the model is told the rest were not run. A reply asking
for thousands would otherwise schedule them all in one workflow task."""

PACING_WINDOW = 10
PACING_MIN_SAMPLES = 3
PACING_SPIKE_FACTOR = 2.0


@dataclass(frozen=True)
class Spend:
    """Everything the limits look at, in one place."""

    step: int
    """Steps started so far (the next one would be step + 1)."""
    usage: Usage
    elapsed_s: float


def hard_stop(spend: Spend, limits: Limits, next_call: NextCallEstimate) -> StopReason | None:
    """Why the run must stop before its next model call, or None when the call fits."""
    usage = spend.usage
    if spend.step >= limits.hard_steps:
        return "hard_step_limit"
    if usage.model_calls >= limits.max_model_calls:
        return "model_call_budget"
    if spend.elapsed_s >= limits.max_duration_s:
        return "time_limit"
    if usage.tokens + next_call.tokens > limits.max_tokens:
        return "token_budget"
    if usage.cost_usd + next_call.cost_usd > limits.max_cost_usd:
        return "cost_budget"
    return None


def tool_calls_exceed(usage: Usage, limits: Limits, requested: int) -> bool:
    """Checked when the model asks for tools: the model may still answer after its last allowed call."""
    return usage.tool_calls + requested > limits.max_tool_calls


@dataclass(frozen=True)
class NextCallEstimate:
    tokens: int
    cost_usd: float


def estimate_next_call(context_tokens: int, output_history: list[int], price: Price | None) -> NextCallEstimate:
    """Pre-charge: the context as it stands plus an expected reply (the run's average so far)."""
    expected_output = (
        round(sum(output_history) / len(output_history)) if output_history else DEFAULT_EXPECTED_OUTPUT_TOKENS
    )
    tokens = context_tokens + expected_output
    cost = 0.0
    if price is not None:
        cost = (context_tokens * price.input_per_million + expected_output * price.output_per_million) / 1e6
    return NextCallEstimate(tokens=tokens, cost_usd=cost)


def budget_fractions(spend: Spend, limits: Limits) -> dict[str, float]:
    """How much of each budget is used, 0..1+ (steps against hard_steps)."""
    usage = spend.usage
    return {
        "steps": spend.step / limits.hard_steps,
        "tokens": usage.tokens / limits.max_tokens,
        "cost": usage.cost_usd / limits.max_cost_usd if limits.max_cost_usd else 1.0,
        "model_calls": usage.model_calls / limits.max_model_calls,
        "tool_calls": usage.tool_calls / limits.max_tool_calls if limits.max_tool_calls else 1.0,
        "time": spend.elapsed_s / limits.max_duration_s,
    }


def soft_tier(spend: Spend, limits: Limits) -> list[str]:
    """Budgets now in their soft tier. Steps use `soft_steps`; the others `soft_ratio`."""
    entered = [
        name for name, used in budget_fractions(spend, limits).items() if name != "steps" and used >= limits.soft_ratio
    ]
    if spend.step >= limits.soft_steps:
        entered.insert(0, "steps")
    return entered


def is_spike(step_tokens: int, previous: list[int]) -> bool:
    """A step costing more than twice the moving average enters the soft tier early."""
    window = previous[-PACING_WINDOW:]
    if len(window) < PACING_MIN_SAMPLES:
        return False
    return step_tokens > PACING_SPIKE_FACTOR * (sum(window) / len(window))


def runway(spend: Spend, limits: Limits) -> Runway:
    """Steps left at the current rate for each budget; None before the first step."""
    steps = spend.step
    usage = spend.usage
    if steps == 0:
        return Runway(steps=limits.hard_steps)

    def left(remaining: float, per_step: float) -> int | None:
        if per_step <= 0:
            return None
        return max(0, int(remaining / per_step))

    return Runway(
        steps=max(0, limits.hard_steps - steps),
        tokens=left(limits.max_tokens - usage.tokens, usage.tokens / steps),
        cost=left(limits.max_cost_usd - usage.cost_usd, usage.cost_usd / steps),
        model_calls=left(limits.max_model_calls - usage.model_calls, usage.model_calls / steps),
        tool_calls=left(limits.max_tool_calls - usage.tool_calls, usage.tool_calls / steps),
        time=left(limits.max_duration_s - spend.elapsed_s, spend.elapsed_s / steps),
    )


def warning_text(budgets: list[str], spend: Spend, limits: Limits) -> str:
    """The plain message the model gets when a budget enters its soft tier."""
    left = runway(spend, limits)
    parts = []
    for name in budgets:
        steps_left = getattr(left, name)
        parts.append(f"{name}: about {steps_left} step(s) left" if steps_left is not None else name)
    return (
        "Budget warning: you are close to the run's limits ("
        + "; ".join(parts)
        + f"; hard step limit {limits.hard_steps}, now at step {spend.step}). "
        "Finish the task now if you can; otherwise stop calling tools and summarize what is done "
        "and what is still open."
    )
