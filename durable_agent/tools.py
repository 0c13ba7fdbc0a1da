"""The user's tools: `@tool` on a Python function, `tool_context()` inside it, and loading.

    from durable_agent import tool, tool_context

    @tool(effect="write", cost_usd=0.01)
    def refund(order_id: Annotated[str, Field(description="The order")], amount: float) -> str:
        "Refund an order."
        return payments.refund(order_id, amount, key=tool_context().idempotency_key)

The schema comes from the type hints, the description from the docstring. Each tool becomes
an activity named after it (activities/user_tools.py) on a task queue of its own, which the
workers that loaded it poll: a run whose tool no live worker offers waits for one.
Workers load tool modules from `DURABLE_AGENT_TOOLS` (comma-separated), `durable-agent worker
--tools MODULE` and the entry-point group `durable_agent.tools`.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from workflows.tool_catalog import BUILTIN_SPECS, ToolSpec
from workflows.types import Effect, check_tool_name

ENTRY_POINT_GROUP = "durable_agent.tools"
TOOLS_ENV = "DURABLE_AGENT_TOOLS"


def tool_queue(agent_queue: str, name: str) -> str:
    """The task queue of a user tool: only workers that loaded the tool poll it."""
    return f"{agent_queue}/tool/{name}"


@dataclass(frozen=True)
class Tool:
    """A decorated function: its spec (task_queue unset until a worker serves it), its
    argument model, the function."""

    spec: ToolSpec
    arguments: type[BaseModel]
    function: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The plain function: a tool stays callable (and testable) as it was written."""
        return self.function(*args, **kwargs)


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    effect: Effect = "read",
    approval: bool = False,
    timeout_s: float | None = None,
    retries: int | None = None,
    cost_usd: float = 0.0,
    cache_ttl_s: float | None = None,
    name: str | None = None,
    workspace: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    effect: Effect = "read",
    approval: bool = False,
    timeout_s: float | None = None,
    retries: int | None = None,
    cost_usd: float = 0.0,
    cache_ttl_s: float | None = None,
    name: str | None = None,
    workspace: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a sync or async function a tool the model may call (see docs/tools.md).
    `workspace=True`: it works on the run's files (`tool_context().workspace`), so a run pinned
    to a host calls it on that host (docs/scale.md)."""
    if cache_ttl_s is not None and effect != "read":
        raise ValueError("cache_ttl_s is for read tools: a cached write would report an effect that did not happen")
    if retries is not None and retries < 1:
        raise ValueError("retries counts attempts in all: at least 1")

    def make(fn: Callable[..., Any]) -> Tool:
        tool_name = check_tool_name(name or fn.__name__)
        arguments = argument_model(fn, tool_name)
        schema = arguments.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        spec = ToolSpec(
            name=tool_name,
            description=inspect.getdoc(fn) or tool_name,
            parameters=schema,
            effect=effect,
            approval=approval,
            timeout_s=timeout_s,
            retries=retries,
            cost_usd=cost_usd,
            cache_ttl_s=cache_ttl_s,
            source="python",
            workspace=workspace,
        )
        return Tool(spec=spec, arguments=arguments, function=fn)

    return make(function) if function is not None else make


def argument_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """A pydantic model of the function's parameters: a model's bad arguments are a tool error."""
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args and **kwargs have no schema; name each parameter")
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints.get(parameter.name, Any), default)
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


# --- inside a call -----------------------------------------------------------------


@dataclass
class ToolContext:
    """What a tool knows about its call (`tool_context()`)."""

    idempotency_key: str
    """Stable across retries and workers, unique per call: pass it to the service you call."""
    tool: str
    run_id: str
    """The run's workflow id."""
    step: int
    attempt: int
    previous_details: tuple[Any, ...] = ()
    """What the previous attempt last gave `heartbeat` (empty on the first attempt)."""
    workspace: str = ""
    """The run's workspace folder (on this host, for a tool declared `workspace=True`)."""
    _beat: Callable[..., None] = field(default=lambda *details: None, repr=False)

    def heartbeat(self, *details: Any) -> None:
        """Tell the server the call is alive, with progress for a retry to read. Safe from a
        sync tool's thread."""
        self._beat(*details)


_CURRENT: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("durable_agent_tool_context")


def tool_context() -> ToolContext:
    """The context of the tool call running now; only inside a tool."""
    try:
        return _CURRENT.get()
    except LookupError:
        raise RuntimeError("tool_context() is only available inside a tool call") from None


def enter_context(context: ToolContext) -> contextvars.Token[ToolContext]:
    return _CURRENT.set(context)


def leave_context(token: contextvars.Token[ToolContext]) -> None:
    _CURRENT.reset(token)


def thread_safe(beat: Callable[..., None]) -> Callable[..., None]:
    """`beat` callable from any thread: runs on the activity's event loop, in its context."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return lambda *details: loop.call_soon_threadsafe(beat, *details, context=context)


# --- loading -----------------------------------------------------------------------


class ToolLoadError(Exception):
    """A tool module could not be loaded; the message names it."""


def tools_in(module: object) -> list[Tool]:
    return [value for value in vars(module).values() if isinstance(value, Tool)]


def load_modules(names: Iterable[str]) -> list[Tool]:
    found: list[Tool] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as e:
            raise ToolLoadError(f"tool module {name!r} could not be imported: {type(e).__name__}: {e}") from e
        tools = tools_in(module)
        if not tools:
            raise ToolLoadError(f"tool module {name!r} defines no @tool function")
        found += tools
    return found


def configured_tools(modules: Iterable[str] = ()) -> list[Tool]:
    """The tools of `modules`, of `DURABLE_AGENT_TOOLS` and of the `durable_agent.tools` entry points."""
    names = [*modules, *(m.strip() for m in os.environ.get(TOOLS_ENV, "").split(",") if m.strip())]
    tools = load_modules(dict.fromkeys(names))
    for point in entry_points(group=ENTRY_POINT_GROUP):
        loaded = point.load()
        tools += tools_in(loaded) if inspect.ismodule(loaded) else [loaded]
    return unique(tools)


def unique(tools: Iterable[Tool]) -> list[Tool]:
    """One tool per name; a clash of two different functions (or with a built-in) is an error."""
    by_name: dict[str, Tool] = {}
    for t in tools:
        if t.name in BUILTIN_SPECS:
            raise ToolLoadError(f"tool {t.name!r} has the name of a built-in tool; give it another (name=...)")
        if t.name in by_name and by_name[t.name].function is not t.function:
            raise ToolLoadError(f"two tools are named {t.name!r}; give one another name (name=...)")
        by_name[t.name] = t
    return list(by_name.values())
