"""Following a run live, shared by `run` and `watch`.

It only reads: the `status` and `transcript` queries every POLL_S (and, while the model
replies, the reply so far: from its worker, or its call's heartbeat details,
durable_agent/live_source.py), plus one long poll on the run's
result, which also notices endings no query can report (a run terminated or failed from
outside). Nothing here changes the run, so a follower may come and go.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import exceptions as temporal_errors
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError

from durable_agent import render
from durable_agent.codecs import CodecError
from durable_agent.console import Console
from durable_agent.live_source import LiveSource
from durable_agent.task_failures import failing_task
from workflows.types import (
    TERMINAL_STATES,
    AgentResult,
    AgentStatus,
    AttentionReport,
    Degradation,
    Message,
    PendingApproval,
    TranscriptRequest,
    Usage,
    WatchRequest,
)

POLL_S = 0.4
WATCH_LEASE_S, WATCH_RENEW_S = 120.0, 60.0
"""A follower tells the run it watches (the `watch` signal) for the next 120 s, renewed every
60 s: a run nobody follows pays nothing for the live view (a beat within a second of each
new line while a reply streams); a followed one, one signal in its history a minute."""
QUERY_TIMEOUT = timedelta(seconds=5)
"""A query waits for a worker to answer; none within this time means no worker is up."""

EXIT_CODES = {"completed": 0, "stopped": 3, "cancelled": 4, "terminated": 4}
EXIT_FAILED = 4
"""The run ended without an AgentResult: failed, or terminated or timed out by Temporal."""

Approver = Callable[[PendingApproval], Awaitable[None]]

NoWorkerHook = Callable[[], Awaitable[bool]]
"""Called when no worker answered a poll: `run` starts one if none polls (a SIGKILLed one)
and says so; True if it did."""

ProgressHook = Callable[[int], None]
"""Called with the last step printed so far, at each poll and before each new step line:
a caller can print its own lines in step order (the demo's crash notes)."""


@dataclass
class Snapshot:
    status: AgentStatus
    messages: list[Message]
    """The transcript from the first step not printed yet."""


class Reporter:
    """Turns successive snapshots into lines, each step and each state change printed once."""

    def __init__(self, run_id: str, since: AgentStatus | None = None, verbose: bool = False) -> None:
        # `since`: the status already shown (watch); its step and notes are not repeated.
        self.run_id = run_id
        self.verbose = verbose
        self.next_step = max(since.step, 1) if since else 1
        self._state: str | None = since.state if since else None
        self._approvals_seen = {p.call_id for p in since.pending_approvals} if since else set()
        self._attention: list[AttentionReport] = render.attention_reports(since) if since else []
        self._notes_seen = len(since.degradations) if since else 0
        self._usage_shown = ""

    def finished_steps(self, snapshot: Snapshot) -> list[tuple[int, str]]:
        """(step, line) for every step finished since the last call, in order."""
        by_step: dict[int, list[Message]] = {}
        for message in snapshot.messages:
            by_step.setdefault(message.step, []).append(message)
        ended = snapshot.status.state in TERMINAL_STATES
        lines: list[tuple[int, str]] = []
        while self.next_step <= snapshot.status.step:
            step = self.next_step
            later = any(s > step for s in by_step)
            if not (ended or later or _complete(by_step.get(step, []))):
                break
            lines.append((step, render.step_line(step, by_step.get(step, []))))
            self.next_step += 1
        return lines

    def with_usage(self, line: str, usage: Usage) -> str:
        """The usage is cumulative "now", so it goes on the newest step's line; a repeat is left out."""
        text = render.usage_text(usage)
        if text == self._usage_shown:
            return line
        self._usage_shown = text
        return f"{line} · {text} so far"

    def state_lines(self, status: AgentStatus) -> list[str]:
        notes = (note_line(d, self.verbose) for d in status.degradations[self._notes_seen :])
        lines = [note for note in notes if note]
        self._notes_seen = len(status.degradations)
        new_approvals = [p for p in status.pending_approvals if p.call_id not in self._approvals_seen]
        self._approvals_seen.update(p.call_id for p in new_approvals)
        lines += render.approval_lines(self.run_id, new_approvals)
        reports = render.attention_reports(status)
        several = len(reports) > 1
        lines += [
            line
            for report in reports
            if report not in self._attention
            for line in render.attention_lines(self.run_id, report, several)
        ]
        self._attention = reports
        previous, self._state = self._state, status.state
        if status.state == "paused" and previous != "paused":
            lines.append(f"paused: {status.paused_reason} (continue with: durable-agent resume {self.run_id})")
        elif status.state == "running" and previous not in (None, "running", "starting"):
            lines.append("running again")
        return lines


class LiveReply:
    """The model's reply while it streams, from its call's heartbeat details: each complete
    line of text once, then the tools it asks for, tagged with the step. A retried call's
    reply starts over, and says so, rather than running on from the failed attempt's text."""

    def __init__(self) -> None:
        self._call: tuple[int, int] | None = None
        self._printed = 0
        """Characters of the reply's text shown so far (whole lines)."""
        self._tools_shown = 0

    def lines(self, step: int, attempt: int, details: dict[str, Any]) -> list[str]:
        lines: list[str] = []
        if self._call != (step, attempt):
            if self._call is not None and self._call[0] == step:
                lines.append(f"step {step} … attempt {attempt}: the model's reply starts over")
            self._call, self._printed, self._tools_shown = (step, attempt), 0, 0
        text, offset = str(details.get("text") or ""), int(details.get("text_offset") or 0)
        tools = [str(name) for name in details.get("tool_calls") or []]
        unseen = text[max(0, self._printed - offset) :]
        whole, newline, rest = unseen.rpartition("\n")
        if tools and rest:  # the text is over once tool calls come: show its last line too
            whole, newline, rest = unseen, "\n", ""
        if newline:
            lines += [f"step {step} … {line}" for line in whole.split("\n") if line.strip()]
            self._printed = offset + len(text) - len(rest)
        lines += [f"step {step} … asks for {name}" for name in tools[self._tools_shown :]]
        self._tools_shown = max(self._tools_shown, len(tools))
        return lines


def note_line(note: Degradation, verbose: bool) -> str | None:
    """A degradation as a person following the run needs it: what changed for the run, in plain
    words; the bookkeeping (a compaction with nothing to fold, the early soft tier, the stop
    the result states anyway) only with --verbose, where every note is shown as recorded."""
    if verbose:
        return f"note: {note.kind}: {note.detail}"
    if note.kind == "soft_warning":
        return f"note: the run nears a limit ({note.detail.split(':', 1)[0]}): the model was told to wrap up"
    if note.kind == "fallback_model":
        return f"note: {note.detail} (a budget's soft tier)"
    if note.kind == "compaction" and note.detail.startswith("folded"):
        return "note: older steps were summarised to keep the context within its budget (`recall` brings them back)"
    return None


def _complete(messages: list[Message]) -> bool:
    """A step is finished once its model reply is in and every tool call it made has a result."""
    reply = next((m for m in messages if m.role == "assistant"), None)
    if reply is None:
        return False
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    return all(call.id in answered for call in reply.tool_calls)


async def caught_up(
    handle: WorkflowHandle[object, AgentResult], since: AgentStatus, verbose: bool = False
) -> tuple[Reporter, list[str]]:
    """A reporter past everything `since` shows, and the lines of the steps already finished
    then: `watch` prints them before it starts following, so no old step reads as new."""
    reporter = Reporter(handle.id, since, verbose)
    snapshot = await _snapshot(handle, reporter.next_step)
    if snapshot is None:
        return reporter, []
    return reporter, [line for _, line in reporter.finished_steps(snapshot)]


async def follow(
    handle: WorkflowHandle[object, AgentResult],
    console: Console,
    since: AgentStatus | None = None,
    on_progress: ProgressHook | None = None,
    approver: Approver | None = None,
    reporter: Reporter | None = None,
    verbose: bool = False,
    on_no_worker: NoWorkerHook | None = None,
) -> int:
    """Print the run as it goes until it ends; returns the exit code for its outcome.

    With an `approver`, each newly pending approval is handed to it (in a task, so the
    run keeps being followed while a person thinks). `reporter`: one already past what
    was printed (`caught_up`). With `on_no_worker`, a poll no worker answered calls it
    before the next poll.
    """
    reporter = reporter or Reporter(handle.id, since, verbose)
    live, source = LiveReply(), LiveSource(handle)
    lease_sent_at: float | None = None
    ending = asyncio.create_task(_ending(handle))
    asked: set[str] = set()
    prompts: list[asyncio.Task[None]] = []
    waiting_noted: str | None = None  # the line said while no worker answers
    try:
        while True:
            ended = ending.done()  # read before the snapshot, so the snapshot sees the end
            if not ended and (lease_sent_at is None or time.monotonic() - lease_sent_at > WATCH_RENEW_S):
                lease_sent_at = time.monotonic()
                await _renew_watch(handle)
            snapshot = await _snapshot(handle, reporter.next_step)
            if snapshot is not None:
                _show(snapshot, reporter, console, on_progress)
                if snapshot.status.state == "running" and not ending.done():
                    console.lines(await _live_lines(source, live, snapshot.status.step))
                for pending in snapshot.status.pending_approvals if approver else []:
                    if pending.call_id not in asked:
                        asked.add(pending.call_id)
                        prompts.append(asyncio.create_task(approver(pending)))
                if snapshot.status.result is not None:
                    return _report_end(console, snapshot.status.result, reporter.verbose)
            if ended:
                return _report_end(console, ending.result(), reporter.verbose)
            replaced = snapshot is None and on_no_worker is not None and await on_no_worker()
            if snapshot is None and not replaced:
                line = await _no_answer_line(handle)
                if line != waiting_noted:  # said once, and again only when the reason changes
                    waiting_noted = line
                    console.line(line)
            elif snapshot is not None and waiting_noted:
                waiting_noted = None
                console.line("a worker answers again")
            await asyncio.wait({ending}, timeout=POLL_S)
    finally:
        ending.cancel()
        source.close()
        for prompt in prompts:
            prompt.cancel()


async def _no_answer_line(handle: WorkflowHandle[object, AgentResult]) -> str:
    """Why no worker answers, as `status` says it: a worker that polls but whose workflow task
    fails (one lacking the run's encryption key) is named with its failure."""
    try:
        failing = await failing_task(handle)
    except RPCError:
        failing = None  # the server itself is away: no worker answers either
    if failing is not None:
        return f"the run makes no progress: its workflow task fails: {failing}"
    return (
        f"no worker answered within {QUERY_TIMEOUT.seconds} s: the run makes no progress until a worker "
        "polls its task queue (start one with `durable-agent worker`)"
    )


async def _renew_watch(handle: WorkflowHandle[object, AgentResult]) -> None:
    """Tell the run someone follows it, so its model calls send their reply as it comes."""
    try:
        await handle.signal("watch", WatchRequest(for_s=WATCH_LEASE_S))
    except RPCError:  # closed meanwhile: the result says so
        pass


async def _live_lines(source: LiveSource, live: LiveReply, step: int) -> list[str]:
    try:
        found = await source.reply()
    except (RPCError, CodecError):  # the live view is a nicety: the step's line comes either way
        return []
    return live.lines(step, *found) if found else []


def _show(snapshot: Snapshot, reporter: Reporter, console: Console, on_progress: ProgressHook | None) -> None:
    progress = on_progress or (lambda printed: None)
    finished = reporter.finished_steps(snapshot)
    for index, (step, line) in enumerate(finished):
        progress(step - 1)
        newest = index == len(finished) - 1
        console.line(reporter.with_usage(line, snapshot.status.usage) if newest else line)
    progress(reporter.next_step - 1)
    console.lines(reporter.state_lines(snapshot.status))


async def snapshot_status(handle: WorkflowHandle[object, AgentResult]) -> AgentStatus | None:
    """The `status` query, or None when no worker answers it."""
    try:
        return await handle.query("status", result_type=AgentStatus, rpc_timeout=QUERY_TIMEOUT)
    except (RPCError, WorkflowQueryFailedError):
        return None


async def _snapshot(handle: WorkflowHandle[object, AgentResult], from_step: int) -> Snapshot | None:
    status = await snapshot_status(handle)
    if status is None:
        return None
    try:
        messages = await handle.query(
            "transcript", TranscriptRequest(from_step=from_step), result_type=list[Message], rpc_timeout=QUERY_TIMEOUT
        )
    except (RPCError, WorkflowQueryFailedError):
        return None
    return Snapshot(status=status, messages=messages)


async def _ending(handle: WorkflowHandle[object, AgentResult]) -> AgentResult | str:
    """The run's result from history (no worker needed), or why it has none."""
    try:
        return await handle.result()
    except WorkflowFailureError as e:
        return failure_text(e)
    except RPCError as e:
        return f"lost contact with the Temporal server: {e.message}"


def failure_text(error: WorkflowFailureError) -> str:
    cause = error.cause
    message = getattr(cause, "message", "") or str(cause)
    if isinstance(cause, temporal_errors.TerminatedError):
        return f"terminated from Temporal (not by `resolve`): {message or 'no reason given'}"
    if isinstance(cause, temporal_errors.CancelledError):
        return f"cancelled: {message or 'no reason given'}"
    if isinstance(cause, temporal_errors.TimeoutError):
        return f"timed out in Temporal: {message}"
    return f"failed: {message}"


def _report_end(console: Console, outcome: AgentResult | str, verbose: bool) -> int:
    if isinstance(outcome, str):
        console.line(f"run ended: {outcome}")
        return EXIT_FAILED
    console.lines(render.result_lines(outcome, files=verbose))
    return EXIT_CODES[outcome.state]
