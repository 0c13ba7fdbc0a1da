"""One sandbox per run (`shell: persistent`): set up once, each command started inside it.

A run's first command on a worker starts the run's sandbox: the same bubblewrap namespaces,
uid, capabilities and seccomp filter as a command's own sandbox (`sandbox.py`), whose PID 1
is a small helper (`shell_helper.py`). Each command is then one message to the helper,
which forks it into a session (process group) of its own, puts it in its own cgroup (the
worker creates the cgroup and hands the helper its opened `cgroup.procs` files) and sets its
rlimits before it execs: the per-command protections are those of `CommandLaunch`, the
namespace set-up is paid once per run instead of once per command.

The sandbox ends when the run closes (`clean_up_run` calls `end_run_sandboxes`), after
SANDBOX_IDLE_S without a command, or with the worker (bubblewrap dies with its parent); its
PID namespace ends with its PID 1, taking every process left in it along. Whatever a command
leaves running is killed when it ends, as before (its process group, then its cgroup).

Joining a cgroup is the slow part of a command's start (the kernel waits for an RCU grace
period: 5-15 ms under load). So when a command ends, the worker makes the next command's
cgroup in the background and the helper forks a standby child into it
(`RunSandbox.ready_standby`); the next command of the run takes that cgroup (`take_spare`,
which waits for a standby still being made) and its request goes to the standby, which execs
it at once. The command's cgroup, limits and kill are the same; only the join happened earlier.

The durable shell: a command runs behind SHELL_SCRIPT, which starts it in the recorded
working directory and writes the directory and exported variables it ends with to a file the
helper returns; `ShellLaunch.state_after` turns them into the ShellState the outcome records
(the difference from the sandbox's environment, values holding the worker's secrets left out).
"""

from __future__ import annotations

import asyncio
import marshal
import os
import resource
import socket
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from importlib.util import MAGIC_NUMBER
from pathlib import Path

from activities.redaction import worker_redactor
from activities.tools.sandbox import (
    SANDBOX_HOME,
    SANDBOX_TMP,
    CommandCgroup,
    CommandLaunch,
    CommandLimits,
    SandboxUnavailable,
    _capped,
    bwrap_binary,
    bwrap_options,
    command_env,
    opened_workspace,
    refusal,
)
from activities.tools.seccomp import filter_file
from workflows.types import ShellState

SANDBOX_IDLE_S = 600.0
"""A run's sandbox without a command this long ends (the next command starts another, from
the recorded shell state): a run waiting for a person holds no processes meanwhile."""
SANDBOX_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
"""Where the helper's interpreter may lie: only the host's system folders are in the sandbox."""
HELPER_LOADER = (
    "import sys, marshal, _frozen_importlib_external as b; d = sys.stdin.buffer.read(); "
    "n = int.from_bytes(d[4:8], 'big'); "
    "exec(marshal.loads(d[8 : 8 + n]) if d[:4] == b.MAGIC_NUMBER else d[8 + n :])"
)
"""The helper comes on its stdin (`helper_input`): its command line, which commands see in
/proc, stays short. An interpreter whose bytecode is the worker's (the same magic number)
runs the code the worker compiled; any other compiles the source."""


def helper_input(source: str, magic: bytes = MAGIC_NUMBER) -> bytes:
    """What the helper's loader reads: the bytecode's magic number, the length of the code,
    the code compiled here, then the source. Loading compiled code spares every run's sandbox
    compiling the helper (docs/fleet.md measures it)."""
    # Not this module's `from __future__` flags, nor the worker's -O: as the sandbox would compile it.
    code = marshal.dumps(compile(source, "shell_helper.py", "exec", dont_inherit=True, optimize=0))
    return magic + len(code).to_bytes(4, "big") + code + source.encode()


