"""The run's "current details" in the Web UI: a short markdown page built from the status."""

from __future__ import annotations

from workflows.types import AgentStatus

BAR_WIDTH = 20


def bar(used: float, limit: float) -> str:
    fraction = 0.0 if limit <= 0 else min(1.0, used / limit)
    filled = round(fraction * BAR_WIDTH)
    return "█" * filled + "░" * (BAR_WIDTH - filled) + f" {fraction:4.0%}"


def details_markdown(status: AgentStatus) -> str:
    usage, limits = status.usage, status.limits
    cost = f"${usage.cost_usd:.4f}" + ("" if usage.cost_known else " (unknown model price)")
    lines = [
        f"**{status.state}** · step {status.step} · {status.model}",
        f"_{status.activity}_" if status.activity else "",
        "",
        "| budget | used | limit | |",
        "|---|---|---|---|",
        f"| steps | {status.step} | {limits.hard_steps} (soft {limits.soft_steps}) | `{bar(status.step, limits.hard_steps)}` |",
        f"| tokens | {usage.tokens:,} | {limits.max_tokens:,} | `{bar(usage.tokens, limits.max_tokens)}` |",
        f"| cost | {cost} | ${limits.max_cost_usd:g} | `{bar(usage.cost_usd, limits.max_cost_usd)}` |",
        f"| model calls | {usage.model_calls} | {limits.max_model_calls} | `{bar(usage.model_calls, limits.max_model_calls)}` |",
        f"| tool calls | {usage.tool_calls} | {limits.max_tool_calls} | `{bar(usage.tool_calls, limits.max_tool_calls)}` |",
        f"| time | {usage.elapsed_s:.0f} s | {limits.max_duration_s:g} s | `{bar(usage.elapsed_s, limits.max_duration_s)}` |",
    ]
    if status.paused_reason:
        lines += ["", f"**Paused:** {status.paused_reason}"]
    if status.pending_approvals:
        lines += ["", "**Waiting for approval** (`approve` update with the call id):"]
        lines += [f"- `{p.call_id}` {p.summary} — {p.reason}" for p in status.pending_approvals]
    if status.attention:
        a = status.attention
        lines += ["", f"**Needs attention:** {a.what_failed}", f"> {a.last_error[:500]}"]
        lines += [f"- {action}" for action in a.suggested_actions]
    if status.soft_tier:
        lines += ["", f"Soft tier: {', '.join(status.soft_tier)}"]
    return "\n".join(lines)
