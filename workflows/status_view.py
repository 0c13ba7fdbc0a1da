"""The run's "current details" in the Web UI: a short markdown page built from the status.

Written for the Web UI's renderer (checked in headless Chromium against UI 2.54): a list
only renders after a blank line, tables get neither borders nor padding (so the budget is
a fixed-width code block), and `_` or `*` in free text would turn into emphasis.
"""

from __future__ import annotations

import re

from workflows.approval import shown_below
from workflows.compaction import record_text, render_index
from workflows.state import ContextStatus
from workflows.types import AgentInput, AgentStatus
from workflows.wait_graph import chain_text

BAR_WIDTH = 20


def bar(used: float, limit: float) -> str:
    fraction = 0.0 if limit <= 0 else min(1.0, used / limit)
    filled = round(fraction * BAR_WIDTH)
    return "█" * filled + "░" * (BAR_WIDTH - filled) + f" {fraction:4.0%}"


def plain(text: str) -> str:
    """Free text (a goal, an error, a command) shown as itself, not as markdown."""
    return re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", text)


def _fenced(text: str) -> list[str]:
    """`text` as a code block, whole: its fence is longer than any run of backticks in it."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return ["", f"  {fence}", *(f"  {line}" for line in text.split("\n")), f"  {fence}", ""]


def budget_block(status: AgentStatus) -> list[str]:
    usage, limits = status.usage, status.limits
    cost = f"${usage.cost_usd:.4f}" + ("" if usage.cost_known else "?")
    rows = [
        ("steps", str(status.step), f"{limits.hard_steps} (soft {limits.soft_steps})", status.step, limits.hard_steps),
        ("tokens", f"{usage.tokens:,}", f"{limits.max_tokens:,}", usage.tokens, limits.max_tokens),
        ("cost", cost, f"${limits.max_cost_usd:g}", usage.cost_usd, limits.max_cost_usd),
        ("model calls", str(usage.model_calls), str(limits.max_model_calls), usage.model_calls, limits.max_model_calls),
        ("tool calls", str(usage.tool_calls), str(limits.max_tool_calls), usage.tool_calls, limits.max_tool_calls),
        ("time", f"{usage.elapsed_s:.0f} s", f"{limits.max_duration_s:g} s", usage.elapsed_s, limits.max_duration_s),
    ]
    lines = ["```", f"{'budget':<12}{'used':>10}  {'limit':<16}"]
    lines += [f"{name:<12}{shown:>10}  {limit:<16}{bar(used, cap)}" for name, shown, limit, used, cap in rows]
    if not usage.cost_known:
        lines.append("? the model's price is unknown: cost counts 0")
    if usage.estimated_calls:
        lines.append(f"~ tokens estimated for {usage.estimated_calls} model calls: the endpoint reported no usage")
    return [*lines, "```"]


def details_markdown(status: AgentStatus) -> str:
    lines = [f"**{status.state}** · step {status.step} · {plain(status.model)}"]
    if status.agent:
        lines[0] += f" · agent {plain(status.agent)}"
    if status.activity:
        lines += ["", f"Now: {plain(status.activity)}"]
    if status.host:
        lines += ["", f"Host: {plain(status.host)}" + "".join(f" · {plain(move)}" for move in status.host_moves)]
    if status.pending_approvals:
        lines += ["", "**Waiting for approval.** Decide with the `approve` update and the call id:", ""]
        for p in status.pending_approvals:
            lines += [f"- `{p.call_id}` {plain(p.summary)} ({plain(p.reason)})"]
            lines += _fenced(p.shown) if shown_below(p) else []
    reports = status.attention_reports or ([status.attention] if status.attention else [])
    for a in reports:
        lines += ["", f"**Needs attention:** {plain(a.what_failed)} (step {a.step}, {a.attempts} attempts)", ""]
        lines += [f"Last error: {plain(a.last_error[:500])}", ""]
        if len(reports) > 1:
            lines += [f'Decide with the `resolve` update and `"call_id": "{a.call_id}"`:', ""]
        else:
            lines += ["Decide with the `resolve` update:", ""]
        lines += [f"- {plain(action)}" for action in a.suggested_actions]
    if status.paused_reason:
        lines += ["", f"**Paused:** {plain(status.paused_reason)}. Continue with the `resume` signal."]
    if status.soft_tier:
        lines += ["", f"Soft tier: {plain(', '.join(status.soft_tier))}"]
    if (quota := status.quota.text()) is not None:
        lines += ["", plain(quota)]
    if status.children:
        lines += ["", "**Delegates** (spend so far, charged to this run when each ends):", ""]
        lines += [
            f"- `{c.workflow_id}` {plain(c.state)} · step {c.step} · {c.usage.tokens:,} tokens"
            f" · ${c.usage.cost_usd:.4f} · {plain(c.goal[:120])}"
            for c in status.children
        ]
    if status.wait_chains:
        lines += ["", "**Waiting on:**", ""]
        lines += [f"- {plain(chain_text(chain))}" for chain in status.wait_chains]
    context = context_lines(status.context) if status.context else []
    return "\n".join([*lines, *plan_lines(status), "", *budget_block(status), *context])


def plan_lines(status: AgentStatus) -> list[str]:
    """The run's task list (the `plan` tool), each item with its status and whether it is required."""
    if not status.plan:
        return []
    lines = ["", "**Plan:**", ""]
    for item in status.plan:
        kind = "required" if item.required else "optional"
        lines.append(f"- {plain(f'[{item.status}] {item.text}')} ({kind})")
    return lines


