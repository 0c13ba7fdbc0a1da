"""Opening regular files only: a FIFO, socket or device in the workspace must never block a tool.

A named pipe that no one writes to blocks `open()` for ever, a socket refuses it, and a
device may never end. Readers (the file tools, the journal) therefore look at what a path
is before opening it, open it non-blocking (a FIFO then opens at once) and check again on
the open file, in case the path was swapped in between. A saved output replaces whatever
stands at its path instead of opening it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

SPECIAL_KINDS = {
    stat.S_IFIFO: "FIFO (named pipe)",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


class NotRegularFile(Exception):
    """The path is a FIFO, socket or device; the message is written for the model."""

    def __init__(self, shown: str, mode: int) -> None:
        kind = SPECIAL_KINDS.get(stat.S_IFMT(mode), "special file")
        super().__init__(f"{shown} is a {kind}, not a regular file; the file tools read regular files only")


def open_regular(path: str | Path, shown: str | None = None) -> BinaryIO:
    """`path` opened for binary reading; raises NotRegularFile, or OSError (EISDIR for a folder)."""
    shown = shown if shown is not None else str(path)
    _check(os.stat(path).st_mode, path, shown)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check(os.fstat(fd).st_mode, path, shown)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def fdopen_regular(fd: int, shown: str) -> BinaryIO:
    """An opened descriptor (non-blocking) as a blocking binary reader, if it is a regular
    file; closes it and raises NotRegularFile or IsADirectoryError otherwise."""
    try:
        _check(os.fstat(fd).st_mode, shown, shown)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def create_regular(name: str, dir_fd: int) -> BinaryIO:
    """A new regular file `name` of the opened folder `dir_fd` for binary writing, replacing
    whatever was there: a FIFO or link left in its place is removed, never opened (a FIFO's
    open would block)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    return os.fdopen(fd, "wb")


def read_regular(path: str | Path, shown: str | None = None) -> bytes:
    with open_regular(path, shown) as f:
        return f.read()


def _check(mode: int, path: str | Path, shown: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise NotRegularFile(shown, mode)


def open_regular_at(dir_fd: int, name: str) -> BinaryIO | None:
    """Regular file `name` of the opened folder, opened for binary reading, never through a link
    and never blocking on a FIFO; None where there is no such regular file (any more). Any other
    failure (a file it may not read, no descriptor left) is raised: never taken for absent."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):  # gone, a link, a socket
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular_at(dir_fd: int, name: str, limit: int = -1) -> bytes | None:
    """Up to `limit` bytes (all: -1) of regular file `name` of the opened folder, as
    `open_regular_at` opens it; None where there is no such regular file (any more)."""
    opened = open_regular_at(dir_fd, name)
    if opened is None:
        return None
    with opened as f:
        return f.read(limit)
