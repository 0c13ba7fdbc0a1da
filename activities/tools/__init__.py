"""The tool activities: every file and shell operation the model can ask for.

One activity per tool, named after it, taking `ToolCallInput` and returning `ToolOutcome`.

Errors are sorted three ways:
* what the model can act on (bad arguments, a path outside the workspace, a missing or
  binary file, an ambiguous edit, a timeout) comes back as `ToolOutcome(ok=False)`, and
  the run goes on. When `ok` is False, `error` is the whole message for the model,
  partial output included, and `output` is empty;
* what a retry may cure (EIO, ENOSPC, EMFILE, ...) is raised for Temporal to retry;
* anything else raised is a bug that would fail the same way again: a non-retryable
  `ApplicationError`.

Output longer than `ToolCallInput.output_chars` keeps its head and tail for the model and
is saved whole under `<workspace>/.durable-agent/outputs/`, named by the call's key.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.calls_here import CALLS_HERE
from activities.heartbeat import heartbeating
from activities.home import refuse_workspace_holding_worker_state
from activities.journal import JournalFull, JournalUnsafe
from activities.regular_files import NotRegularFile
from activities.run_files import HostileLayout, RunFileCaps, run_file_caps
from activities.snapshots import SnapshotActivities
from activities.tools import files, search
from activities.tools.base import PATH_ERRNOS, OpenCall, ToolCallContext, ToolError, describe_os_error
from activities.tools.command import INTERRUPTED, CommandRunner
from activities.tools.sandbox import CommandLimits
from activities.workspace import WorkspaceError, WorkspaceRefused, check_allowed, workspace_roots
from workflows.tool_specs import ToolArgumentError, validate_arguments
from workflows.types import RidingCall, ToolCallInput, ToolOutcome

__all__ = ["INTERRUPTED", "ToolActivities"]

_EXPECTED = (ToolError, WorkspaceError, ToolArgumentError, NotRegularFile, JournalFull, JournalUnsafe, HostileLayout)

Work = Callable[[OpenCall, Any], Awaitable[ToolOutcome]]
_T = TypeVar("_T")

FILE_TOOL_TIME_LIMIT_S = 30.0
"""A file tool call that has not finished by then is abandoned and reported to the model.
Each call runs on a thread of its own, not a shared pool: a call stuck in the kernel (a
hung mount) holds only its own thread, never the threads that other runs' calls need."""


