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
    rows = [
        ("steps", str(status.step), f"{limits.hard_steps} (soft {limits.soft_steps})", status.step, limits.hard_steps),
        ("tokens", f"{usage.tokens:,}", f"{limits.max_tokens:,}", usage.tokens, limits.max_tokens),
        ("cost", cost, f"${limits.max_cost_usd:g}", usage.cost_usd, limits.max_cost_usd),
        ("model calls", str(usage.model_calls), str(limits.max_model_calls), usage.model_calls, limits.max_model_calls),
        ("tool calls", str(usage.tool_calls), str(limits.max_tool_calls), usage.tool_calls, limits.max_tool_calls),
        ("time", f"{usage.elapsed_s:.0f} s", f"{limits.max_duration_s:g} s", usage.elapsed_s, limits.max_duration_s),
    ]
    lines = [
        f"**{status.state}** · step {status.step} · {status.model}",
        f"_{status.activity}_" if status.activity else "",
        "",
        "| budget | used | limit | |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {shown} | {limit} | `{bar(used, cap)}` |" for name, shown, limit, used, cap in rows]
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
