"""The durable shell of a run's commands (`shell: persistent`, the default).

Each `run_command` call carries the shell state the run's last command left (ShellState:
its working directory and exported variables), and its outcome records the state its
own command left; the run keeps the latest in its carry, so it survives continue-as-new, and
a new sandbox on any worker starts from it. `shell: fresh` calls carry none: each command
runs in a sandbox of its own (activities/tools/command.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.options import SHELL_PATCH
    from workflows.state import Carry
    from workflows.tool_specs import FRESH_RUN_COMMAND, function_schema
    from workflows.types import AgentInput, ShellState, ToolCallInput, ToolOutcome


Patched = Callable[[str], bool]
"""The workflow's `_patched`."""


def persistent(agent: AgentInput, patched: Patched) -> bool:
    return agent.shell == "persistent" and patched(SHELL_PATCH)


def with_shell(request: ToolCallInput, agent: AgentInput, carry: Carry, patched: Patched) -> ToolCallInput:
    """A run_command request, with the shell state to start from when the run's shell is persistent."""
    if not persistent(agent, patched):
        return request
    return request.model_copy(update={"shell": carry.shell or ShellState()})


def shell_schemas(tools: list[str], agent: AgentInput, patched: Patched) -> list[dict[str, Any]]:
    """run_command's schema where its description is not the built-in one: the model is told the shell is fresh."""
    if "run_command" not in tools or persistent(agent, patched):
        return []
    schema = function_schema("run_command")
    return [{**schema, "function": {**schema["function"], "description": FRESH_RUN_COMMAND}}]


def remember_shell(carry: Carry, outcome: ToolOutcome) -> None:
    if outcome.shell is not None:
        carry.shell = outcome.shell
