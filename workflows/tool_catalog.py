"""One registry for every tool a run may use: what each is, how it runs, what it costs.

A `ToolSpec` is all the workflow needs to offer a tool to the model and to call it: its
OpenAI schema, its effect (how a crash or a failure is handled), its approval, timeout,
retries, price, cache and the activity (type and task queue) that runs it. The nine
built-in tools are specs like any other (`BUILTIN_SPECS`); the user's Python tools
(durable_agent/tools.py), `activity_tools` and the tools of the run's MCP servers
(activities/mcp_tools.py) become specs the same way. A run that names
tools beyond the built-ins records its catalog once, at its start (an activity result), so a
later change of a tool's code or schema cannot change a replay.

Pure and deterministic: imported by the workflow.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from workflows.tool_specs import TOOL_ARGS, TOOL_DESCRIPTIONS, function_schema
from workflows.types import ActivityTool, Effect, McpTarget, ToolCallInput

WRITE_BUILTINS = frozenset({"write_file", "edit_file", "run_command"})
"""Built-in tools with side effects; their own journal (activities/journal.py) keeps them exactly once."""


class ToolSpec(BaseModel):
    """One tool as the workflow sees it. Recorded in history (the catalog): fields are only added."""

    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect = "read"
    approval: bool = False
    timeout_s: float | None = None
    """Per attempt; None: the built-in tool's own timeout, 120 s for the others."""
    retries: int | None = None
    """Attempts in all for a read or idempotent tool; None: the default (3)."""
    cost_usd: float = 0.0
    cache_ttl_s: float | None = None
    task_queue: str | None = None
    """None: the run's own task queue (the built-in tools)."""
    activity: str | None = None
    """The activity type; None: the tool's name."""
    source: Literal["builtin", "python", "activity", "mcp"] = "builtin"
    mcp: McpTarget | None = None
    """An MCP tool: its server and its name there."""
    workspace: bool = False
    """A user's tool declared workspace-bound: a run pinned to a host calls it on the host's
    queue of the tool (workflows/hosts.py)."""

    @classmethod
    def of_activity(cls, tool: ActivityTool) -> ToolSpec:
        return cls(**tool.model_dump(), source="activity")

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def activity_type(self) -> str:
        return self.activity or self.name


class ToolCatalog(BaseModel):
    """What a run's start resolved: the specs of its tools beyond the built-ins, and the names
    no worker offers (the run then closes at its start, naming them)."""

    tools: list[ToolSpec] = Field(default_factory=list)
    unknown: list[str] = Field(default_factory=list)
    unknown_servers: list[str] = Field(default_factory=list)
    """MCP servers the run names that the worker's configuration lacks."""


class LocalToolCall(BaseModel):
    """Input of `run_tool_here`: a Python tool's call, run by the worker running the run."""

    tool: str
    call: ToolCallInput


class CatalogRequest(BaseModel):
    """Input of `tool_catalog`: the names to resolve (built-ins excluded), and the MCP servers
    whose tools to list, with the run's workspace and chain folder (where and for whom the
    servers' sessions start)."""

    names: list[str]
    mcp_servers: list[str] = Field(default_factory=list)
    workspace: str = ""
    run_folder: str = ""


class McpClose(BaseModel):
    """Input of `mcp_close`: the run chain whose MCP sessions on the worker close."""

    run_folder: str


def _builtin(name: str) -> ToolSpec:
    function = function_schema(name)["function"]
    return ToolSpec(
        name=name,
        description=function["description"],
        parameters=function["parameters"],
        effect="write" if name in WRITE_BUILTINS else "read",
    )


BUILTIN_SPECS: dict[str, ToolSpec] = {name: _builtin(name) for name in TOOL_ARGS}
if set(BUILTIN_SPECS) != set(TOOL_DESCRIPTIONS):
    raise RuntimeError("every built-in tool needs an argument model and a description")
