"""What this machine's /proc says about its processes: shared by the tools that find a dead
attempt's command again and by the worker that takes over a dead worker's calls."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def proc_stat(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; the name before it may hold spaces."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def boot_id() -> str | None:
    """This boot of this kernel: a pid or a process group id means nothing across boots."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def pid_namespace() -> str | None:
    """The pid namespace this process sees (one per container): pids mean nothing across them."""
    try:
        return str(Path("/proc/self/ns/pid").readlink())
    except OSError:
        return None


def process_gone(pid: int) -> bool:
    """True when no process `pid` runs here; a zombie (dead, not yet reaped) counts as gone.

    A pid reused by a new process reads as alive: callers must only act on "gone"."""
    fields = proc_stat(pid)
    return fields is None or fields[0] in ("Z", "X")


@functools.cache
def machine_tag() -> str | None:
    """Short and stable for one boot and one pid namespace; None where /proc cannot tell.
    Read once: neither changes while a process runs, and every command's cgroup is named with it."""
    boot, namespace = boot_id(), pid_namespace()
    if boot is None or namespace is None:
        return None
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:8]
