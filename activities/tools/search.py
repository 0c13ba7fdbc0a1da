"""list_files and search_files: walking a workspace and searching its text."""

from __future__ import annotations

import fnmatch
import itertools
import os
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import regex

from activities.beneath import open_regular_beneath, resolve
from activities.regular_files import NotRegularFile, fdopen_regular
from activities.tools.base import ToolCallContext, ToolError, clip, decode_text, text_outcome
from activities.workspace import RESERVED_DIR, WorkspaceError
from workflows.tool_specs import ListFilesArgs, SearchFilesArgs
from workflows.types import ToolOutcome

SKIP_DIRS = frozenset({".git", RESERVED_DIR})
MAX_SEARCH_FILE_BYTES = 20_000_000
"""Bigger files are skipped by search_files: they are data, not source, and would fill memory."""
SEARCH_TIME_LIMIT_S = 10.0
"""A whole search_files call, regex included. Patterns run on the `regex` engine, which
takes a timeout and releases the GIL while it matches: a catastrophic pattern such as
`(a+)+$` over a long line ends with a clear error instead of holding one CPU and every
other thread of the worker (Python's `re` keeps the GIL for as long as it backtracks).
It reads Python's regex syntax, which the model writes; a linear-time engine (RE2) would
refuse backreferences and lookarounds, a subprocess per search would cost a fork."""
_OPEN_ANY = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
"""Non-blocking: a FIFO opens at once (and is skipped); no symlink at the name is followed."""
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def list_files(call: ToolCallContext, args: ListFilesArgs, max_entries: int) -> ToolOutcome:
    with call.workspace.opened() as root_fd, _opened_top(call, root_fd, args.path, "no such folder") as top:
        if not top.is_dir:
            raise ToolError(f"{args.path} is a file, not a folder")
        found = (e for e in _walk(top.fd, top.shown, "") if _glob_match(e.relative, args.pattern))
        entries = list(itertools.islice(found, max_entries + 1))
    if not entries:
        return ToolOutcome(ok=True, output=f"no files under {args.path}" + _pattern_note(args.pattern))
    lines = sorted(e.shown for e in entries[:max_entries])
    if len(entries) > max_entries:
        cap = max_entries
        lines.append(f"[more than {cap:,} entries; showing the first {cap:,}: narrow the listing with path or pattern]")
    return text_outcome(call, "\n".join(lines))


def search_files(
    call: ToolCallContext, args: SearchFilesArgs, max_matches: int, time_limit_s: float = SEARCH_TIME_LIMIT_S
) -> ToolOutcome:
    try:
        pattern = regex.compile(args.pattern)
    except regex.error as e:
        raise ToolError(f"invalid regular expression {args.pattern!r}: {e}") from e
    deadline = time.monotonic() + time_limit_s
    with call.workspace.opened() as root_fd, _opened_top(call, root_fd, args.path, "no such file or folder") as top:
        if top.is_dir:
            entries: Iterable[_Entry] = _walk(top.fd, top.shown, "")
        else:
            entries = [_Entry(top.fd, "", top.shown, os.path.basename(top.shown), is_link=False)]
        found = _grep(call, root_fd, entries, pattern, args.glob, deadline)
        try:
            matches = list(itertools.islice(found, max_matches + 1))
        except TimeoutError:
            raise ToolError(
                f"search_files timed out after {time_limit_s:g} s searching for {args.pattern!r}; "
                "simplify the pattern (nested repeats such as (a+)+ backtrack without end) or narrow path or glob"
            ) from None
    if not matches:
        note = _pattern_note(args.glob)
        return ToolOutcome(ok=True, output=f"no matches for {args.pattern!r} in {args.path}{note}")
    lines = matches[:max_matches]
    if len(matches) > max_matches:
        lines.append(f"[stopped after {max_matches:,} matches; narrow the search with path or glob]")
    return text_outcome(call, "\n".join(lines))


@dataclass(frozen=True)
class _Top:
    """The folder or file a listing or search starts from, open; `shown` relative to the workspace."""

    fd: int
    shown: str
    is_dir: bool