class ToolActivities:
    """The six tool activities, bound to one worker's options; register `all()`.

    Exactly once: `write_file`, `edit_file` and `run_command` record their outcome in the
    workspace journal (`activities/journal.py`) under the call's idempotency key, and a
    retry of the same key returns the recorded outcome without acting again. How commands
    run: `activities/tools/command.py`.
    """

    def __init__(
        self,
        *,
        command_timeout_s: float = 120.0,
        kill_grace_s: float = 2.0,
        max_list_entries: int = 1_000,
        max_search_matches: int = 200,
        command_limits: CommandLimits = CommandLimits(),
        roots: list[str] | None = None,
        caps: RunFileCaps | None = None,
        snapshots: SnapshotActivities | None = None,
    ) -> None:
        """`roots`: where workspaces may lie; default `DURABLE_AGENT_WORKSPACE_ROOTS`, else the working directory.
        `caps`: what one run chain's journal and saved outputs hold; default from the environment.
        `snapshots`: the worker's, whose store a step's last call takes the step's snapshot in."""
        self._commands = CommandRunner(
            command_timeout_s=command_timeout_s, kill_grace_s=kill_grace_s, limits=command_limits
        )
        self._roots = roots if roots is not None else workspace_roots()
        self._caps = caps if caps is not None else run_file_caps()
        self._max_list_entries = max_list_entries
        self._max_search_matches = max_search_matches
        self._snapshots = snapshots if snapshots is not None else SnapshotActivities(self._roots)
        self._file_tools: dict[str, FileTool] = {
            "read_file": files.read_file,
            "write_file": files.write_file,
            "edit_file": files.edit_file,
            "list_files": self._list_files,
            "search_files": self._search_files,
        }

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [
            self.check_workspace,
            self.read_file,
            self.write_file,
            self.edit_file,
            self.list_files,
            self.search_files,
            self.run_command,
        ]

    @activity.defn(name="check_workspace")
    async def check_workspace(self, workspace: str) -> None:
        """Run by the workflow at a run's start, before any tool: a refused workspace closes the run."""
        try:
            await asyncio.to_thread(check_allowed, workspace, self._roots)
            refuse_workspace_holding_worker_state(workspace)
        except WorkspaceRefused as e:
            # BENIGN: an outcome the run reports, not a worker fault; the SDK logs it without a traceback.
            raise ApplicationError(
                str(e), type="WorkspaceRefused", non_retryable=True, category=ApplicationErrorCategory.BENIGN
            ) from None

    @activity.defn(name="read_file")
    async def read_file(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve_file("read_file", input)

    @activity.defn(name="write_file")
    async def write_file(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve_file("write_file", input)

    @activity.defn(name="edit_file")
    async def edit_file(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve_file("edit_file", input)

    @activity.defn(name="list_files")
    async def list_files(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve_file("list_files", input)

    @activity.defn(name="search_files")
    async def search_files(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve_file("search_files", input)

    @activity.defn(name="run_command")
    async def run_command(self, input: ToolCallInput) -> ToolOutcome:
        """A command outlives an attempt that the server timed out while the command still ran
        here (a worker too busy to send its heartbeats in time): the retry, when it comes to
        this process, waits for that same command instead of finding its start record and
        interrupting it (activities/calls_here.py)."""
        key = input.idempotency_key
        served = partial(
            self._serve,
            "run_command",
            input,
            self._commands.run,
            release_sticky=not CALLS_HERE.ran(key),
            details=partial(self._commands.beat_details, key),
        )
        return await CALLS_HERE.outcome_of(key, served)

    async def _serve_file(self, name: str, input: ToolCallInput) -> ToolOutcome:
        return await self._serve(name, input, partial(_file_tool, self._file_tools[name]))

    async def _serve(
        self,
        name: str,
        input: ToolCallInput,
        work: Work,
        release_sticky: bool = True,
        details: Callable[[], dict[str, Any]] | None = None,
    ) -> ToolOutcome:
        """Heartbeat, re-validate, run the tool and sort its errors (see the module docstring).

        The heartbeats come from a background task, so `work` must leave the event loop
        free: file tools run in a thread of their own, run_command awaits its process. `work`
        opens the call's context (workspace checks, journal) in the thread it does its own
        file-system work in: one hop to a thread per call, not two.
        """
        async with heartbeating(*([details] if details else []), release_sticky=release_sticky):
            riding = [await self._ride(rider) for rider in input.riding]
            outcome = await self._outcome(name, input, work)
            if input.snapshot is not None:  # the step's last call: its snapshot, after the call's effects
                outcome.snapshot = await self._snapshots.after_tool(input.snapshot)
            outcome.riding = riding
            return outcome

    async def _ride(self, rider: RidingCall) -> ToolOutcome:
        """A file call of the step, run before its command in the command's activity: each is
        exactly once on its own key (a retry of the activity finds the done ones recorded).
        What a retry may cure is raised before the command begins; a bug is the call's error,
        as the run reports a file tool's failed activity."""
        if rider.tool not in self._file_tools:
            return ToolOutcome(ok=False, error=f"{rider.tool} failed: it cannot run with a command")
        try:
            return await self._outcome(rider.tool, rider.call, partial(_file_tool, self._file_tools[rider.tool]))
        except ApplicationError as e:
            if not e.non_retryable:
                raise
            return ToolOutcome(ok=False, error=f"{rider.tool} failed: {e.message}")

    async def _outcome(self, name: str, input: ToolCallInput, work: Work) -> ToolOutcome:
        try:
            # Defence in depth: the workflow validated already, but histories outlive code.
            args = validate_arguments(name, input.arguments)
            return await work(partial(ToolCallContext.open, input, self._roots, self._caps), args)
        except _EXPECTED as e:
            return ToolOutcome(ok=False, error=str(e))
        except OSError as e:
            if e.errno not in PATH_ERRNOS:
                raise  # the machine, not the path: a retry may succeed
            return ToolOutcome(ok=False, error=describe_os_error(e, input.workspace))
        except ApplicationError:
            raise
        except Exception as e:
            raise ApplicationError(
                f"{name} failed unexpectedly: {type(e).__name__}: {e}", type="ToolBug", non_retryable=True
            ) from e

    def _list_files(self, call: ToolCallContext, args: Any) -> ToolOutcome:
        return search.list_files(call, args, self._max_list_entries)

    def _search_files(self, call: ToolCallContext, args: Any) -> ToolOutcome:
        return search.search_files(call, args, self._max_search_matches)


FileTool = Callable[[ToolCallContext, Any], ToolOutcome]


async def _file_tool(tool: FileTool, open_call: OpenCall, args: Any) -> ToolOutcome:
    return await _in_own_thread(lambda: tool(open_call(), args))


async def _in_own_thread(work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)` on a new daemon thread, bounded by FILE_TOOL_TIME_LIMIT_S."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        try:
            result, error = work(*args), None
        except BaseException as e:  # handed to the awaiting task, which sorts it
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop closed while this call was stuck; no one waits for it any more

    # The activity's context goes along: the call's journal names its run (activity.info()).
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(target,), name="file-tool", daemon=True).start()
    # A call that outlives its wait (timed out, or the attempt cancelled) still settles `done`;
    # its error was reported or no longer matters, so asyncio is told it was seen.
    done.add_done_callback(_seen)
    try:
        return await asyncio.wait_for(asyncio.shield(done), FILE_TOOL_TIME_LIMIT_S)
    except TimeoutError:
        raise ToolError(
            f"the call did not finish within {FILE_TOOL_TIME_LIMIT_S:g} s; the run goes on without its "
            "result (a write may still complete later: read the file before relying on it)"
        ) from None


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
