"""Plain-text lines the CLI prints for steps, statuses and results. Pure functions."""

from __future__ import annotations

import textwrap

from workflows.approval import shown_below
from workflows.compaction import command_exit_code, record_text, tool_arguments
from workflows.plan import plan_text
from workflows.tool_specs import call_summary
from workflows.types import AgentResult, AgentStatus, AttentionReport, Limits, Message, PendingApproval, Usage
from workflows.wait_graph import chain_text


def cost_text(usage: Usage) -> str:
    if usage.cost_known:
        return f"${usage.cost_usd:.4f}"
    # A model without a price counts as $0, which would read as "free": say so instead.
    return f"${usage.cost_usd:.4f} + unpriced calls" if usage.cost_usd else "cost unknown"


def tokens_text(usage: Usage) -> str:
    # An endpoint that reported no usage is counted by estimate: say so, never a silent figure.
    if not usage.estimated_calls:
        return f"{usage.tokens:,} tokens"
    return f"{usage.tokens:,} tokens (estimated for {usage.estimated_calls} model calls without usage)"


def usage_text(usage: Usage) -> str:
    return f"{tokens_text(usage)} · {cost_text(usage)}"


def full_usage_text(usage: Usage) -> str:
    return (
        f"{tokens_text(usage)} (in {usage.input_tokens:,} / out {usage.output_tokens:,}) · "
        f"{usage.model_calls} model calls · {usage.tool_calls} tool calls · "
        f"{cost_text(usage)}{tool_costs_text(usage)} · {usage.elapsed_s:.1f} s"
    )


def tool_costs_text(usage: Usage) -> str:
    """` (tools: refund $0.1000)`: the priced tools' share of the cost; empty when none."""
    if not usage.tool_costs:
        return ""
    return " (tools: " + ", ".join(f"{tool} ${usd:.4f}" for tool, usd in sorted(usage.tool_costs.items())) + ")"


def limits_text(limits: Limits) -> str:
    return (
        f"steps {limits.hard_steps} (soft {limits.soft_steps}) · tokens {limits.max_tokens:,} · "
        f"cost ${limits.max_cost_usd:g} · model calls {limits.max_model_calls} · "
        f"tool calls {limits.max_tool_calls} · time {limits.max_duration_s:g} s"
    )


def step_line(step: int, messages: list[Message]) -> str:
    """`step 2 · run_command: python3 test_calc.py (exit 1)`, from the step's messages."""
    reply = next((m for m in messages if m.role == "assistant"), None)
    if reply is None:
        return f"step {step} · no model reply in the transcript"
    if not reply.tool_calls:
        return f"step {step} · final answer"
    results = {m.tool_call_id: m.content or "" for m in messages if m.role == "tool"}
    calls = [_call_text(c.name, c.arguments, results.get(c.id)) for c in reply.tool_calls]
    together = f"{len(calls)} calls in parallel: " if len(calls) > 1 else ""
    return f"step {step} · {together}{', '.join(calls)}"


def _call_text(name: str, raw_arguments: str, result: str | None) -> str:
    summary = call_summary(name, tool_arguments(raw_arguments), limit=80)
    if result is None:
        return summary
    if result.startswith("ERROR"):
        return f"{summary} (error)"
    code = command_exit_code(result)
    return summary if code is None else f"{summary} (exit {code})"


def approval_lines(run_id: str, pending: list[PendingApproval]) -> list[str]:
    """Each pending call, and below it what it would do, whole, where its line cannot say it."""
    lines = []
    for p in pending:
        lines.append(f"awaiting approval: {p.call_id} · {p.summary} · {p.reason}")
        lines += [f"    {line}" for line in p.shown.split("\n")] if shown_below(p) else []
    if pending:
        lines.append(f"  decide with: durable-agent approve {run_id} {pending[0].call_id} [--deny] [--note TEXT]")
    return lines


def attention_lines(run_id: str, report: AttentionReport, several: bool = False) -> list[str]:
    """One report; when several calls need attention at once, the hint names this one's call."""
    call = f" --call {report.call_id}" if several and report.call_id else ""
    return [
        f"needs attention: {report.what_failed} (after {report.attempts} attempt(s)): {_one_line(report.last_error)}",
        f"  decide with: durable-agent resolve {run_id} retry|skip|terminate{call} [--note TEXT]",
    ]


def attention_reports(status: AgentStatus) -> list[AttentionReport]:
    """Every open report (a status from before per-call reports holds only `attention`)."""
    return status.attention_reports or ([status.attention] if status.attention is not None else [])


def result_lines(result: AgentResult, files: bool = True) -> list[str]:
    """`files`: the closing clean-up's note (what was removed and kept in .durable-agent/)."""
    lines = [
        f"{result.state} ({result.stop_reason}) after {result.steps} steps",
        f"usage: {full_usage_text(result.usage)}",
        "output:",
        textwrap.indent(result.output.strip() or "(empty)", "  "),
    ]
    lines += [f"criterion {'met' if c.met else 'NOT met'}: {c.criterion}" for c in result.criteria]
    lines += [f"unfinished: {item}" for item in result.unfinished]
    if result.files and files:
        lines.append(f"files: {result.files}")
    return lines


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns, the first row their heading."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def status_lines(run_id: str, status: AgentStatus) -> list[str]:
    lines = [
        f"{run_id}: {status.state} · step {status.step} · model {status.model}"
        + (f" · agent {status.agent}" if status.agent else ""),
        f"usage: {full_usage_text(status.usage)}",
        f"limits: {limits_text(status.limits)}",
    ]
    if status.activity and status.result is None:
        lines.append(f"now: {status.activity}")
    if status.host is not None:
        lines.append(f"host: {status.host}" + "".join(f" · {move}" for move in status.host_moves))
    if status.context is not None:
        lines.append(context_text(status))
    if status.paused_reason:
        lines.append(f"paused: {status.paused_reason}")
    lines += approval_lines(run_id, status.pending_approvals)
    reports = attention_reports(status)
    for report in reports:
        lines += attention_lines(run_id, report, several=len(reports) > 1)
    lines += [f"ignored signal: {note}" for note in status.ignored_signals]
    lines += [
        f"delegate {c.workflow_id}: {c.state} · step {c.step} · {usage_text(c.usage)} · {_one_line(c.goal, 120)}"
        for c in status.children
    ]
    lines += [f"waiting on: {chain_text(chain)}" for chain in status.wait_chains if len(chain) > 1]
    lines += plan_text(status.plan).splitlines() if status.plan else []
    lines += [line for line in [status.quota.text()] if line]
    if status.result is not None:
        lines += result_lines(status.result)[2:]  # state and usage are already above
    return lines


def context_text(status: AgentStatus) -> str:
    """`context: ~1,900 of 4,000 tokens · 3 compactions (41 steps folded, 6,200 tokens) · last: ...`."""
    context = status.context
    assert context is not None
    text = f"context: ~{context.request_tokens:,} of {context.max_context_tokens:,} tokens"
    counters = context.counters
    if counters.compactions:
        text += (
            f" · {counters.compactions} compaction(s) ({counters.folded_steps} steps folded, "
            f"{counters.summary_tokens:,} tokens on summaries) · last: {record_text(context.compactions[-1])}"
        )
    return text


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