@contextmanager
def _opened_top(call: ToolCallContext, root_fd: int, path: str, missing: str) -> Iterator[_Top]:
    """`path` opened beneath the workspace's descriptor (activities/beneath.py): a command
    swapping a folder for a symlink cannot lead the walk out, however it races it."""
    relative = call.workspace.relative(path)
    try:
        if relative == ".":
            fd = os.open(".", _OPEN_DIR, dir_fd=root_fd)
            shown = "."
        else:
            with resolve(root_fd, relative, call.workspace.aliases, path) as found:
                fd = os.open(found.name, _OPEN_ANY, dir_fd=found.parent_fd)
                shown = found.shown
    except FileNotFoundError:
        raise ToolError(f"{missing}: {path}") from None
    try:
        yield _Top(fd, shown, stat.S_ISDIR(os.fstat(fd).st_mode))
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _Entry:
    """A file (or symlink) met by a walk: its folder's descriptor and name, its path
    relative to the workspace (`shown`) and to the walk's start (`relative`, for globs)."""

    dir_fd: int
    relative: str
    shown: str
    name: str
    is_link: bool


def _walk(dir_fd: int, shown: str, relative: str) -> Iterator[_Entry]:
    """Files under the opened folder in a stable order, skipping .git and .durable-agent.

    Each folder is opened from the one above with O_NOFOLLOW, never by name from the top:
    a symlink (swapped in or not) is listed, never entered, so a walk stays in the workspace.
    """
    with os.scandir(dir_fd) as scan:
        found = sorted(scan, key=lambda e: e.name)
    folders = [e.name for e in found if e.is_dir(follow_symlinks=False) and e.name not in SKIP_DIRS]
    for entry in found:
        if entry.name in folders or (entry.name in SKIP_DIRS and entry.is_dir()):
            continue
        yield _Entry(dir_fd, _join(relative, entry.name), _join(shown, entry.name), entry.name, entry.is_symlink())
    for name in folders:
        try:
            sub = os.open(name, _OPEN_DIR | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue  # gone, or swapped for a symlink or a file since it was listed
        try:
            yield from _walk(sub, _join(shown, name), _join(relative, name))
        finally:
            os.close(sub)


def _join(folder: str, name: str) -> str:
    return name if folder in ("", ".") else f"{folder}/{name}"


def _grep(
    call: ToolCallContext,
    root_fd: int,
    entries: Iterable[_Entry],
    pattern: regex.Pattern[str],
    glob: str | None,
    deadline: float,
) -> Iterator[str]:
    """Matching lines as `path:line: text`; raises TimeoutError once past `deadline`."""
    for entry in entries:
        if not _glob_match(entry.relative or entry.name, glob):
            continue
        text = _searchable_text(call, root_fd, entry)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if pattern.search(line, timeout=left, concurrent=True):
                yield f"{entry.shown}:{number}: {clip(line)}"


def _searchable_text(call: ToolCallContext, root_fd: int, entry: _Entry) -> str | None:
    """The file's text, or None for what search skips: binary, huge, unreadable, not a
    regular file, a symlink leading out of the workspace."""
    try:
        if entry.relative == "" and not entry.is_link:  # the searched file itself, already open
            fd = os.dup(entry.dir_fd)
        elif entry.is_link:  # followed, but only as far as it stays inside
            fd = open_regular_beneath(root_fd, entry.shown, call.workspace.aliases, entry.shown)
        else:
            fd = os.open(entry.name, _OPEN_ANY, dir_fd=entry.dir_fd)
        with fdopen_regular(fd, entry.shown) as f:
            if os.fstat(f.fileno()).st_size > MAX_SEARCH_FILE_BYTES:
                return None
            return decode_text(f.read(MAX_SEARCH_FILE_BYTES + 1))
    except (OSError, NotRegularFile, WorkspaceError):
        return None


def _glob_match(relative: str, pattern: str | None) -> bool:
    """A slash-less pattern matches the file name at any depth; otherwise the relative path."""
    if pattern is None:
        return True
    if "/" not in pattern:
        return fnmatch.fnmatchcase(os.path.basename(relative), pattern)
    if fnmatch.fnmatchcase(relative, pattern):
        return True
    # "**/" also matches zero folders, as in most glob dialects.
    return pattern.startswith("**/") and fnmatch.fnmatchcase(relative, pattern[3:])


def _pattern_note(pattern: str | None) -> str:
    return f" matching {pattern!r}" if pattern else ""
