"""The user's Python tools as activities, and the catalog a run records at its start.

Each tool is an activity named after it, taking `ToolCallInput` and returning `ToolOutcome`
like the built-in tools, on the tool's own task queue (durable_agent/tools.py). What the
tool returns or raises is capped and redacted; how a failure is handled depends on its
effect:
* `read` and `idempotent`: an exception is retried (with the same idempotency key) until the
  last attempt, whose exception is a tool error for the model; a read tool with
  `cache_ttl_s` then answers with its last good result for the same arguments, marked;
* `write`: journaled like `run_command` (activities/journal.py, keyed by the call's idempotency
  key, in the run's step folder of the workspace): a start record, on disk before the tool
  acts, and its outcome once it returns or raises. An exception is a tool error at once. A
  worker that dies mid-call is retried, and the retry acts on the journal, never on the tool:
  the recorded outcome of a call that finished before its worker died, or "the outcome is
  unknown" for one that began and never finished (unless it is still running in the retry's
  own worker: activities/write_once.py). A worker that cannot reach the run's
  workspace runs a write tool on its first attempt only, and says "unknown" on a retry.
Bad arguments are a tool error, never retried.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.calls_here import CALLS_HERE
from activities.dependency_outages import DependencyOutages
from activities.heartbeat import heartbeating
from activities.journal import Journal, JournalUnsafe
from activities.mcp_tools import McpActivities
from activities.redaction import worker_redactor
from activities.run_files import HostileLayout, run_file_caps
from activities.tools.base import ToolCallContext
from activities.workspace import WorkspaceError, workspace_roots
from activities.write_once import write_once
from durable_agent.dependencies import DependencyUnavailable
from durable_agent.metrics import record_tool_cost
from durable_agent.tools import Tool, ToolContext, enter_context, leave_context, thread_safe, tool_queue
from workflows.hosts import host_queue
from workflows.tool_catalog import CatalogRequest, LocalToolCall, ToolCatalog
from workflows.types import ToolCallInput, ToolOutcome

DEFAULT_ATTEMPTS = 3
WRITE_UNKNOWN = (
    "the outcome is unknown: the worker running {tool} stopped before it reported (an earlier attempt "
    "began and never finished). The call may or may not have taken effect, and it was not run again; "
    "check its effect before repeating it"
)
CACHE_ENTRIES = 1_000
"""Cached results a worker keeps per tool, the least recently used dropped first."""


class ResultCache:
    """A read tool's last good results by arguments, redacted, on this worker only."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def put(self, key: str, output: str) -> None:
        self._entries[key] = (time.time(), output)
        self._entries.move_to_end(key)
        while len(self._entries) > CACHE_ENTRIES:
            self._entries.popitem(last=False)

    def get(self, key: str) -> tuple[float, str] | None:
        entry = self._entries.get(key)
        if entry is None or time.time() - entry[0] > self.ttl_s:
            return None
        return entry


