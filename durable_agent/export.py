"""`durable-agent export`: a run's transcript as JSONL, or a readable Markdown report.

Both read what `durable_agent.history` replayed from the chain's histories; a run that is
still running is read through its `transcript` and `status` queries instead. Steps folded
in runs whose history is gone (retention) or that the query does not hold (earlier runs of
the chain) come from the run's archive in the workspace (`activities/archive.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowHandle

from activities.archive import read_archive
from durable_agent.history import PersonAction, replay_chain
from workflows.plan import PlanItem, plan_text
from workflows.tool_specs import call_summary
from workflows.types import AgentInput, AgentResult, AgentStatus, Message, RunState, TranscriptRequest, Usage
from workflows.visible import visible, visible_json

FORMATS = ("jsonl", "markdown")
TOOL_RESULT_CHARS = 300


class Report(BaseModel):
    """What the Markdown report shows of a run."""

    workflow_id: str
    goal: str
    state: RunState | str
    messages: list[Message]
    usage: Usage
    result: AgentResult | None = None
    actions: list[PersonAction] | None = None  # None: not known (read from a running run)
    plan: list[PlanItem] = Field(default_factory=list)
    """The run's task list (the `plan` tool): at its close, or now for a running run."""


def jsonl(messages: Iterable[Message]) -> list[str]:
    """One message a line; every byte the run recorded decodes back, but no terminal control
    stands raw in the text (JSON escapes C0 itself; DEL, C1 and bidi controls too here)."""
    return [visible_json(m.model_dump_json(exclude_none=True)) for m in messages]


def markdown(report: Report) -> str:
    """For people: terminal controls in model and tool text are shown escaped."""
    lines = [f"# Run {report.workflow_id}", "", f"**Goal:** {report.goal}", ""]
    lines += _outcome(report)
    if report.plan:
        lines += ["", "## Plan", "", plan_text(report.plan)]
    lines += ["", "## Steps"]
    lines += _steps(report.messages)
    lines += ["", "## Decisions of people", ""]
    lines += _decisions(report.actions)
    return visible("\n".join(lines) + "\n")


def _outcome(report: Report) -> list[str]:
    usage = report.usage
    cost = f"${usage.cost_usd:.4f}" + ("" if usage.cost_known else " (some models unpriced)")
    lines = [
        f"**State:** {report.state}"
        + (f" ({report.result.stop_reason}) after {report.result.steps} steps" if report.result else ""),
        "",
        "| input tokens | output tokens | model calls | tool calls | cost | elapsed |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {usage.input_tokens:,} | {usage.output_tokens:,} | {usage.model_calls} | {usage.tool_calls} "
        f"| {cost} | {usage.elapsed_s:.1f} s |",
    ]
    if report.result is not None:
        lines += ["", "## Result", "", report.result.output.strip() or "(no output)"]
        if report.result.unfinished:
            lines += ["", "Unfinished:", *(f"- {item}" for item in report.result.unfinished)]
    return lines


def _steps(messages: list[Message]) -> list[str]:
    results = {m.tool_call_id: m.content or "" for m in messages if m.role == "tool" and m.tool_call_id}
    by_step: dict[int, list[str]] = {}
    for message in messages:
        if message.role != "tool":
            by_step.setdefault(message.step, []).extend(_message_lines(message, results))
    lines: list[str] = []
    for step, shown in by_step.items():
        if shown:
            lines += ["", f"### Step {step}" if step else "### Before the first step", "", *shown]
    return lines


def _message_lines(message: Message, results: dict[str, str]) -> list[str]:
    if message.kind in ("system_prompt", "goal"):
        return []  # the report's header says the goal; the system prompt is the same for every run
    if message.role == "system":
        return [f"> {message.kind}: {_one_line(message.content)}"]
    if message.role == "user":
        who = "A person" if message.kind in ("user", "resolution", "edit") else "User"
        return [f"**{who}:** {_one_line(message.content)}"]
    lines = [f"**Model:** {message.content.strip()}"] if message.content else []
    for call in message.tool_calls:
        outcome = results.get(call.id, "(no result recorded)")
        summary = f"- `{_summary(call.name, call.arguments)}` →"
        if "\n" not in outcome.strip():
            lines.append(f"{summary} {_one_line(outcome, TOOL_RESULT_CHARS)}")
        else:  # a traceback or a file keeps its lines
            lines += [summary, *_indented_block(outcome, TOOL_RESULT_CHARS)]
    return lines


