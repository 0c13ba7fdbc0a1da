"""MCP servers' tools as durable tools: their catalog, their calls and the sessions' close.

At a run's start `tool_catalog` (activities/user_tools.py) asks `catalog` for the tools of the
run's `mcp_servers`: one session per server is started for the run on this worker, its tool
list taken and made `ToolSpec`s, recorded in history with the rest of the catalog. Each
tool's effect comes from its annotations: `readOnlyHint` → read (retried),
`idempotentHint` → idempotent, otherwise write; a write is journaled (activities/journal.py)
and never run twice (activities/write_once.py): one interrupted by a crash is reported as of
unknown outcome. A
non-read-only tool is destructive unless it says `destructiveHint: false`, and a destructive
tool's calls wait for approval unless the server's `approve` says otherwise.

`mcp_call` runs a call in the run's session on this worker (activities/mcp_sessions.py):
heartbeating, with the server's progress notifications in the details; cancelled at the
server's `timeout_s` (the server is then stopped, the model told); a read call whose server
died is run again once on a new one, a write call whose server died during it is reported.
Results and errors are redacted and capped like every tool's, a large one saved by reference.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.calls_here import CALLS_HERE
from activities.dependency_outages import DependencyOutages, http_probe
from activities.heartbeat import heartbeating
from activities.mcp_config import McpConfig, McpServer, expanded, expanded_map
from activities.mcp_sessions import McpSession, McpUnavailable, SessionPool, import_mcp_sdk, reason_of
from activities.run_files import RunFileCaps, run_file_caps
from activities.tools.base import ToolCallContext, text_outcome
from activities.workspace import Workspace, WorkspaceError, workspace_roots
from activities.write_once import write_once
from durable_agent.dependencies import DependencyUnavailable, Probe
from workflows.tool_catalog import CatalogRequest, McpClose, ToolCatalog, ToolSpec
from workflows.types import TOOL_NAME, Effect, McpTarget, ToolCallInput, ToolOutcome

if TYPE_CHECKING:  # the SDK itself is imported with a session's start (activities/mcp_sessions.py)
    import mcp.types as mcp_types

PREFIX = "mcp__"
CALL_GRACE_S = 10.0
"""The call's activity outlives the server's `timeout_s` by this much, so that the call, not
Temporal, reports the timeout and stops the server."""
PING_TIMEOUT_S = 5.0
CONNECTION_CLOSED = -32000
"""The SDK's code for a request whose connection ended: the server died or closed its output."""
OUTCOME_UNKNOWN = (
    "the outcome is unknown: {what} during the call ({error}). The call may or may "
    "not have taken effect, and it was not run again; check its effect before repeating it"
)


