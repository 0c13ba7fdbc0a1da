"""MCP sessions: one per run per worker, each started where its configuration says.

A session is keyed by (run chain, server): the stdio process (or HTTP session) that listed the
server's tools at the run's start serves every later call of that run on this worker, and
is closed at the run's close (`mcp_close`), after `IDLE_S` without a call, or when a call
finds it dead or hung (the next call starts it again). `SessionPool.starts` counts the
starts, and each is logged.

A stdio server runs by default in the command sandbox (activities/tools/sandbox.py, its
functions reused as they are): the run's workspace as its working directory, read-write;
system folders read-only; the worker's Python environment (`sys.prefix`, the base
interpreter's prefix) and any file its `command` and `args` name by absolute path, read-only,
so a Python server installed with the worker, or a script the operator names, runs; no network
unless `network`; no environment but the configuration's `env`, a PATH (the worker's
environment's `bin`, then the system's) and the sandbox's HOME.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import shlex
import sys
import time
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from activities.home import refuse_workspace_holding_worker_state
from activities.mcp_config import McpServer, expanded, expanded_map
from activities.tools.sandbox import (
    COMMAND_PATH,
    SANDBOX_HOME,
    WORKSPACE_FD,
    CommandLimits,
    SandboxUnavailable,
    bwrap_argv,
    bwrap_binary,
    launcher_argv,
    opened_workspace,
    refusal,
    unsandboxed_allowed,
    workspace_source,
)
from activities.tools.seccomp import filter_file
from activities.workspace import WorkspaceRefused

# The MCP SDK is imported when a session starts, not with this module: it is most of the
# import time of every `durable-agent` command and of a worker's start (~1 s of CPU), and
# only runs with MCP servers use it.
if TYPE_CHECKING:
    import anyio
    from mcp import ClientSession, StdioServerParameters

logger = logging.getLogger(__name__)

MCP_SDK_MODULES = (
    "mcp",
    "mcp.client.stdio",
    "mcp.client.streamable_http",
    "mcp.shared._httpx_utils",
    "mcp.shared.exceptions",
    "mcp.types",
)
"""What this worker uses of the MCP SDK."""
_mcp_sdk_imported = False


async def import_mcp_sdk() -> None:
    """The MCP SDK imported, off the event loop: the import takes ~1.2 s of CPU (more on a
    loaded machine), which on the loop would starve every heartbeat of the worker, and a new
    worker's first call (a retry after a crash) would time out. Every path to the SDK awaits
    this first: an import on the loop would wait there for the thread's import lock."""
    global _mcp_sdk_imported
    if not _mcp_sdk_imported:
        await asyncio.to_thread(lambda: [importlib.import_module(name) for name in MCP_SDK_MODULES])
        _mcp_sdk_imported = True


IDLE_S = 600.0
"""A session without a call for this long is closed (a run whose close never reached this worker)."""
START_TIMEOUT_S = 60.0
"""Start and handshake of a server: a sandboxed Python server imports `mcp` first (~1 s idle)."""
SERVER_LIMITS = CommandLimits(cpu_s=24 * 3600)
"""A command's limits, but CPU time for a server living as long as its run."""


CLOSE_WAIT_S = 15.0
"""How long a close waits for its server to end (the SDK's shutdown takes at most ~6 s)."""
_SERVING: set[asyncio.Task[None]] = set()
"""Every session's task until it ends: the event loop keeps only weak references to tasks."""


class McpUnavailable(Exception):
    """The server could not be started or reached; the message says which and why."""


def stdio_parameters(server: McpServer, workspace: str) -> tuple[StdioServerParameters, int | None]:
    """How to start a stdio server: in the sandbox unless `sandbox: false` (or the operator's
    `DURABLE_AGENT_UNSANDBOXED_COMMANDS` consent where no sandbox can start); with the
    descriptor of the workspace the sandbox binds, which the caller closes once the server ends."""
    from mcp import StdioServerParameters

    assert server.command is not None
    command = expanded(server.command)
    args = [expanded(a) for a in server.args]
    env = {"PATH": f"{sys.prefix}/bin:{COMMAND_PATH}", **expanded_map(server.env)}
    if not server.sandbox:
        return _plain(command, args, env, server.cwd or workspace), None
    try:
        bwrap = bwrap_binary()
        workspace_fd = opened_workspace(workspace)
    except SandboxUnavailable as e:
        if not unsandboxed_allowed():
            raise McpUnavailable(refusal(e).replace("run_command", "the MCP server")) from None
        return _plain(command, args, env, workspace), None
    env.setdefault("HOME", SANDBOX_HOME)
    argv = bwrap_argv(bwrap, workspace, server.network, WORKSPACE_FD)
    split = argv.index("--")
    argv[split:split] = [arg for path in visible_paths([command, *args]) for arg in ("--ro-bind", path, path)]
    sandboxed = [*argv, _only(env), "mcp-server", command, *args]
    full = launcher_argv(SERVER_LIMITS, [], sandboxed, filter_file(), workspace_source(workspace_fd))
    return StdioServerParameters(command=full[0], args=full[1:], env=env, cwd=workspace), workspace_fd