class UserToolActivities:
    """The activities of the tools a worker loaded, and `tool_catalog`."""

    def __init__(self, tools: list[Tool], agent_queue: str, mcp: McpActivities | None = None) -> None:
        self.tools = {t.name: t for t in tools}
        self.agent_queue = agent_queue
        self.mcp = mcp
        self._caches = {t.name: ResultCache(t.spec.cache_ttl_s) for t in tools if t.spec.cache_ttl_s}
        self.dependencies = mcp.dependencies if mcp is not None else DependencyOutages()

    def queues(self, host: str | None = None) -> dict[str, list[Callable[..., Any]]]:
        """Each tool's activity, by the task queue it is served on; with this machine's `host`,
        the workspace-bound ones on that host's queue of the tool too (workflows/hosts.py)."""
        wait = self.dependencies.wait_for_dependency  # a run waits for a tool's dependency on its queue
        queues = {tool_queue(self.agent_queue, name): [self._activity(t), wait] for name, t in self.tools.items()}
        if host is not None:
            bound = [t for t in self.tools.values() if t.spec.workspace]
            queues.update({host_queue(tool_queue(self.agent_queue, t.name), host): [self._activity(t)] for t in bound})
        return queues

    @activity.defn(name="tool_catalog")
    async def tool_catalog(self, request: CatalogRequest) -> ToolCatalog:
        """At a run's start: the specs of the tools it names beyond the built-ins, as this worker
        knows them, each routed to its tool's task queue, and the tools of the run's MCP servers
        (activities/mcp_tools.py). Recorded once in history."""
        known = [self.tools[n].spec for n in request.names if n in self.tools]
        servers = ToolCatalog(unknown_servers=request.mcp_servers)
        if request.mcp_servers and self.mcp is not None:
            servers = await self.mcp.catalog(request)
        return ToolCatalog(
            tools=[s.model_copy(update={"task_queue": tool_queue(self.agent_queue, s.name)}) for s in known]
            + servers.tools,
            unknown=[n for n in request.names if n not in self.tools],
            unknown_servers=servers.unknown_servers,
        )

    @activity.defn(name="run_tool_here")
    async def run_tool_here(self, request: LocalToolCall) -> ToolOutcome:
        """A short tool's call as a local activity of the run's worker (workflows/tool_steps.py).
        Every agent worker has this activity, so any can replay a run; one without the tool
        says so, and the run sends the call to the tool's own queue."""
        tool = self.tools.get(request.tool)
        if tool is None:
            raise ApplicationError(f"no tool {request.tool} on this worker", type="NotFoundError", non_retryable=True)
        return await self.call(tool, request.call)

    def _activity(self, tool: Tool) -> Callable[..., Any]:
        async def run(input: ToolCallInput) -> ToolOutcome:
            return await self.call(tool, input)

        run.__name__ = f"tool_{tool.name}"
        return activity.defn(name=tool.name)(run)

    async def call(self, tool: Tool, input: ToolCallInput) -> ToolOutcome:
        try:
            args = tool.arguments.model_validate(input.arguments)
        except ValidationError as e:
            return ToolOutcome(ok=False, error=f"bad arguments for {tool.name}: {_problems(e)}")
        self.dependencies.check(tool.name)  # before the journal: a call that fails here never began
        if tool.spec.effect == "write":
            return await self._journaled(tool, input, args)
        return await CALLS_HERE.outcome_of(input.idempotency_key, lambda: self._run(tool, input, args))

    async def _journaled(self, tool: Tool, input: ToolCallInput, args: BaseModel) -> ToolOutcome:
        """A write tool's call, at most once per idempotency key, whatever the retries."""
        key = input.idempotency_key
        unknown = ToolOutcome(ok=False, error=WRITE_UNKNOWN.format(tool=tool.name))
        try:
            journal = await asyncio.to_thread(_journal, input)
        except (WorkspaceError, JournalUnsafe, HostileLayout, OSError):
            # No journal here: the first attempt runs; a retry cannot know how far one went.
            return await self._run(tool, input, args) if activity.info().attempt == 1 else unknown
        return await write_once(journal, key, {"tool": tool.name}, lambda: self._run(tool, input, args), unknown)

    async def _run(self, tool: Tool, input: ToolCallInput, args: BaseModel) -> ToolOutcome:
        info = activity.info()
        # The tool's latest heartbeat details (at first, the previous attempt's): the worker's
        # own beats resend them, so a retry reads the tool's last checkpoint, not an empty beat.
        latest = [tuple(info.heartbeat_details)]

        def beat(*details: Any) -> None:
            latest[0] = details
            if not activity.info().is_local:  # a local activity has no heartbeat: its workflow task is its beat
                activity.heartbeat(*details)

        context = ToolContext(
            idempotency_key=input.idempotency_key,
            tool=tool.name,
            run_id=info.workflow_id or "",
            step=input.step,
            attempt=info.attempt,
            previous_details=latest[0],
            workspace=input.workspace,
            _beat=thread_safe(beat),
        )
        token = enter_context(context)
        try:
            async with heartbeating(progress=lambda: latest[0]):
                value = await _invoke(tool, args)
        except DependencyUnavailable as e:
            down = await self.dependencies.confirm(tool.name, e)
            if down is not None:
                raise down from None
            return self._failed(tool, input, e)
        except Exception as e:
            return self._failed(tool, input, e)
        finally:
            leave_context(token)
        if tool.spec.cost_usd:
            record_tool_cost(tool.name, tool.spec.cost_usd)
        # Redacted here as well as by the worker's interceptor: the cache keeps this text.
        outcome = capped(render(value), input.output_chars)
        if (cache := self._caches.get(tool.name)) is not None:
            cache.put(_cache_key(input), outcome.output)
        return outcome

    def _failed(self, tool: Tool, input: ToolCallInput, error: Exception) -> ToolOutcome:
        """A raised exception: retried while attempts remain (not for a write tool), then a tool
        error, or a read tool's cached answer."""
        info = activity.info()
        attempts = info.retry_policy.maximum_attempts if info.retry_policy else 1
        if tool.spec.effect != "write" and info.attempt < attempts:
            raise error
        message = worker_redactor().text(f"{tool.name} raised {type(error).__name__}: {error}")
        cache = self._caches.get(tool.name)
        cached = cache.get(_cache_key(input)) if cache is not None else None
        if cached is None:
            return ToolOutcome(ok=False, error=message)
        fetched = datetime.fromtimestamp(cached[0], UTC).isoformat(timespec="seconds")
        activity.logger.warning("%s: answered from its cache of %s (%s)", tool.name, fetched, message)
        return ToolOutcome(
            ok=True,
            output=f"[cached result from {fetched}: may be inaccurate]\n{cached[1]}",
            cached_from=fetched,
        )


def _journal(input: ToolCallInput) -> Journal:
    """The run's journal for this step, as the built-in tools open it (the workspace checked)."""
    return ToolCallContext.open(input, workspace_roots(), run_file_caps()).journal


@activity.defn(name="redact_tool_outcome")
async def redact_tool_outcome(outcome: ToolOutcome) -> ToolOutcome:
    """An activity tool's answer, capped by the workflow, redacted of this worker's secret
    values before the run records it: the other team's worker that sent it knows none of them."""
    return worker_redactor().value(outcome)


async def _invoke(tool: Tool, args: BaseModel) -> Any:
    kwargs = {name: getattr(args, name) for name in type(args).model_fields}
    if asyncio.iscoroutinefunction(tool.function):
        return await tool.function(**kwargs)
    # A sync tool runs on a thread, in the call's context (tool_context() works there).
    return await asyncio.to_thread(tool.function, **kwargs)


def render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


def capped(text: str, budget_chars: int) -> ToolOutcome:
    """Redacted, and its head and tail when longer than the run's tool output budget."""
    text = worker_redactor().text(text)
    size = len(text.encode())
    if len(text) > budget_chars:
        keep = max(budget_chars // 2, 32)
        text = f"{text[:keep]}\n… {len(text):,} characters total, {len(text) - 2 * keep:,} cut …\n{text[-keep:]}"
    return ToolOutcome(ok=True, output=text or "(no output)", output_bytes=size)


def _cache_key(input: ToolCallInput) -> str:
    return json.dumps(input.arguments, sort_keys=True, ensure_ascii=False)


def _problems(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in error.errors())
