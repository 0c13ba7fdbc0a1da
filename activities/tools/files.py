"""read_file, write_file and edit_file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

from activities.beneath import Resolved, make_parents, open_regular_beneath, open_resolved, replace_file, resolve
from activities.regular_files import fdopen_regular
from activities.tools.base import ToolCallContext, ToolError, binary, clip, decode_text, exactly_once, sha256
from workflows.tool_specs import EditFileArgs, ReadFileArgs, WriteFileArgs
from workflows.types import ToolOutcome

SNIFF_BYTES = 8_192
MAX_LINE_READ = 64 * 1024
"""Bytes of one line read into memory; the rest of a longer line is skipped (it is clipped anyway)."""
MAX_EDIT_BYTES = 16 * 2**20
"""edit_file holds the file and its edited copy in memory: larger files are refused."""


def _open_file(call: ToolCallContext, root_fd: int, path: str) -> BinaryIO:
    relative = call.workspace.relative(path)
    return fdopen_regular(open_regular_beneath(root_fd, relative, call.workspace.aliases, path), path)


def read_file(call: ToolCallContext, args: ReadFileArgs) -> ToolOutcome:
    first = args.offset or 1
    last = first + args.limit - 1 if args.limit else None
    with call.workspace.opened() as root_fd, _open_file(call, root_fd, args.path) as f:
        size = os.fstat(f.fileno()).st_size
        if b"\0" in f.read(SNIFF_BYTES):
            raise binary(args.path, size)
        f.seek(0)
        numbered, total = _number_lines(f, first, last, call.input.output_chars, args.path, size)
    if total == 0:
        return ToolOutcome(ok=True, output="(empty file)", output_bytes=0)
    if first > total:
        raise ToolError(f"offset {first} is past the end of {args.path}, which has {total:,} lines")
    end = first + len(numbered) - 1
    if len(numbered) < total:
        more = f"; read more with offset={end + 1}" if end < total else ""
        numbered.append(f"[showing lines {first:,}-{end:,} of {total:,}{more}]")
    return ToolOutcome(ok=True, output="\n".join(numbered), output_bytes=size)


def _number_lines(
    f: BinaryIO, first: int, last: int | None, budget: int, shown: str, size: int
) -> tuple[list[str], int]:
    """Lines first..last numbered like `cat -n`, within `budget` chars; and the file's line count."""
    numbered: list[str] = []
    used = 0
    full = False
    total = 0
    for total, raw in enumerate(_lines(f), start=1):
        if full or total < first or (last is not None and total > last):
            continue  # still counted: the model is told how long the file is
        text = decode_text(raw)
        if text is None:
            raise binary(shown, size)
        line = text.removesuffix("\n").removesuffix("\r")
        entry = f"{total:6}\t{clip(line)}"
        if numbered and used + len(entry) + 1 > budget:
            full = True
            continue
        numbered.append(entry)
        used += len(entry) + 1
    return numbered, total


def _lines(f: BinaryIO) -> Iterator[bytes]:
    """The file's lines, each at most MAX_LINE_READ bytes: a huge file never sits in memory whole."""
    while line := f.readline(MAX_LINE_READ):
        if len(line) == MAX_LINE_READ and not line.endswith(b"\n"):
            while (rest := f.readline(MAX_LINE_READ)) and not rest.endswith(b"\n"):
                pass
        yield line


def write_file(call: ToolCallContext, args: WriteFileArgs) -> ToolOutcome:
    relative = call.workspace.relative(args.path, for_write=True)  # before the journal writes anything
    aliases = call.workspace.aliases

    def act() -> ToolOutcome:
        data = args.content.encode()
        with call.workspace.opened() as root_fd:
            make_parents(root_fd, relative, aliases, args.path)
            with resolve(root_fd, relative, aliases, args.path) as found:
                replace_file(root_fd, found, data)
        lines = len(args.content.splitlines())
        return ToolOutcome(ok=True, output=f"wrote {found.shown} ({len(data):,} bytes, {lines:,} lines)")

    return exactly_once(call, act)


def edit_file(call: ToolCallContext, args: EditFileArgs) -> ToolOutcome:
    """Replace text; safe to retry although the edit itself is not idempotent.

    Before writing, the expected result's hash and outcome are journalled as started. A
    retry that finds the file already holding that result knows the crashed attempt
    applied the edit, and reports it instead of applying it twice (or failing with
    "old_text not found").
    """
    relative = call.workspace.relative(args.path, for_write=True)

    def act() -> ToolOutcome:
        with call.workspace.opened() as root_fd, resolve(root_fd, relative, call.workspace.aliases, args.path) as found:
            return _edit(call, args, root_fd, found)

    return exactly_once(call, act)


def _edit(call: ToolCallContext, args: EditFileArgs, root_fd: int, found: Resolved) -> ToolOutcome:
    key = call.input.idempotency_key
    with fdopen_regular(open_resolved(found), found.shown) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_EDIT_BYTES:
            raise ToolError(
                f"{found.shown} is {size:,} bytes, over edit_file's {MAX_EDIT_BYTES // 2**20} MiB; "
                "change it with run_command (sed, a script) instead"
            )
        data = f.read()
    earlier = call.journal.started(key)
    if earlier is not None and earlier.get("after") == sha256(data):
        return ToolOutcome.model_validate(earlier["outcome"])
    text = decode_text(data)
    if text is None:
        raise binary(found.shown, len(data))
    count = text.count(args.old_text)
    _check_matches(count, args.replace_all, found.shown)
    new_data = text.replace(args.old_text, args.new_text).encode()
    times = "1 occurrence" if count == 1 else f"{count:,} occurrences"
    outcome = ToolOutcome(ok=True, output=f"replaced {times} of old_text in {found.shown}")
    call.journal.start(key, {"after": sha256(new_data), "outcome": outcome.model_dump()})
    replace_file(root_fd, found, new_data)
    return outcome


def _check_matches(count: int, replace_all: bool, shown: str) -> None:
    if count == 0:
        raise ToolError(
            f"old_text was not found in {shown}; read the file again and copy the exact text, "
            "including whitespace and indentation"
        )
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_text occurs {count} times in {shown}; include more surrounding lines to make it "
            "unique, or set replace_all to true"
        )