def _plain(command: str, args: list[str], env: dict[str, str], cwd: str) -> StdioServerParameters:
    """Unsandboxed: the worker's view of the machine, but still only the configured env."""
    from mcp import StdioServerParameters

    argv = ["-c", _only(env), "mcp-server", command, *args]
    return StdioServerParameters(command="bash", args=argv, env=env, cwd=cwd)


def _only(env: dict[str, str]) -> str:
    """A shell script that runs its arguments with `env` alone: the SDK adds some of the
    worker's variables (USER, SHELL, ...), which go before the server runs."""
    from mcp.client.stdio import get_default_environment

    leaked = sorted(set(get_default_environment()) - set(env))
    return f'unset {shlex.join(leaked)}; exec "$@"' if leaked else 'exec "$@"'


def visible_paths(words: list[str]) -> list[str]:
    """Read-only in the sandbox: the worker's Python environment, and the files the server's
    command line names by absolute path (a folder named there is not: it could hide the workspace)."""
    paths: list[str] = []
    for path in [sys.prefix, sys.base_prefix, *(w for w in words if os.path.isabs(w) and os.path.isfile(w))]:
        path = os.path.normpath(path)
        # One under another is visible already, and bubblewrap cannot mount on a read-only folder.
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in [*paths, "/usr"]):
            paths.append(path)
    return paths


class McpSession:
    """One connection to one server, owned by a task of its own: the SDK's transports must be
    entered and left in one task, and calls come from many activities."""

    def __init__(self, name: str, server: McpServer, workspace: str) -> None:
        self.name = name
        self.server = server
        self.workspace = workspace
        self.session: ClientSession | None = None
        self.last_used = time.monotonic()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._handshake: anyio.CancelScope | None = None

    async def open(self) -> None:
        await import_mcp_sdk()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, if this caller left
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp-{self.name}")
        _SERVING.add(self._task)
        self._task.add_done_callback(_SERVING.discard)
        try:
            await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT_S)
        except BaseException as e:
            await self.close()  # a start that fails, times out or is cancelled leaves no server behind
            if isinstance(e, TimeoutError):
                raise McpUnavailable(f"MCP server {self.name} did not answer within {START_TIMEOUT_S:g} s") from None
            raise

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """The session's life. It is never cancelled as a task: a cancel during the spawn kills
        only the outer bubblewrap and leaves the sandbox inside it running, and a second cancel
        aborts the SDK's shutdown (its shields hold against anyio's cancellation, not asyncio's).
        A stop is `_stop`, seen once connected, and interrupts the handshake through its scope."""
        import anyio  # with the SDK, which is imported by now

        try:
            async with self._connected() as session:
                with anyio.CancelScope() as self._handshake:
                    if not self._stop.is_set():
                        await session.initialize()
                if not self._stop.is_set():
                    self.session = session
                    ready.set_result(None)
                    await self._stop.wait()
        except Exception as e:  # noqa: BLE001 - any failure to start is the server's, told whole
            if not ready.done():
                where = " (its stderr is in the worker's)" if self.server.stdio else ""
                ready.set_exception(McpUnavailable(f"MCP server {self.name} could not start: {reason_of(e)}{where}"))
            else:
                logger.info("MCP server %s ended: %s", self.name, reason_of(e))
        finally:
            self.session = None
            self._handshake = None
            if not ready.done():
                ready.set_exception(McpUnavailable(f"MCP server {self.name} was stopped while starting"))

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[ClientSession]:
        from mcp import ClientSession, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        async with contextlib.AsyncExitStack() as stack:
            if self.server.stdio:
                # Off the loop: it may look for bubblewrap and compile the seccomp filter.
                params, workspace_fd = await asyncio.to_thread(stdio_parameters, self.server, self.workspace)
                if workspace_fd is not None:
                    stack.callback(os.close, workspace_fd)
                read, write = await stack.enter_async_context(stdio_client(params))
            else:
                assert self.server.url is not None
                headers = expanded_map(self.server.headers)
                http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
                read, write = await stack.enter_async_context(
                    streamable_http_client(expanded(self.server.url), http_client=http)
                )
            yield await stack.enter_async_context(ClientSession(read, write))

    def alive(self) -> bool:
        return self.session is not None and self._task is not None and not self._task.done()

    async def close(self) -> None:
        """Stops the server and waits for its end (the SDK's shutdown: stdin closed, a grace,
        then the process tree killed), at most CLOSE_WAIT_S. A cancel of the caller cuts the
        wait short, never the stop."""
        self._stop.set()
        if self._handshake is not None:
            self._handshake.cancel()
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task}, timeout=CLOSE_WAIT_S)

    def client(self) -> ClientSession:
        if self.session is None:
            raise McpUnavailable(f"MCP server {self.name} is not running")
        self.last_used = time.monotonic()
        return self.session


