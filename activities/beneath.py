"""Opening and replacing files of a workspace through its folder descriptor, so that no path
the file tools use can lead out of it, however a command races them.

A path checked and then opened by name can be swapped in between: a command that keeps
replacing a folder by a symlink to `/etc` wins that race now and then. Here a path is
resolved relative to the workspace's descriptor, never by name:
`openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` (Linux 5.6) opens a file's folder in one
step, following symlinks only while they stay inside and failing with EXDEV the moment one
leads out. Where the kernel lacks openat2, where it refuses a symlink that may still stay
inside (an absolute one into the workspace), and for a symlink at the end, `_walk` goes
component by component, each folder opened with O_NOFOLLOW from the one before and each
symlink read and walked the same way, never above the workspace. A file is replaced by
writing a temporary file in the opened folder and renaming it there (`renameat` through
that descriptor): the rename cannot land anywhere else, and replaces a symlink swapped in
at the name rather than writing through it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import uuid
from functools import cache

from activities.regular_files import NotRegularFile
from activities.workspace import RESERVED_DIR, WorkspaceError

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
SYS_OPENAT2 = 437
"""The same number on every architecture (the unified system call table, Linux 5.6)."""
MAX_LINK_HOPS = 40
"""As the kernel's own limit on symlinks in one path."""
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@cache
def openat2_available() -> bool:
    """Whether this kernel has openat2 (seccomp profiles of some containers refuse it: ENOSYS or EPERM)."""
    try:
        fd = _openat2(os.open("/", _DIR), ".", _DIR, close_dir=True)
    except OSError:
        return False
    os.close(fd)
    return True


def _openat2(dir_fd: int, path: str, flags: int, mode: int = 0, close_dir: bool = False) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    try:
        for _ in range(8):  # EAGAIN: a concurrent rename made the kernel unsure of a `..`; retry
            fd = _libc().syscall(SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
            if fd >= 0:
                return fd
            code = ctypes.get_errno()
            if code != errno.EAGAIN:
                raise OSError(code, os.strerror(code), path)
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)
    finally:
        if close_dir:
            os.close(dir_fd)


class Resolved:
    """A path of the workspace resolved to its opened parent folder and final name; `shown`
    is the path relative to the workspace as resolved (what the model is told)."""

    def __init__(self, parent_fd: int, name: str, shown: str) -> None:
        self.parent_fd, self.name, self.shown = parent_fd, name, shown

    def __enter__(self) -> Resolved:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.parent_fd)


def resolve(root_fd: int, relative: str, aliases: tuple[str, ...], shown: str) -> Resolved:
    """`relative` (no leading `..`) resolved under `root_fd`, a symlink at its end followed.

    openat2 opens the parent in one step where it can; a symlink on the way that it will
    not follow (an absolute one, even into the workspace) or a symlink at the end is
    resolved by `_walk`. `aliases`: the workspace's absolute paths, which an absolute
    symlink may go through. Raises WorkspaceError for a path leading out.
    """
    parent, name = os.path.split(relative)
    if openat2_available() and name not in ("", ".", ".."):
        try:
            parent_fd = _openat2(root_fd, parent or ".", _DIR)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise OSError(e.errno, e.strerror, shown) from None
        else:
            try:
                if not stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode):
                    return Resolved(parent_fd, name, relative)
            except FileNotFoundError:
                return Resolved(parent_fd, name, relative)
            os.close(parent_fd)
    return _walk(root_fd, relative, aliases, shown)


def _walk(root_fd: int, relative: str, aliases: tuple[str, ...], shown: str) -> Resolved:
    """Component by component from the workspace's descriptor, each folder opened with
    O_NOFOLLOW from the one before: `..` goes back to the folder opened before (never above
    the workspace), a symlink is read and its target walked the same way."""
    stack = [os.open(".", _DIR, dir_fd=root_fd)]
    names: list[str] = []
    pending = _parts(relative)
    hops = 0
    try:
        while pending:
            part = pending.pop(0)
            if part == "..":
                if len(stack) == 1:
                    raise _escape(shown)
                os.close(stack.pop())
                names.pop()
                continue
            try:
                mode = os.stat(part, dir_fd=stack[-1], follow_symlinks=False).st_mode
            except FileNotFoundError:
                if pending:
                    raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), shown) from None
                mode = 0
            if stat.S_ISLNK(mode):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), shown)
                try:
                    target = os.readlink(part, dir_fd=stack[-1])
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOENT):
                        raise
                    pending.insert(0, part)  # no longer a symlink: look at it again
                    continue
                if os.path.isabs(target):
                    target = _inside(target, aliases, shown)
                    while len(stack) > 1:
                        os.close(stack.pop())
                    names.clear()
                pending = _parts(target) + pending
                continue
            if not pending:
                return Resolved(os.dup(stack[-1]), part, "/".join([*names, part]))
            try:
                stack.append(os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=stack[-1]))
            except OSError as e:
                raise OSError(e.errno, e.strerror, shown) from None
            names.append(part)
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
    finally:
        for fd in stack:
            os.close(fd)


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _inside(target: str, aliases: tuple[str, ...], shown: str) -> str:
    """An absolute symlink target as a path relative to the workspace, or WorkspaceError."""
    for alias in aliases:
        if target == alias or target.startswith(alias.rstrip("/") + "/"):
            return os.path.relpath(target, alias)
    raise _escape(shown)