def context_lines(context: ContextStatus) -> list[str]:
    """The model's context: its size, each compaction (latest first), the summary and the index."""
    counters = context.counters
    lines = [
        "",
        f"**Context:** ~{context.request_tokens:,} of {context.max_context_tokens:,} tokens "
        f"(last request: {context.last_request_tokens:,} reported, ~{context.last_request_estimate:,} estimated)",
    ]
    if not counters.compactions:
        return lines
    lines[-1] += (
        f"; {counters.compactions} compaction(s), {counters.folded_steps} steps folded, "
        f"{counters.summary_tokens:,} tokens on summaries"
        + (f", {counters.extractive_summaries} extractive" if counters.extractive_summaries else "")
    )
    lines += ["", "Compactions (latest first):", ""]
    lines += [f"- step {c.step}: {plain(record_text(c))}" for c in reversed(context.compactions[-3:])]
    if context.summary is not None:
        summary = context.summary
        lines += ["", f"**Summary of folded steps:** {plain(summary.goal)}", ""]
        for name in ("inputs", "outputs", "key_decisions", "open_issues"):
            items = getattr(summary, name)
            lines.append(f"- {name.replace('_', ' ')}: {plain('; '.join(items[-3:])) if items else 'none'}")
    index = render_index(context.index).splitlines()
    lines += ["", f"**Index:** {plain(index[0])} Archive: {plain(context.archive_dir)}/", ""]
    lines += [f"- {plain(line)}" for line in index[1:][-5:]]
    return lines


def start_details(agent: AgentInput) -> str:
    """The run page's fixed "Details": what the run was given and how to steer it."""
    limits, fallback = agent.limits, agent.fallback_model
    gated = [*agent.approval.tools, *(f"run_command ~ /{c}/" for c in agent.approval.commands)]
    named = [f"**Agent:** {plain(agent.agent)} (its file gives what this input does not)", ""] if agent.agent else []
    lines = [
        *named,
        f"**Workspace:** {plain(agent.workspace)}",
        "",
        f"**Model:** {plain(agent.model)}" + (f", falls back to {plain(fallback)}" if fallback else ""),
        "",
        f"**Tools:** {', '.join(agent.enabled_tools())}",
        "",
        f"**Needs approval:** {plain(', '.join(gated)) if gated else 'nothing'}",
        "",
        f"**Commands:** sandboxed, network {'on' if agent.sandbox.network else 'off'}"
        + (f"; environment also passes {plain(', '.join(agent.env_allow))}" if agent.env_allow else ""),
        "",
        f"**Limits:** {limits.hard_steps} steps (soft {limits.soft_steps}), {limits.max_tokens:,} tokens, "
        f"${limits.max_cost_usd:g}, {limits.max_duration_s:g} s",
        "",
        "Steer it with the signals `pause`, `resume`, `add_message` and the updates `approve`, "
        "`resolve`, `raise_limits`; the `status` query (or the Current Details here) says what it waits for.",
    ]
    return "\n".join(lines)