def tool_name(server: str, tool: str) -> str:
    """`mcp__<server>__<tool>`, with what the OpenAI API refuses in a name made `_`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{PREFIX}{server}__{tool}")[:64]


def effect_of(annotations: mcp_types.ToolAnnotations | None) -> Effect:
    if annotations is not None and annotations.read_only_hint:
        return "read"
    if annotations is not None and annotations.idempotent_hint:
        return "idempotent"
    return "write"


def needs_approval(server: McpServer, tool: mcp_types.Tool) -> bool:
    if isinstance(server.approve, list):
        return tool.name in server.approve
    if server.approve != "destructive":
        return server.approve == "always"
    annotations = tool.annotations
    read_only = annotations is not None and bool(annotations.read_only_hint)
    # The spec's default: a tool that is not read-only is destructive unless it says it is not.
    return not read_only and (annotations is None or annotations.destructive_hint is not False)


def spec_of(name: str, server: McpServer, tool: mcp_types.Tool) -> ToolSpec:
    effect = effect_of(tool.annotations)
    parameters = {k: v for k, v in tool.input_schema.items() if k != "title"}
    return ToolSpec(
        name=tool_name(name, tool.name),
        description=tool.description or tool.title or tool.name,
        parameters=parameters,
        effect=effect,
        approval=needs_approval(server, tool),
        timeout_s=server.timeout_s + CALL_GRACE_S,
        activity="mcp_call",
        source="mcp",
        mcp=McpTarget(server=name, tool=tool.name, effect=effect),
    )


async def list_tools(session: McpSession) -> list[mcp_types.Tool]:
    import mcp.types as mcp_types

    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.client().list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def rendered(result: mcp_types.CallToolResult) -> str:
    """A result's content as text: text blocks as they are, anything else described."""
    import mcp.types as mcp_types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4:,} bytes, not shown]")
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True), ensure_ascii=False))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpActivities:
    """This worker's MCP servers: the catalog, `mcp_call` and `mcp_close`."""

    def __init__(
        self, config: McpConfig | None = None, roots: list[str] | None = None, caps: RunFileCaps | None = None
    ) -> None:
        self.config = config if config is not None else McpConfig.from_env()
        self.pool = SessionPool()
        self.dependencies = DependencyOutages()
        """Shared with the worker's Python tools (activities/user_tools.py): one gate per worker."""
        for name, server in self.config.servers.items():  # any worker can take over a run's wait
            if not server.stdio:
                self.dependencies.register(_dependency(name), _probe_of(server))
        self._roots = roots if roots is not None else workspace_roots()
        self._caps = caps if caps is not None else run_file_caps()

    def all(self) -> list[Callable[..., Any]]:
        return [self.call, self.close]

    async def warm_up(self) -> None:
        """With servers configured, the MCP SDK imported once the worker polls, not in its
        first call (a run's retry after its worker died, which a slow import would delay)."""
        if self.config.servers:
            await import_mcp_sdk()

    async def catalog(self, request: CatalogRequest) -> ToolCatalog:
        """The tools of the run's servers, each started for the run on this worker."""
        unknown = [name for name in request.mcp_servers if name not in self.config.servers]
        try:
            workspace = Workspace(request.workspace, self._roots).root  # resolved once, as the tools use it
        except WorkspaceError as e:
            raise ApplicationError(str(e), type="WorkspaceRefused", non_retryable=True) from None
        specs: list[ToolSpec] = []
        for name in request.mcp_servers:
            server = self.config.servers.get(name)
            if server is None:
                continue
            session = await self.pool.get(request.run_folder, name, server, workspace)
            for tool in await list_tools(session):
                spec = spec_of(name, server, tool)
                if TOOL_NAME.fullmatch(spec.name):
                    specs.append(spec)
        return ToolCatalog(tools=specs, unknown_servers=unknown)

    @activity.defn(name="mcp_close")
    async def close(self, request: McpClose) -> int:
        """At the run's close: its sessions on this worker end (others end when idle)."""
        return self.pool.close_run(request.run_folder)

    @activity.defn(name="mcp_call")
    async def call(self, input: ToolCallInput) -> ToolOutcome:
        target = input.mcp
        if target is None or target.server not in self.config.servers:
            server = target.server if target else "(none)"
            error = f"MCP server {server} is not configured on the worker that took the call"
            return ToolOutcome(ok=False, error=error)
        self.dependencies.check(_dependent(target.server))  # an HTTP server known down: not sent
        context = await asyncio.to_thread(ToolCallContext.open, input, self._roots, self._caps)
        if target.effect != "write":
            return await CALLS_HERE.outcome_of(input.idempotency_key, lambda: self._run(context, target))
        error = OUTCOME_UNKNOWN.format(what="its worker stopped", error="an earlier attempt did not report")
        return await write_once(
            context.journal,
            input.idempotency_key,
            {"mcp": target.model_dump()},
            lambda: self._run(context, target),
            unknown=ToolOutcome(ok=False, error=error),
        )

    async def _run(self, context: ToolCallContext, target: McpTarget) -> ToolOutcome:
        await import_mcp_sdk()
        from mcp.shared.exceptions import MCPError

        server = self.config.servers[target.server]
        run, workspace = context.input.run_folder, context.workspace.root
        progress: list[str] = []
        async with heartbeating(lambda: progress[-1] if progress else "running"):
            for attempt in (1, 2):
                try:
                    session = await self.pool.get(run, target.server, server, workspace)
                    if target.effect == "write":
                        session = await self._checked(session, run, workspace)
                    call = session.client().call_tool(
                        target.tool, context.input.arguments, progress_callback=_noted(progress)
                    )
                    result = await asyncio.wait_for(call, server.timeout_s)
                except McpUnavailable as e:
                    if not server.stdio and (down := await self._down(target.server, server, e)) is not None:
                        raise down from None
                    return ToolOutcome(ok=False, error=str(e))
                except TimeoutError:
                    await self.pool.discard(run, target.server)
                    return ToolOutcome(
                        ok=False,
                        error=f"{target.server}.{target.tool}: no answer within {server.timeout_s:g} s (the server's "
                        "timeout_s); the call was cancelled and the server stopped (the next call starts it again)",
                    )
                except MCPError as e:
                    if e.code != CONNECTION_CLOSED:
                        return ToolOutcome(ok=False, error=f"{target.server}.{target.tool}: {e}")
                    await self.pool.discard(run, target.server)
                    if target.effect == "write":
                        stopped = f"the MCP server {target.server} stopped"
                        return ToolOutcome(ok=False, error=OUTCOME_UNKNOWN.format(what=stopped, error=e))
                    if attempt == 2:
                        return ToolOutcome(ok=False, error=f"MCP server {target.server} stopped twice during the call")
                    activity.logger.info("MCP server %s died during a read call: run again on a new one", target.server)
                    continue
                return await asyncio.to_thread(_outcome, context, result)
        raise AssertionError("unreachable: the second attempt returns")

    async def _down(self, name: str, server: McpServer, error: McpUnavailable) -> ApplicationError | None:
        """An HTTP server that could not be reached (the call was never sent): `DependencyDown`
        when the worker's probe finds it down, so that the run waits for it
        (activities/dependency_outages.py); None when it answers (the error is the call's).
        The probe is a function, not the URL: a URL may hold the worker's secrets."""
        unavailable = DependencyUnavailable(_dependency(name), probe=_probe_of(server), message=str(error))
        return await self.dependencies.confirm(_dependent(name), unavailable)

    async def _checked(self, session: McpSession, run: str, workspace: str) -> McpSession:
        """Before a write: a server that died since its last call is started again now, so a
        call that finds it dead was never sent and is not reported as of unknown outcome."""
        from mcp.shared.exceptions import MCPError

        try:
            await asyncio.wait_for(session.client().send_ping(), PING_TIMEOUT_S)
            return session
        except (MCPError, TimeoutError) as e:
            activity.logger.info("MCP server %s did not answer a ping (%s): started again", session.name, reason_of(e))
            await self.pool.discard(run, session.name)
            return await self.pool.get(run, session.name, session.server, workspace)


def _dependency(server: str) -> str:
    """The dependency's name, as the run's status shows it."""
    return f"MCP server {server}"


def _probe_of(server: McpServer) -> Probe:
    return functools.partial(http_probe, expanded(server.url or ""), expanded_map(server.headers))


def _dependent(server: str) -> str:
    """The key a server's calls go by in the dependency gate: one for all its tools."""
    return f"{PREFIX}{server}"


def _noted(progress: list[str]) -> Callable[..., Any]:
    async def note(done: float, total: float | None, message: str | None) -> None:
        progress.append(" ".join(filter(None, [f"{done:g}" + (f"/{total:g}" if total else ""), message])))
        del progress[:-1]

    return note


def _outcome(context: ToolCallContext, result: mcp_types.CallToolResult) -> ToolOutcome:
    """Capped and redacted like every tool's, a large result saved by reference."""
    outcome = text_outcome(context, rendered(result))
    if not result.is_error:
        return outcome
    return outcome.model_copy(update={"ok": False, "output": "", "error": outcome.output})
