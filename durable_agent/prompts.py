"""Approval prompts inline, for `durable-agent run` attached to a terminal."""

from __future__ import annotations

import asyncio
import sys

from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from durable_agent.console import Console
from durable_agent.follow import Approver
from workflows.approval import shown_below
from workflows.types import AgentResult, ApprovalDecision, PendingApproval
from workflows.visible import visible


def terminal_approver(handle: WorkflowHandle[object, AgentResult], console: Console) -> Approver | None:
    """Asks at the terminal for each pending call, one at a time; None when stdin is no terminal."""
    if not sys.stdin.isatty():
        return None
    one_at_a_time = asyncio.Lock()

    async def ask(pending: PendingApproval) -> None:
        async with one_at_a_time:
            shown = "".join(f"\n    {line}" for line in pending.shown.split("\n")) if shown_below(pending) else ""
            what = f"{pending.summary}?{shown}\n" if shown else f"{pending.summary}? "
            prompt = f"approve {what}[y]es / [n]o / or type why not: "
            answer = (await asyncio.to_thread(_read_line, prompt)).strip()
            decision = parse_answer(pending.call_id, answer)
            try:
                await handle.execute_update("approve", decision)
            except WorkflowUpdateFailedError as e:
                console.line(f"not applied ({e.cause}); it may have been decided elsewhere")
                return
            console.line(f"{pending.call_id} {'approved' if decision.approved else 'denied'}")

    return ask


def parse_answer(call_id: str, answer: str) -> ApprovalDecision:
    lowered = answer.lower()
    if lowered in ("y", "yes"):
        return ApprovalDecision(call_id=call_id, approved=True)
    note = None if lowered in ("", "n", "no") else answer
    return ApprovalDecision(call_id=call_id, approved=False, note=note or "denied at the terminal")


def _read_line(prompt: str) -> str:
    sys.stdout.write(visible(prompt))
    sys.stdout.flush()
    return sys.stdin.readline()