def _indented_block(text: str, limit: int) -> list[str]:
    """`text` as a fenced block under a list item, cut at `limit` characters; the fence is
    longer than any run of backticks inside, so the text cannot close it."""
    body = text.strip("\n")
    if len(body) > limit:
        body = body[: limit - 1] + "…"
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", body)), default=0))
    return [f"  {line}".rstrip() for line in [fence, *body.split("\n"), fence]]


def _summary(name: str, raw_arguments: str) -> str:
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError:
        return f"{name} (arguments not JSON)"
    return call_summary(name, arguments) if isinstance(arguments, dict) else name


def _decisions(actions: list[PersonAction] | None) -> list[str]:
    if actions is None:
        return ["(the run is still running: its decisions are listed once it has closed)"]
    if not actions:
        return ["None: the run went its way without a person."]
    return [f"- step {a.step}: {_action_text(a)}" for a in actions]


def _action_text(action: PersonAction) -> str:
    payload = action.payload if isinstance(action.payload, dict) else {}
    note = f" ({payload['note']})" if payload.get("note") else ""
    if action.name == "approve":
        verdict = "approved" if payload.get("approved") else "denied"
        return f"{verdict} tool call {payload.get('call_id')}{note}"
    if action.name == "resolve":
        return f"resolved a needs-attention report with `{payload.get('action')}`{note}"
    if action.name == "add_message":
        return f"sent a message: {_one_line(payload.get('text'))}"
    if action.name == "pause":
        return "paused the run" + (f": {payload['reason']}" if payload.get("reason") else "")
    if action.name == "raise_limits":
        changed = ", ".join(f"{k}={v}" for k, v in payload.items())
        return f"changed limits: {changed or 'none'}"
    return action.name.replace("_", " ") + (f" {payload}" if payload else "")


def _one_line(text: str | None, limit: int = 500) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def with_archive(messages: list[Message], archive_path: str | None) -> list[Message]:
    """`archived` entries (steps folded in earlier runs) replaced by those steps from the
    archive; where the archive cannot be read here, the entries stay and say where it is."""
    if not archive_path or not any(m.kind == "archived" for m in messages):
        return messages
    try:
        archived = read_archive(Path(archive_path))
    except (OSError, ValueError):
        return messages
    here = [m for m in messages if m.kind != "archived"]
    seen = {m.model_dump_json() for m in here}
    return sorted(here + [m for m in archived if m.model_dump_json() not in seen], key=lambda m: m.step)


async def closed_report(client: Client, workflow_id: str) -> Report:
    """From the chain's histories alone: no worker needed."""
    chain = await replay_chain(client, workflow_id)
    last = chain.runs[-1]
    result = chain.result
    return Report(
        workflow_id=workflow_id,
        goal=chain.goal,
        state=result.state if result else "failed" + (f": {last.error}" if last.error else ""),
        messages=with_archive(chain.transcript(), _archive_path(last.input)),
        usage=result.usage if result else Usage(),
        result=result,
        actions=chain.actions(),
        plan=result.plan if result else [],
    )


async def running_report(handle: WorkflowHandle[Any, Any], query_timeout: timedelta) -> Report:
    """Through the run's queries: a worker must answer them."""
    messages = await handle.query(
        "transcript", TranscriptRequest(from_step=0), result_type=list[Message], rpc_timeout=query_timeout
    )
    status = await handle.query("status", result_type=AgentStatus, rpc_timeout=query_timeout)
    messages = with_archive(messages, status.context.archive_path if status.context else None)
    goal = next((m.content or "" for m in messages if m.kind == "goal"), "")
    return Report(
        workflow_id=handle.id,
        goal=goal,
        state=status.state,
        messages=messages,
        usage=status.usage,
        actions=None,
        plan=status.plan,
    )


def _archive_path(agent: AgentInput | None) -> str | None:
    if agent is None or agent.carry is None or not agent.carry.archive_dir:
        return None
    return f"{agent.workspace}/{agent.carry.archive_dir}"