class SessionPool:
    """This worker's sessions by (run chain, server)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.starts = 0
        self._sessions: dict[tuple[str, str], McpSession] = {}
        self._starting: dict[tuple[str, str], asyncio.Task[McpSession]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._stopped_because: weakref.WeakKeyDictionary[asyncio.Task[McpSession], str] = weakref.WeakKeyDictionary()
        """Why a start was stopped, for its callers: the first stop's reason."""

    async def get(self, run: str, name: str, server: McpServer, workspace: str) -> McpSession:
        """The run's live session with the server, started (again) if there is none.

        The start belongs to the pool, not to the caller: an activity cancelled while its server
        starts (its run left the worker's cache when a workflow task failed, which cancels the
        run's local activities) leaves the start going, and the attempt that follows takes that
        session, so the server still starts once."""
        key = (run, name)
        session = self._sessions.get(key)
        if session is not None and session.alive():
            return session
        starting = self._starting.get(key)
        if starting is None:
            starting = self._starting[key] = asyncio.create_task(self._start(key, server, workspace))
            starting.add_done_callback(lambda task: self._started(key, task))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            if starting.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                why = self._stopped_because.get(starting, "stopped")
                raise McpUnavailable(f"MCP server {name} was stopped while starting: {why}") from None
            raise

    async def _start(self, key: tuple[str, str], server: McpServer, workspace: str) -> McpSession:
        try:
            # As before each command: the server's sandbox binds the workspace read-write.
            refuse_workspace_holding_worker_state(workspace)
        except WorkspaceRefused as e:
            raise McpUnavailable(f"MCP server {key[1]} not started: {e}") from None
        stale = self._sessions.pop(key, None)
        if stale is not None:
            await stale.close()
        session = McpSession(key[1], server, workspace)
        await session.open()
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            # Stopped as the handshake ended: 3.11's `wait_for` returned the result and kept the cancel.
            await session.close()
            raise asyncio.CancelledError
        self._sessions[key] = session
        self.starts += 1
        logger.info("MCP server %s started for run %s (%d starts on this worker)", key[1], key[0], self.starts)
        self._reap_later()
        return session

    def _started(self, key: tuple[str, str], task: asyncio.Task[McpSession]) -> None:
        if self._starting.get(key) is task:
            del self._starting[key]
        if not task.cancelled():
            task.exception()  # retrieved here: its callers may all have been cancelled

    async def discard(self, run: str, name: str) -> None:
        """A dead or hung session goes; the run's next call starts a new one."""
        session = self._sessions.pop((run, name), None)
        if session is not None:
            await session.close()

    def close_run(self, run: str) -> int:
        """The run's sessions stop in the background: a server's shutdown (its stdin closed, a
        wait for its exit) takes a second or two, which the run's close need not wait for.
        A server still starting for the run (for an attempt cancelled meanwhile) is stopped too."""
        for key, starting in list(self._starting.items()):
            if key[0] == run:
                self._stop_start(starting, "its run closed")
        names = [name for (r, name) in self._sessions if r == run]
        for name in names:
            task = asyncio.create_task(self.discard(run, name))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return len(names)

    async def close_all(self) -> None:
        starting = list(self._starting.values())
        for task in starting:
            self._stop_start(task, "its worker is stopping")
        await asyncio.gather(*starting, return_exceptions=True)
        for run, name in list(self._sessions):
            await self.discard(run, name)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _stop_start(self, starting: asyncio.Task[McpSession], why: str) -> None:
        self._stopped_because.setdefault(starting, why)
        starting.cancel()

    def _reap_later(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())

    async def _reap(self) -> None:
        while self._sessions:
            await asyncio.sleep(min(self.idle_s / 4, 30.0))
            now = time.monotonic()
            for key, session in list(self._sessions.items()):
                if now - session.last_used > self.idle_s:
                    logger.info("MCP server %s of run %s closed after %g s idle", key[1], key[0], self.idle_s)
                    await self.discard(*key)


def reason_of(error: BaseException) -> str:
    """The first leaf of an exception group (anyio's task groups wrap what they raise)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