HELPER = helper_input((Path(__file__).parent / "shell_helper.py").read_text())
SHELL = "/bin/bash"
SHELL_SCRIPT = r"""if [ -n "$1" ] && ! cd -- "$1" 2>/dev/null; then
  echo "durable-agent: the shell's directory $1 is gone; the command runs in the workspace" >&2
fi
__durable_agent_state=$2; __durable_agent_command=$3; set --
trap '__durable_agent_status=$?; set +euC
builtin compgen -e > "$__durable_agent_state.names" 2>/dev/null
{ builtin printf "%s\0" "$PWD"; while IFS= builtin read -r __durable_agent_name; do
  builtin printf "%s=%s\0" "$__durable_agent_name" "${!__durable_agent_name}"; done < "$__durable_agent_state.names"
} > "$__durable_agent_state" 2>/dev/null
exit $__durable_agent_status' EXIT
eval "$__durable_agent_command"
"""
"""The command, in the shell's directory; at its exit (an `exit` in the command included), its
directory and exported variables, NUL-separated, to the state file. Builtins only: `env`
would cost a process per command."""
SHELL_OWN = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
"""Variables bash itself sets: not part of the recorded state."""
MAX_STATE_CHARS = 32_000
"""A recorded shell state larger than this keeps the directory and drops the variables: it goes to history."""
END_WAIT_S = 10.0
"""How long ending a command's process group may take beyond its grace before the sandbox is presumed dead."""


@cache
def sandbox_python() -> str:
    for path in SANDBOX_PYTHONS:
        real = os.path.realpath(path)
        if os.access(real, os.X_OK) and real.startswith(("/usr/", "/bin/", "/lib")):
            return path
    raise SandboxUnavailable(f"a persistent shell needs python3 in the host's system folders ({SANDBOX_PYTHONS})")


@dataclass
class ShellLaunch(CommandLaunch):
    """One command of a persistent shell: its request to the run's sandbox and its cgroup."""

    base_env: dict[str, str] = field(default_factory=dict)
    state_file: str = ""
    limits: list[tuple[int, int]] = field(default_factory=list)
    command_limits: CommandLimits = field(default_factory=CommandLimits)
    standby: bool = False
    """Its cgroup is the sandbox's spare, which the helper's standby child has joined already."""

    @classmethod
    def prepare_shell(
        cls, workspace_root: str, command: str, shell: ShellState, env_allow: list[str], limits: CommandLimits
    ) -> ShellLaunch:
        """Raises SandboxUnavailable when no sandbox can start here."""
        try:
            bwrap_binary()
            sandbox_python()
        except SandboxUnavailable as e:
            raise SandboxUnavailable(refusal(e)) from None
        base = command_env(env_allow, SANDBOX_HOME, SANDBOX_TMP)
        env = dict(base)
        for name, value in shell.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        state_file = f"{SANDBOX_TMP}/.durable-agent-shell-{uuid.uuid4().hex}"
        argv = [SHELL, "-c", SHELL_SCRIPT, "durable-agent", shell.cwd, state_file, command]
        rlimits = [
            (resource.RLIMIT_CPU, _capped(resource.RLIMIT_CPU, limits.cpu_s)),
            (resource.RLIMIT_AS, _capped(resource.RLIMIT_AS, limits.address_space_bytes)),
            (resource.RLIMIT_FSIZE, _capped(resource.RLIMIT_FSIZE, limits.file_bytes)),
            (resource.RLIMIT_NPROC, _capped(resource.RLIMIT_NPROC, limits.processes)),
            (resource.RLIMIT_NOFILE, _capped(resource.RLIMIT_NOFILE, limits.open_files)),
            (resource.RLIMIT_CORE, 0),
        ]
        # Its cgroup comes with its sandbox: the spare one made after the run's last command, or a new one.
        return cls(argv, env, base_env=base, state_file=state_file, limits=rlimits, command_limits=limits)

    def request(self) -> bytes:
        request = {
            "argv": self.argv,
            "env": self.env,
            "limits": self.limits,
            "state_file": self.state_file,
            "standby": self.standby,
        }
        return marshal.dumps(request, 4)  # the helper's format (shell_helper.py says why)

    def state_after(self, text: str | None, before: ShellState) -> ShellState:
        """The shell state the command left (`before` if it left none: killed, or exec'd away)."""
        if not text:
            return before
        cwd, *pairs = text.rstrip("\0").split("\0")
        env = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
        if "" in env:  # the helper's mark of a state too large to send: as over MAX_STATE_CHARS
            return ShellState(cwd=cwd)
        redactor = worker_redactor()
        delta: dict[str, str | None] = {
            name: value
            for name, value in env.items()
            if name not in SHELL_OWN and self.base_env.get(name) != value and redactor.text(value) == value
        }
        delta.update({name: None for name in self.base_env if name not in env})
        state = ShellState(cwd=cwd, env=delta)
        if len(state.model_dump_json()) > MAX_STATE_CHARS:
            return ShellState(cwd=cwd)
        return state


