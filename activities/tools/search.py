"""list_files and search_files: walking a workspace and searching its text."""

from __future__ import annotations

import fnmatch
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import regex

from activities.regular_files import NotRegularFile, read_regular
from activities.tools.base import ToolCallContext, ToolError, clip, decode_text, text_outcome
from activities.workspace import RESERVED_DIR, Workspace
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


def list_files(call: ToolCallContext, args: ListFilesArgs, max_entries: int) -> ToolOutcome:
    folder = call.workspace.resolve(args.path)
    if not folder.is_dir():
        raise ToolError(f"{args.path} is a file, not a folder" if folder.exists() else f"no such folder: {args.path}")
    found = (p for p in _walk(folder) if _glob_match(os.path.relpath(p, folder), args.pattern))
    entries = list(itertools.islice(found, max_entries + 1))
    if not entries:
        return ToolOutcome(ok=True, output=f"no files under {args.path}" + _pattern_note(args.pattern))
    lines = sorted(call.workspace.display(p) for p in entries[:max_entries])
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
    target = call.workspace.resolve(args.path)
    if not target.exists():
        raise ToolError(f"no such file or folder: {args.path}")
    found = _grep(call.workspace, target, pattern, args.glob, time.monotonic() + time_limit_s)
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


def _walk(top: Path) -> Iterator[str]:
    """Files under `top` in a stable order, skipping .git and .durable-agent.

    Symlinked folders are listed but not entered, so a walk never leaves the workspace.
    """
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        linked = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for name in sorted(files + linked):
            yield os.path.join(folder, name)


def _grep(
    workspace: Workspace, target: Path, pattern: regex.Pattern[str], glob: str | None, deadline: float
) -> Iterator[str]:
    """Matching lines as `path:line: text`; raises TimeoutError once past `deadline`."""
    base = target if target.is_dir() else target.parent
    paths: Iterable[str] = _walk(target) if target.is_dir() else [str(target)]
    for path in paths:
        if not _glob_match(os.path.relpath(path, base), glob):
            continue
        if not workspace.contains(os.path.realpath(path)):
            continue  # a symlink to a file outside the workspace
        text = _searchable_text(path)
        if text is None:
            continue
        shown = workspace.display(path)
        for number, line in enumerate(text.splitlines(), start=1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if pattern.search(line, timeout=left, concurrent=True):
                yield f"{shown}:{number}: {clip(line)}"


def _searchable_text(path: str) -> str | None:
    """The file's text, or None for what search skips: binary, huge, unreadable, not a regular file."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_SEARCH_FILE_BYTES:
            return None
        return decode_text(read_regular(path))
    except (PermissionError, NotRegularFile, IsADirectoryError):
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
