"""What this machine's /proc says about its processes: shared by the tools that find a dead
attempt's command again and by the worker that takes over a dead worker's calls; and where
one user's processes on this machine meet (`user_folder`)."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path

LIVE_REPLIES_PREFIX = "durable-agent-live-"
"""The user folder where workers serve live replies (activities/live_replies.py)."""


def user_folder(base: str | Path, prefix: str) -> Path | None:
    """`<base>/<prefix><uid>`, made 0700 if missing: one folder per user of this machine, where
    its processes meet (the live reply sockets). None unless it is a
    folder of this user that no one else may open, not a symlink: in a shared temporary
    directory another user may have made it first, and what lay in it could lie."""
    folder = Path(base) / f"{prefix}{os.geteuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
        return None
    return folder


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