class SandboxGone(Exception):
    """The run's sandbox ended while a command ran in it (its helper exited or was killed)."""


class RunningCommand:
    """A command started in a run's sandbox, seen through its own socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    async def exited(self) -> tuple[int, str | None]:
        """The command's exit code (negative: a signal) and the shell state it wrote."""
        exit_line, _, state = (await self._receive()).partition(b"\n")
        return int(exit_line.removeprefix(b"exit ")), state.decode(errors="surrogateescape") or None

    async def end(self, grace_s: float) -> None:
        """End whatever is left of the command's process group: SIGTERM, SIGKILL after `grace_s`."""
        try:
            self._sock.send(marshal.dumps({"end": grace_s}, 4))
            async with asyncio.timeout(grace_s + END_WAIT_S):
                while await self._receive() != b"ended":
                    pass
        except (OSError, SandboxGone, TimeoutError):
            pass  # the sandbox is gone, and its processes with it (or its cgroup's removal ends them)
        finally:
            self._sock.close()

    async def _receive(self) -> bytes:
        data = await asyncio.get_running_loop().sock_recv(self._sock, 1 << 21)
        if not data:
            raise SandboxGone("the run's sandbox ended while the command ran")
        return data


class RunSandbox:
    """A run's sandbox on this worker: bubblewrap with the helper as its PID 1."""

    def __init__(self, process: asyncio.subprocess.Process, control: socket.socket) -> None:
        self.process = process
        self._control = control
        self.running = 0
        self.last_used = time.monotonic()
        self._gone = False
        self._spare: tuple[CommandCgroup, CommandLimits] | None = None
        """The next command's cgroup, which the helper's standby child has been told to join."""
        self._readying: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, workspace_root: str, network: bool) -> RunSandbox:
        """bubblewrap started straight from the worker (`vfork`), the seccomp filter open on
        a descriptor it names: no shell before it, as a command's own sandbox needs for its
        cgroups and limits (sandbox.LAUNCHER)."""
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seccomp = os.open(filter_file(), os.O_RDONLY | os.O_CLOEXEC)
        opened = [seccomp]
        try:
            workspace = opened_workspace(workspace_root)
            opened.append(workspace)
            argv = [
                *bwrap_options(bwrap_binary(), workspace_root, network, seccomp_fd=seccomp, workspace_fd=workspace),
                "--as-pid-1",
                "--",
                *(sandbox_python(), "-I", "-S", "-c", HELPER_LOADER, str(theirs.fileno())),
            ]
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workspace_root,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(theirs.fileno(), seccomp, workspace),
            )
        except BaseException:
            control.close()
            raise
        finally:
            theirs.close()
            for fd in opened:
                os.close(fd)
        assert process.stdin is not None
        process.stdin.write(HELPER)
        process.stdin.close()
        return cls(process, control)

    def alive(self) -> bool:
        return self.process.returncode is None and not self._gone

    async def take_spare(self, limits: CommandLimits) -> CommandCgroup | None:
        """The cgroup a standby child waits in, for a command under `limits`; None if there is none.
        Waits for a standby still being made (there is one by then, so no command sees two)."""
        if self._readying is not None:
            await asyncio.wait([self._readying])  # cancelling this wait leaves the task be
        if self._spare is None or self._spare[1] != limits:
            return None
        cgroup, self._spare = self._spare[0], None
        return cgroup

    def ready_standby(self, limits: CommandLimits) -> None:
        """In the background, so that no call waits for it: make the next command's cgroup and
        have the helper fork a standby child into it."""
        if self._spare is None and self._readying is None and self.alive():
            self._readying = asyncio.ensure_future(self._make_spare(limits))

    async def _make_spare(self, limits: CommandLimits) -> None:
        try:
            cgroup = await asyncio.to_thread(CommandCgroup.create, limits)
            if cgroup is None:
                return  # no cgroups here: nothing slow to do ahead
            try:
                self._send(marshal.dumps({"standby": True}, 4), cgroup.procs_files())
            except SandboxGone:  # it ended meanwhile
                await asyncio.to_thread(cgroup.remove)
                return
            self._spare = (cgroup, limits)
        finally:
            self._readying = None

    def _send(self, message: bytes, procs_files: list[str], *fds: int) -> None:
        """One message to the helper, with `fds` and the opened `procs_files`; raises SandboxGone."""
        procs = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in procs_files]
        try:
            socket.send_fds(self._control, [message], [*fds, *procs])
        except OSError as e:
            self._gone = True  # the next acquire starts another
            raise SandboxGone(f"the run's sandbox has ended ({e})") from None
        finally:
            for fd in procs:
                os.close(fd)

    def start_command(self, launch: ShellLaunch, output_fd: int) -> RunningCommand:
        """Send the command to the helper; raises SandboxGone if the sandbox has ended."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._send(launch.request(), launch.procs_files(), theirs.fileno(), output_fd)
        except SandboxGone:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.setblocking(False)
        return RunningCommand(mine)

    async def end(self) -> None:
        """Close the helper's socket: it exits, and the kernel ends every process of the sandbox."""
        self._gone = True
        self._control.close()
        try:
            async with asyncio.timeout(5):
                await self.process.wait()
        except TimeoutError:
            try:
                os.killpg(self.process.pid, 9)
            except ProcessLookupError:
                pass
            await self.process.wait()
        spare, self._spare = self._spare, None
        if spare is not None:  # its standby child ended with the sandbox
            await asyncio.to_thread(spare[0].remove)


