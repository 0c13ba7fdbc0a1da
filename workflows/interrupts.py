"""A command whose worker died under it: told to the model, run again, or a person's call
(input `commands.on_interrupt`). A part of `AgentWorkflow` (workflows/agent.py).

The command's next attempt finds its journal's start record without an outcome: it kills
what is left of the command and answers `interrupted`, with the output its last heartbeat
carried (activities/tools/command.py); it never runs the command a second time by itself.
Here the run decides what follows, from the input alone (deterministic): `tell_model` passes
the answer on; `rerun` runs a command that matches `commands.rerun_patterns` again, under a
new idempotency key, at most `MAX_RERUNS` times; `ask` makes the run need attention with the
command and its output so far, and `resolve retry` runs it again while `skip` passes the
answer on.
"""

from __future__ import annotations

import re
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.tool_specs import call_summary
    from workflows.types import ToolCall, ToolOutcome

MAX_RERUNS = 3
"""A command that keeps killing its worker is told to the model after this many reruns."""

ASK_ACTIONS = [
    "retry: run the command again (its first run may have partly happened: check its effects first)",
    "skip: do not run it again; the model is told it was interrupted, with its output so far",
    "terminate: finish the run now with a partial result",
]


class InterruptedCommands:
    async def _run_again(self, call: ToolCall, args: dict[str, Any], outcome: ToolOutcome, reruns: int) -> bool:
        """Whether an interrupted command runs again (`outcome.interrupted`); may ask a person."""
        settings = self._agent.commands
        if call.name != "run_command" or settings.on_interrupt == "tell_model":
            return False
        command = str(args.get("command", ""))
        if settings.on_interrupt == "rerun":
            safe = any(re.search(pattern, command) for pattern in settings.rerun_patterns)
            return safe and reruns < MAX_RERUNS
        seen = f"\n{outcome.output}" if outcome.output else ""
        resolution = await self._needs_attention(
            f"{self._carry.step}:{call.id}",
            what=f"{call_summary(call.name, args)} was interrupted: its worker died while it ran",
            error=f"{outcome.error}{seen}",
            attempts=1,
            actions=ASK_ACTIONS,
        )
        return resolution.action == "retry"


def rerun_note(outcome: ToolOutcome, reruns: int, asked: bool) -> ToolOutcome:
    """The final outcome of a command run again, saying so: its earlier run may have left effects."""
    why = "a person chose to run it again" if asked else "commands.on_interrupt is rerun"
    note = (
        f"[run {reruns + 1} times: the worker running it died before it finished ({why}); "
        "an earlier run may have partly happened]\n"
    )
    field = "output" if outcome.ok else "error"
    return outcome.model_copy(update={field: note + (getattr(outcome, field) or "")})
