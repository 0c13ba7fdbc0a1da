"""run_command: a shell command in the workspace, at most once per idempotency key."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from temporalio import activity

from activities.home import refuse_workspace_holding_worker_state
from activities.host import boot_id, proc_stat
from activities.tools.base import OpenCall, ToolCallContext
from activities.tools.output import OutputCapture, OutputPipe
from activities.tools.run_sandbox import RUN_SANDBOXES, RunKey, RunningCommand, RunSandbox, SandboxGone, ShellLaunch
from activities.tools.sandbox import (
    CommandCgroup,
    CommandLaunch,
    CommandLimits,
    PlainHome,
    SandboxUnavailable,
    unsandboxed_allowed,
)
from activities.workspace import WorkspaceRefused
from workflows.tool_specs import RunCommandArgs
from workflows.types import ShellState, ToolOutcome

INTERRUPTED = (
    "the worker running this command was killed before it finished; the command may have "
    "partially run; check its effects before re-running it"
)
CANCELLED = "the command was cancelled and its process group killed; it may have partially run"
TAIL_CHARS = 2_000
"""A running command's latest output its heartbeats carry: what an interrupted call can still
show of it (the next attempt reads the last beat's details)."""


@dataclass(frozen=True)
class _Ended:
    """How a command's process ended, for `_finish`."""

    capture: OutputCapture
    timed_out_after_s: float | None
    returncode: int | None
    shell: ShellState | None = None
    """The persistent shell's state after the command."""


class CommandRunner:
    """Runs `bash -c` in the workspace inside the command sandbox (`sandbox.py`), in a
    process group of its own, with stdin from /dev/null and stderr merged into stdout (the
    model reads them interleaved, as in a terminal). The group never outlives the call: on
    timeout, on cancellation, and after bash exits, whatever is left gets SIGTERM, then
    SIGKILL after `kill_grace_s` (and the sandbox's PID namespace ends with it).
    A non-zero exit code is a normal result (`ok=True`, the text starts with the exit
    code): the model ran a command and reads what it said. `ok=False` means the tool could
    not give a full answer: a timeout, a cancellation or an interrupted earlier attempt.
    """

    def __init__(self, *, command_timeout_s: float, kill_grace_s: float, limits: CommandLimits) -> None:
        self._command_timeout_s = command_timeout_s
        self._kill_grace_s = kill_grace_s
        self._limits = limits
        self._running: dict[str, OutputCapture] = {}
        """The output of each command running here, by idempotency key, for the heartbeats."""

    def beat_details(self, key: str) -> dict[str, Any]:
        """What a running command's heartbeat carries: its latest output."""
        capture = self._running.get(key)
        return {"output_tail": capture.tail_text(TAIL_CHARS)} if capture is not None else {}

    async def run(self, open_call: OpenCall, args: RunCommandArgs) -> ToolOutcome:
        """Run the command at most once per idempotency key.

        A completed journal entry is returned as is. A start record without completion
        means an earlier attempt's worker died mid-command: its process group is killed if
        it still runs on this host, and the call fails with INTERRUPTED instead of running
        the command a second time; only the model can judge whether a re-run is safe.

        The file-system work before and after the process runs in one thread each
        (`_prepare`, `_finish`): every hop to a thread costs the worker a GIL hand-over, and
        at hundreds of agents those hand-overs were a large share of its CPU.
        """
        preparing = asyncio.ensure_future(asyncio.to_thread(self._prepare, open_call, args))
        try:
            call, prepared = await asyncio.shield(preparing)
        except asyncio.CancelledError:
            # The thread goes on regardless: close what it made and record the cancellation.
            call, prepared = await preparing
            if isinstance(prepared, CommandLaunch):
                await asyncio.to_thread(self._finish, call, prepared, None)
            raise
        if isinstance(prepared, ToolOutcome):
            return prepared
        launch = prepared
        try:
            ended = await self._execute(call, args, launch)
        except asyncio.CancelledError:
            await asyncio.to_thread(self._finish, call, launch, None)
            raise
        except SandboxUnavailable as e:  # the run's sandbox could not start: nothing ran
            await asyncio.to_thread(launch.close)
            return await asyncio.to_thread(self._record, call, ToolOutcome(ok=False, error=str(e)))
        except BaseException:
            await asyncio.to_thread(launch.close)
            raise
        return await asyncio.to_thread(self._finish, call, launch, ended)

    def _prepare(
        self, open_call: OpenCall, args: RunCommandArgs
    ) -> tuple[ToolCallContext, ToolOutcome | CommandLaunch]:
        """The call's context, with its recorded outcome or the launch of a command that is
        journalled as started."""
        call = open_call()
        return call, self._outcome_or_launch(call, args)

    def _outcome_or_launch(self, call: ToolCallContext, args: RunCommandArgs) -> ToolOutcome | CommandLaunch:
        journal, key = call.journal, call.input.idempotency_key
        recorded = journal.completed(key)
        if recorded is not None:
            return recorded
        leftover = journal.started(key)
        if leftover is not None:
            note = _stop_leftover(leftover, self._kill_grace_s)
            interrupted = ToolOutcome(
                ok=False, error=f"{INTERRUPTED} ({note})", output=_last_beat_output(), interrupted=True
            )
            return self._record(call, interrupted)
        journal.ensure_room()
        try:
            launch = self._launch(call, args.command)
        except SandboxUnavailable as e:
            return self._record(call, ToolOutcome(ok=False, error=str(e)))
        if isinstance(launch, ShellLaunch):
            return launch  # its start record, whole at once, once its sandbox is known (`_in_run_sandbox`)
        try:
            # Recorded before the launch: a crash in between must not lead to a silent second run.
            journal.start(key, launch.start_record(args.command))
        except BaseException:
            launch.close()
            raise
        return launch

    def _launch(self, call: ToolCallContext, command: str) -> CommandLaunch:
        """In the run's sandbox for a persistent shell, else in a sandbox of its own (`shell: fresh`,
        calls recorded before run folders, or an operator's unsandboxed commands)."""
        input = call.input
        try:
            # Checked at the run's start too; here for a worker whose temporary folder differs.
            refuse_workspace_holding_worker_state(call.workspace.root)
        except WorkspaceRefused as e:
            raise SandboxUnavailable(str(e)) from None
        if input.shell is not None and input.run_folder and not unsandboxed_allowed():
            return ShellLaunch.prepare_shell(call.workspace.root, command, input.shell, input.env_allow, self._limits)
        return CommandLaunch.prepare(call.workspace.root, command, input.sandbox.network, input.env_allow, self._limits)

    async def _execute(self, call: ToolCallContext, args: RunCommandArgs, launch: CommandLaunch) -> _Ended:
        timeout_s = args.timeout_s or self._command_timeout_s
        key = call.input.idempotency_key
        with call.capture() as capture:
            self._running[key] = capture
            try:
                async with OutputPipe(capture, self._kill_grace_s) as output:
                    if isinstance(launch, ShellLaunch):
                        return await self._in_run_sandbox(call, args.command, launch, output, timeout_s, capture)
                    process = await _spawn(call, launch, output)
                    timed_out = await self._supervise(call, launch, args.command, process, output, timeout_s)
            finally:
                self._running.pop(key, None)
        return _Ended(capture, timeout_s if timed_out else None, process.returncode)

    async def _start_in_run_sandbox(
        self, call: ToolCallContext, key: RunKey, command: str, launch: ShellLaunch, output: OutputPipe
    ) -> tuple[RunSandbox, RunningCommand]:
        """The command started in the run's sandbox, in a new one if the last has just ended
        (killed from outside, its exit not seen yet); counted as in use until released."""
        input = call.input
        attempts = 0
        try:
            while True:
                attempts += 1
                sandbox = await RUN_SANDBOXES.acquire(key, call.workspace.root)
                try:
                    if launch.cgroup is None:
                        launch.cgroup = await sandbox.take_spare(launch.command_limits)
                        launch.standby = launch.cgroup is not None
                    # Durable before the launch, and whole: the sandbox's group is what a later attempt after
                    # a crash of this worker finds gone or ends (one write where a fresh sandbox needs two).
                    record = _group_record(sandbox.process.pid, command)
                    await asyncio.to_thread(_begin, call, launch, record)
                    return sandbox, sandbox.start_command(launch, output.write_fd)  # type: ignore[arg-type]
                except SandboxGone as e:
                    RUN_SANDBOXES.release(key, sandbox)
                    if attempts == 2:
                        await asyncio.to_thread(call.journal.forget_start, input.idempotency_key)  # nothing ran
                        raise SandboxUnavailable(
                            f"the run's sandbox ended as it started, twice ({e}); nothing ran: try again "
                            "(bubblewrap stops when a folder on the workspace's path is swapped as it binds it)"
                        ) from None
                except BaseException:
                    RUN_SANDBOXES.release(key, sandbox)
                    raise
        finally:
            output.close_write_end()

    async def _in_run_sandbox(
        self,
        call: ToolCallContext,
        command: str,
        launch: ShellLaunch,
        output: OutputPipe,
        timeout_s: float,
        capture: OutputCapture,
    ) -> _Ended:
        """Run the command in the run's sandbox; like `_supervise`, its process group never outlives the call."""
        input = call.input
        key = (input.workspace, input.run_folder, input.sandbox.network)
        sandbox, running = await self._start_in_run_sandbox(call, key, command, launch, output)
        try:
            returncode, state, timed_out = -signal.SIGKILL, None, False
            try:
                async with asyncio.timeout(timeout_s):
                    returncode, state = await running.exited()
                await output.drained(self._kill_grace_s)  # background children may still be writing
            except TimeoutError:
                timed_out = True
            except SandboxGone:
                pass  # its PID 1 gone, every process of the sandbox went with it
            finally:
                await running.end(self._kill_grace_s)
            sandbox.ready_standby(launch.command_limits)  # for the run's next command
        finally:
            RUN_SANDBOXES.release(key, sandbox)
        after = launch.state_after(state, input.shell or ShellState())
        return _Ended(capture, timeout_s if timed_out else None, returncode, after)

    def _finish(self, call: ToolCallContext, launch: CommandLaunch, ended: _Ended | None) -> ToolOutcome:
        """Close the launch and record the outcome (None: the call was cancelled)."""
        over_memory = ended is not None and launch.over_memory()
        launch.close()
        if ended is None:
            return self._record(call, ToolOutcome(ok=False, error=CANCELLED))
        capture = ended.capture
        if ended.timed_out_after_s is not None:
            outcome = capture.outcome(
                f"command timed out after {ended.timed_out_after_s:g} s; it and every process it started were "
                "killed. Output before the timeout:\n",
                ok=False,
            )
        elif over_memory:
            memory = f"{self._limits.memory_bytes / 2**30:g} GiB"
            outcome = capture.outcome(
                f"command killed: its processes went over their memory limit ({memory})\n", ok=False
            )
        else:
            outcome = capture.outcome(f"{_exit_text(ended.returncode)}\n")
        return self._record(call, outcome.model_copy(update={"shell": ended.shell}))

    @staticmethod
    def _record(call: ToolCallContext, outcome: ToolOutcome) -> ToolOutcome:
        call.journal.complete(call.input.idempotency_key, outcome)
        return outcome

    async def _supervise(
        self,
        call: ToolCallContext,
        launch: CommandLaunch,
        command: str,
        process: asyncio.subprocess.Process,
        output: OutputPipe,
        timeout_s: float,
    ) -> bool:
        """Wait for the command; True if it timed out. Its process group never outlives this call."""
        try:
            # Adds how to find the group to the durable start record: a lost update is harmless.
            record = {**launch.start_record(command), **_group_record(process.pid, command)}
            await asyncio.to_thread(call.journal.start, call.input.idempotency_key, record, False)
            async with asyncio.timeout(timeout_s):
                await process.wait()
            return False
        except TimeoutError:
            return True
        finally:
            # Runs on timeout, on cancellation and after a normal exit alike.
            if process.returncode is not None:
                # bash is done; background children may still be writing, so give them a moment.
                await output.drained(self._kill_grace_s)
            if _signal_group(process.pid, 0):  # anything left at all (the usual answer is no)
                await asyncio.to_thread(kill_process_group, process.pid, self._kill_grace_s)
            await process.wait()


def _begin(call: ToolCallContext, launch: ShellLaunch, record: dict[str, Any]) -> None:
    """The command's cgroup if it has none yet (no spare: the sandbox's first command), and its start record."""
    if launch.cgroup is None:
        launch.cgroup = CommandCgroup.create(launch.command_limits)
    call.journal.start(call.input.idempotency_key, record)


async def _spawn(call: ToolCallContext, launch: CommandLaunch, output: OutputPipe) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(
            *launch.argv,
            cwd=call.workspace.root,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output.write_fd,
            stderr=output.write_fd,
            start_new_session=True,
            env=launch.env,
        )
    except OSError:
        # Nothing ran, so a retry may run it.
        await asyncio.to_thread(call.journal.forget_start, call.input.idempotency_key)
        raise
    finally:
        # Only the command's processes hold the write end now: EOF means all of them closed it.
        output.close_write_end()


# --- process groups ------------------------------------------------------------------


def _last_beat_output() -> str:
    """The interrupted attempt's latest output, as its last heartbeat carried it; "" if none."""
    details = activity.info().heartbeat_details
    tail = details[0].get("output_tail") if details and isinstance(details[0], dict) else None
    if not isinstance(tail, str) or not tail:
        return ""
    return f"output before the interruption (its last {len(tail):,} characters at the last heartbeat):\n{tail}"


def kill_process_group(pgid: int, grace_s: float) -> bool:
    """SIGTERM the group, SIGKILL whatever is left after `grace_s`; False if nothing ran."""
    if not _group_alive(pgid):
        return False
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    return True


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs.

    Zombies don't count: where PID 1 does not reap orphans (many containers), killed
    background processes linger as zombies and would make the group look alive forever.
    """
    if not _signal_group(pgid, 0):
        return False  # no process at all, not even a zombie: the usual case, without a /proc scan
    if not os.path.isdir("/proc"):
        return True
    with os.scandir("/proc") as entries:
        for entry in entries:
            fields = proc_stat(entry.name) if entry.name.isdigit() else None
            if fields is not None and fields[2] == str(pgid) and fields[0] != "Z":
                return True
    return False


def _group_record(pid: int, command: str) -> dict[str, Any]:
    """What a later attempt needs to find this process group again, and only this one."""
    fields = proc_stat(str(pid))
    return {
        "command": command,
        "pgid": pid,
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "leader_start": fields[19] if fields else None,
    }


def _stop_leftover(record: dict[str, Any], grace_s: float) -> str:
    """Kill a dead attempt's process group if it still runs here; say what was found."""
    pgid = record.get("pgid")
    if pgid is None:
        return "it had not been started yet, or had only just been"
    if record.get("host") != socket.gethostname():
        return f"it ran on host {record.get('host')}, where it may still be running"
    if record.get("boot_id") != boot_id() or not _same_leader(pgid, record.get("leader_start")):
        note = "it is no longer running"
    elif kill_process_group(pgid, grace_s):
        note = "it was still running and has now been killed"
    else:
        note = "it is no longer running"
    home = PlainHome.left_by(record)
    if home is not None:
        home.remove()  # an unsandboxed command's, which its killed worker could not remove
    return note


def _same_leader(pgid: int, leader_start: str | None) -> bool:
    # A live leader with another start time means the group id was reused by a new group.
    fields = proc_stat(str(pgid))
    return fields is None or leader_start is None or fields[19] == leader_start


def _exit_text(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return f"exit code: {returncode}"