def _escape(shown: str) -> WorkspaceError:
    return WorkspaceError(f"path escapes the workspace through a symlink: {shown}")


def open_regular_beneath(root_fd: int, relative: str, aliases: tuple[str, ...], shown: str) -> int:
    """A file of the workspace opened for reading, non-blocking (a FIFO opens at once; the
    caller checks what it is on the descriptor)."""
    with resolve(root_fd, relative, aliases, shown) as found:
        return open_resolved(found)


def open_resolved(found: Resolved) -> int:
    """The resolved file opened for reading, non-blocking, without following a symlink
    swapped in at its name since it was resolved. A socket is refused before the open
    (which would fail with ENXIO); a FIFO opens at once, for the caller to refuse."""
    try:
        mode = os.stat(found.name, dir_fd=found.parent_fd, follow_symlinks=False).st_mode
        if stat.S_ISSOCK(mode):
            raise NotRegularFile(found.shown, mode)
        return os.open(found.name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=found.parent_fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, found.shown) from None


def make_parents(root_fd: int, relative: str, aliases: tuple[str, ...], shown: str) -> None:
    """Create the missing folders above `relative`, each resolved afresh under `root_fd`."""
    parts = _parts(os.path.dirname(relative))
    for index in range(len(parts)):
        with resolve(root_fd, "/".join(parts[: index + 1]), aliases, shown) as found:
            try:
                os.mkdir(found.name, dir_fd=found.parent_fd)
            except FileExistsError:
                pass  # there already (or made meanwhile): the next step opens it as a folder


def replace_file(root_fd: int, found: Resolved, data: bytes, mode: int | None = None) -> None:
    """Replace the file `found` by `data` through its opened folder: temp file, then rename
    within that folder. Refuses `.durable-agent/` and anything under it. The file keeps an
    existing file's permission bits, or gets `mode`, or 0o666 less the umask."""
    parent_fd, name = found.parent_fd, found.name
    if name in ("", ".", "..") or _in_reserved(root_fd, parent_fd, name):
        raise WorkspaceError(
            f"{found.shown} is inside {RESERVED_DIR}/, where durable-agent keeps its journal and "
            "saved outputs; write somewhere else"
        )
    if mode is None:
        try:
            existing = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            mode = stat.S_IMODE(existing.st_mode) if stat.S_ISREG(existing.st_mode) else None
        except FileNotFoundError:
            pass
    temp = f".{name[:200]}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=parent_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except BaseException as e:
        try:
            os.unlink(temp, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, found.shown) from None
        raise


def _in_reserved(root_fd: int, parent_fd: int, name: str) -> bool:
    """Whether `name` in `parent_fd` is `.durable-agent` or lies under it, found by walking
    the opened folder's `..` up to the workspace (a symlink cannot disguise it)."""
    try:
        reserved = os.stat(RESERVED_DIR, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    root = os.fstat(root_fd)
    current = os.open(".", _DIR, dir_fd=parent_fd)
    try:
        st = os.fstat(current)
        if (st.st_dev, st.st_ino) == (root.st_dev, root.st_ino):
            return name == RESERVED_DIR
        while (st.st_dev, st.st_ino) != (root.st_dev, root.st_ino):
            if (st.st_dev, st.st_ino) == (reserved.st_dev, reserved.st_ino):
                return True
            up = os.open("..", _DIR, dir_fd=current)
            os.close(current)
            current = up
            above = os.fstat(current)
            if (above.st_dev, above.st_ino) == (st.st_dev, st.st_ino):
                raise WorkspaceError("the folder written to is no longer inside the workspace")
            st = above
        return False
    finally:
        os.close(current)