RunKey = tuple[str, str, bool]
"""The run's workspace (as its input names it), its run folder (one per chain) and its network setting."""


class RunSandboxes:
    """The run sandboxes of this worker, by run; each ends after SANDBOX_IDLE_S unused."""

    def __init__(self, idle_s: float = SANDBOX_IDLE_S) -> None:
        self._sandboxes: dict[RunKey, RunSandbox] = {}
        self._starting: dict[RunKey, asyncio.Lock] = {}
        self._idle_s = idle_s

    async def acquire(self, key: RunKey, workspace_root: str) -> RunSandbox:
        """The run's sandbox, started if it has none (or its last one ended); counted as in use until `release`."""
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:
            sandbox = self._sandboxes.get(key)
            if sandbox is None or not sandbox.alive():
                if sandbox is not None:
                    _end_in_background(sandbox)  # its socket closed, its process reaped
                sandbox = await RunSandbox.start(workspace_root, key[2])
                self._sandboxes[key] = sandbox
            sandbox.running += 1
            return sandbox

    def release(self, key: RunKey, sandbox: RunSandbox) -> None:
        sandbox.running -= 1
        sandbox.last_used = time.monotonic()
        asyncio.get_running_loop().call_later(self._idle_s, self._end_if_idle, key, sandbox)

    def _end_if_idle(self, key: RunKey, sandbox: RunSandbox) -> None:
        if sandbox.running == 0 and time.monotonic() - sandbox.last_used >= self._idle_s * 0.99:
            self._forget(key, sandbox)
            _end_in_background(sandbox)

    async def end_run(self, workspace: str, run_folder: str) -> int:
        """End the run's sandboxes on this worker (at its close); how many there were."""
        ending = [(key, box) for key, box in self._sandboxes.items() if key[:2] == (workspace, run_folder)]
        for key, sandbox in ending:
            self._forget(key, sandbox)
            await sandbox.end()
        return len(ending)

    def _forget(self, key: RunKey, sandbox: RunSandbox) -> None:
        if self._sandboxes.get(key) is sandbox:
            del self._sandboxes[key]
            self._starting.pop(key, None)

    def __len__(self) -> int:
        return len(self._sandboxes)


_ENDING: set[asyncio.Task[None]] = set()


def _end_in_background(sandbox: RunSandbox) -> None:
    task = asyncio.ensure_future(sandbox.end())
    _ENDING.add(task)
    task.add_done_callback(_ENDING.discard)


RUN_SANDBOXES = RunSandboxes()
"""This worker's: `run_command` starts them, `clean_up_run` ends them."""
