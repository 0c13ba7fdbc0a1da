"""The tool activities: every file and shell operation the model can ask for (DESIGN §5).

One activity per tool, named after it, taking `ToolCallInput` and returning `ToolOutcome`.

Errors are sorted three ways:
* what the model can act on (bad arguments, a path outside the workspace, a missing or
  binary file, an ambiguous edit, a timeout) comes back as `ToolOutcome(ok=False)`, and
  the run goes on. When `ok` is False, `error` is the whole message for the model,
  partial output included, and `output` is empty;
* what a retry may cure (EIO, ENOSPC, EMFILE, ...) is raised for Temporal to retry;
* anything else raised is a bug that would fail the same way again: a non-retryable
  `ApplicationError`.

Output longer than `ToolCallInput.output_chars` keeps its head and tail for the model and
is saved whole under `<workspace>/.durable-agent/outputs/`, named by the call's key.
"""

from __future__ import annotations

import asyncio
import errno
import fnmatch
import hashlib
import itertools
import os
import re
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.host import boot_id, proc_stat
from activities.journal import Journal, atomic_write, key_digest
from activities.sandbox import RESERVED_DIR, SandboxError, Workspace
from workflows.tool_specs import (
    EditFileArgs,
    ListFilesArgs,
    ReadFileArgs,
    RunCommandArgs,
    SearchFilesArgs,
    ToolArgumentError,
    WriteFileArgs,
    validate_arguments,
)
from workflows.types import ToolCallInput, ToolOutcome

OUTPUTS_DIR = f"{RESERVED_DIR}/outputs"
SKIP_DIRS = frozenset({".git", RESERVED_DIR})
MAX_LINE_CHARS = 2_000
"""Longer lines (minified code, data) are clipped so one line cannot eat the whole budget."""
MAX_SEARCH_FILE_BYTES = 20_000_000
"""Bigger files are skipped by search_files: they are data, not source, and would fill memory."""
SNIFF_BYTES = 8_192
MARKER_RESERVE = 200
"""Room left in the output budget for the truncation marker and the exit-code line."""
SECRET_ENV = frozenset({"OPENAI_API_KEY", "TEMPORAL_API_KEY", "DURABLE_AGENT_ENCRYPTION_KEY"})
SECRET_ENV_PREFIX = "TEMPORAL_TLS_"
"""Worker secrets a command must not see: the model could print them into history."""

INTERRUPTED = (
    "the worker running this command was killed before it finished; the command may have "
    "partially run; check its effects before re-running it"
)
CANCELLED = "the command was cancelled and its process group killed; it may have partially run"

# OSErrors that describe the path rather than the machine: retrying cannot change them.
_PATH_ERRNOS: dict[int, str] = {
    errno.ENOENT: "no such file or folder",
    errno.EISDIR: "is a folder, not a file (list_files shows what it holds)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "already exists as a file, so it cannot be a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENAMETOOLONG: "file name too long",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EROFS: "read-only file system",
}


class ToolError(Exception):
    """An expected failure of a tool call; the message is written for the model."""


_EXPECTED = (ToolError, SandboxError, ToolArgumentError)

Work = Callable[["_Call", Any], Awaitable[ToolOutcome]]


class ToolActivities:
    """The six tool activities, bound to one worker's options; register `all()`.

    Exactly once: `write_file`, `edit_file` and `run_command` record their outcome in the
    workspace journal (`activities/journal.py`) under the call's idempotency key, and a
    retry of the same key returns the recorded outcome without acting again.

    `run_command` runs `bash -c` in the workspace, in a process group of its own, with
    stdin from /dev/null and stderr merged into stdout (the model reads them interleaved,
    as in a terminal). The group never outlives the call: on timeout, on cancellation, and
    after bash exits, whatever is left gets SIGTERM, then SIGKILL after `kill_grace_s`.
    A non-zero exit code is a normal result (`ok=True`, the text starts with the exit
    code): the model ran a command and reads what it said. `ok=False` means the tool could
    not give a full answer: a timeout, a cancellation or an interrupted earlier attempt.
    """

    def __init__(
        self,
        *,
        command_timeout_s: float = 120.0,
        kill_grace_s: float = 2.0,
        max_list_entries: int = 1_000,
        max_search_matches: int = 200,
    ) -> None:
        self._command_timeout_s = command_timeout_s
        self._kill_grace_s = kill_grace_s
        self._max_list_entries = max_list_entries
        self._max_search_matches = max_search_matches

    def all(self) -> list[Callable[[ToolCallInput], Awaitable[ToolOutcome]]]:
        return [
            self.read_file,
            self.write_file,
            self.edit_file,
            self.list_files,
            self.search_files,
            self.run_command,
        ]

    @activity.defn(name="read_file")
    async def read_file(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve("read_file", input, partial(asyncio.to_thread, _read_file))

    @activity.defn(name="write_file")
    async def write_file(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve("write_file", input, partial(asyncio.to_thread, _write_file))

    @activity.defn(name="edit_file")
    async def edit_file(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve("edit_file", input, partial(asyncio.to_thread, _edit_file))

    @activity.defn(name="list_files")
    async def list_files(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve("list_files", input, partial(asyncio.to_thread, self._list_files))

    @activity.defn(name="search_files")
    async def search_files(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve("search_files", input, partial(asyncio.to_thread, self._search_files))

    @activity.defn(name="run_command")
    async def run_command(self, input: ToolCallInput) -> ToolOutcome:
        return await self._serve("run_command", input, self._run_command)

    async def _serve(self, name: str, input: ToolCallInput, work: Work) -> ToolOutcome:
        """Heartbeat, re-validate, run the tool and sort its errors (see the module docstring).

        The heartbeats come from a background task, so `work` must leave the event loop
        free: file tools run in a thread, run_command awaits its process.
        """
        async with heartbeating():
            try:
                # Defence in depth: the workflow validated already, but histories outlive code.
                args = validate_arguments(name, input.arguments)
                call = await asyncio.to_thread(_Call.open, input)
                return await work(call, args)
            except _EXPECTED as e:
                return ToolOutcome(ok=False, error=str(e))
            except OSError as e:
                if e.errno not in _PATH_ERRNOS:
                    raise  # the machine, not the path: a retry may succeed
                return ToolOutcome(ok=False, error=_describe_os_error(e, input.workspace))
            except ApplicationError:
                raise
            except Exception as e:
                raise ApplicationError(
                    f"{name} failed unexpectedly: {type(e).__name__}: {e}", type="ToolBug", non_retryable=True
                ) from e

    # --- list_files and search_files ---------------------------------------------------

    def _list_files(self, call: _Call, args: ListFilesArgs) -> ToolOutcome:
        folder = call.workspace.resolve(args.path)
        if not folder.is_dir():
            raise ToolError(
                f"{args.path} is a file, not a folder" if folder.exists() else f"no such folder: {args.path}"
            )
        found = (p for p in _walk(folder) if _glob_match(os.path.relpath(p, folder), args.pattern))
        entries = list(itertools.islice(found, self._max_list_entries + 1))
        if not entries:
            return ToolOutcome(ok=True, output=f"no files under {args.path}" + _pattern_note(args.pattern))
        lines = sorted(call.workspace.display(p) for p in entries[: self._max_list_entries])
        if len(entries) > self._max_list_entries:
            cap = self._max_list_entries
            lines.append(
                f"[more than {cap:,} entries; showing the first {cap:,}: "
                "narrow the listing with path or pattern]"
            )
        return _text_outcome(call, "\n".join(lines))

    def _search_files(self, call: _Call, args: SearchFilesArgs) -> ToolOutcome:
        try:
            regex = re.compile(args.pattern)
        except re.error as e:
            raise ToolError(f"invalid regular expression {args.pattern!r}: {e}") from e
        target = call.workspace.resolve(args.path)
        if not target.exists():
            raise ToolError(f"no such file or folder: {args.path}")
        found = _grep(call.workspace, target, regex, args.glob)
        matches = list(itertools.islice(found, self._max_search_matches + 1))
        if not matches:
            note = _pattern_note(args.glob)
            return ToolOutcome(ok=True, output=f"no matches for {args.pattern!r} in {args.path}{note}")
        lines = matches[: self._max_search_matches]
        if len(matches) > self._max_search_matches:
            lines.append(
                f"[stopped after {self._max_search_matches:,} matches; narrow the search with path or glob]"
            )
        return _text_outcome(call, "\n".join(lines))

    # --- run_command -------------------------------------------------------------------

    async def _run_command(self, call: _Call, args: RunCommandArgs) -> ToolOutcome:
        """Run the command at most once per idempotency key.

        A completed journal entry is returned as is. A start record without completion
        means an earlier attempt's worker died mid-command: its process group is killed if
        it still runs on this host, and the call fails with INTERRUPTED instead of running
        the command a second time; only the model can judge whether a re-run is safe.
        """
        journal, key = call.journal, call.input.idempotency_key
        recorded = await asyncio.to_thread(journal.completed, key)
        if recorded is not None:
            return recorded
        leftover = await asyncio.to_thread(journal.started, key)
        try:
            if leftover is not None:
                note = await asyncio.to_thread(_stop_leftover, leftover, self._kill_grace_s)
                outcome = ToolOutcome(ok=False, error=f"{INTERRUPTED} ({note})")
            else:
                outcome = await self._execute(call, args)
        except asyncio.CancelledError:
            await asyncio.to_thread(journal.complete, key, ToolOutcome(ok=False, error=CANCELLED))
            raise
        await asyncio.to_thread(journal.complete, key, outcome)
        return outcome

    async def _execute(self, call: _Call, args: RunCommandArgs) -> ToolOutcome:
        timeout_s = args.timeout_s or self._command_timeout_s
        # Recorded before the launch: a crash in between must not lead to a silent second run.
        await asyncio.to_thread(call.journal.start, call.input.idempotency_key, {"command": args.command})
        with call.capture() as capture:
            async with _OutputPipe(capture, self._kill_grace_s) as output:
                process = await _spawn(call, args.command, output)
                timed_out = await self._supervise(call, args.command, process, output, timeout_s)
        if timed_out:
            return capture.outcome(
                f"command timed out after {timeout_s:g} s; it and every process it started were killed. "
                "Output before the timeout:\n",
                ok=False,
            )
        return capture.outcome(f"{_exit_text(process.returncode)}\n")

    async def _supervise(
        self,
        call: _Call,
        command: str,
        process: asyncio.subprocess.Process,
        output: _OutputPipe,
        timeout_s: float,
    ) -> bool:
        """Wait for the command; True if it timed out. Its process group never outlives this call."""
        try:
            record = _group_record(process.pid, command)
            await asyncio.to_thread(call.journal.start, call.input.idempotency_key, record)
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
            await asyncio.to_thread(kill_process_group, process.pid, self._kill_grace_s)
            await process.wait()


async def _spawn(call: _Call, command: str, output: _OutputPipe) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=call.workspace.root,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output.write_fd,
            stderr=output.write_fd,
            start_new_session=True,
            env=_command_env(),
        )
    except OSError:
        # Nothing ran, so a retry may run it.
        await asyncio.to_thread(call.journal.forget_start, call.input.idempotency_key)
        raise
    finally:
        # Only the command's processes hold the write end now: EOF means all of them closed it.
        output.close_write_end()


# --- one call ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    input: ToolCallInput
    workspace: Workspace
    journal: Journal

    @classmethod
    def open(cls, input: ToolCallInput) -> _Call:
        workspace = Workspace(input.workspace)
        return cls(input, workspace, Journal(workspace.root))

    def capture(self) -> OutputCapture:
        return OutputCapture(
            self.input.output_chars, self.workspace.root, key_digest(self.input.idempotency_key)
        )


def _exactly_once(call: _Call, act: Callable[[], ToolOutcome]) -> ToolOutcome:
    """Return the recorded outcome of this key, or act and record what happened."""
    key = call.input.idempotency_key
    recorded = call.journal.completed(key)
    if recorded is not None:
        return recorded
    outcome = act()
    call.journal.complete(key, outcome)
    return outcome


# --- read, write and edit ------------------------------------------------------------


def _read_file(call: _Call, args: ReadFileArgs) -> ToolOutcome:
    path = call.workspace.resolve(args.path)
    size = path.stat().st_size
    first = args.offset or 1
    last = first + args.limit - 1 if args.limit else None
    with path.open("rb") as f:
        if b"\0" in f.read(SNIFF_BYTES):
            raise _binary(args.path, size)
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
    for total, raw in enumerate(f, start=1):
        if full or total < first or (last is not None and total > last):
            continue  # still counted: the model is told how long the file is
        text = _decode_text(raw)
        if text is None:
            raise _binary(shown, size)
        line = text.removesuffix("\n").removesuffix("\r")
        entry = f"{total:6}\t{_clip(line)}"
        if numbered and used + len(entry) + 1 > budget:
            full = True
            continue
        numbered.append(entry)
        used += len(entry) + 1
    return numbered, total


def _write_file(call: _Call, args: WriteFileArgs) -> ToolOutcome:
    def act() -> ToolOutcome:
        path = call.workspace.resolve(args.path, for_write=True)
        data = args.content.encode()
        atomic_write(path, data)
        lines = len(args.content.splitlines())
        return ToolOutcome(
            ok=True, output=f"wrote {call.workspace.display(path)} ({len(data):,} bytes, {lines:,} lines)"
        )

    return _exactly_once(call, act)


def _edit_file(call: _Call, args: EditFileArgs) -> ToolOutcome:
    """Replace text; safe to retry although the edit itself is not idempotent.

    Before writing, the expected result's hash and outcome are journalled as started. A
    retry that finds the file already holding that result knows the crashed attempt
    applied the edit, and reports it instead of applying it twice (or failing with
    "old_text not found").
    """
    key = call.input.idempotency_key

    def act() -> ToolOutcome:
        path = call.workspace.resolve(args.path, for_write=True)
        data = path.read_bytes()
        earlier = call.journal.started(key)
        if earlier is not None and earlier.get("after") == _sha256(data):
            return ToolOutcome.model_validate(earlier["outcome"])
        text = _decode_text(data)
        if text is None:
            raise _binary(args.path, len(data))
        count = text.count(args.old_text)
        _check_matches(count, args.replace_all, call.workspace.display(path))
        new_data = text.replace(args.old_text, args.new_text).encode()
        times = "1 occurrence" if count == 1 else f"{count:,} occurrences"
        outcome = ToolOutcome(
            ok=True, output=f"replaced {times} of old_text in {call.workspace.display(path)}"
        )
        call.journal.start(key, {"after": _sha256(new_data), "outcome": outcome.model_dump()})
        atomic_write(path, new_data)
        return outcome

    return _exactly_once(call, act)


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


# --- walking and searching -----------------------------------------------------------


def _walk(top: Path) -> Iterator[str]:
    """Files under `top` in a stable order, skipping .git and .durable-agent.

    Symlinked folders are listed but not entered, so a walk never leaves the workspace.
    """
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        linked = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for name in sorted(files + linked):
            yield os.path.join(folder, name)


def _grep(workspace: Workspace, target: Path, regex: re.Pattern[str], glob: str | None) -> Iterator[str]:
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
            if regex.search(line):
                yield f"{shown}:{number}: {_clip(line)}"


def _searchable_text(path: str) -> str | None:
    """The file's text, or None for what search skips: binary, huge, unreadable, not a file."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_SEARCH_FILE_BYTES:
            return None
        with open(path, "rb") as f:
            return _decode_text(f.read())
    except PermissionError:
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


# --- output --------------------------------------------------------------------------


class OutputCapture:
    """Keeps a stream's head and tail for the model and saves the whole stream to a file.

    Memory stays within the budget however much the stream carries: until the stream
    outgrows the budget everything is kept in memory; from then on the head is frozen,
    the tail rolls, and every byte also goes to `<workspace>/.durable-agent/outputs/`.
    """

    def __init__(self, budget_chars: int, workspace_root: str, digest: str) -> None:
        keep = max(budget_chars - MARKER_RESERVE, 64)
        self._head_max = keep // 2
        self._tail_max = keep - self._head_max
        self.ref = f"{OUTPUTS_DIR}/{digest}.txt"
        self._path = Path(workspace_root) / self.ref
        self._head = bytearray()
        self._tail = bytearray()
        self._file: BinaryIO | None = None
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self._file is not None

    def write(self, data: bytes) -> None:
        if self._file is None and self.total + len(data) > self._head_max + self._tail_max:
            self._spill()
        if self._file is not None:
            self._file.write(data)
        self.total += len(data)
        room = self._head_max - len(self._head)
        self._head += data[:room]
        self._tail += data[room:]
        del self._tail[: -self._tail_max]

    def text(self) -> str:
        if not self.truncated:
            return (self._head + self._tail).decode(errors="replace")
        head, tail = _whole_lines(bytes(self._head), bytes(self._tail))
        cut = self.total - len(head) - len(tail)
        gap = "" if head.endswith(b"\n") else "\n"
        return (
            f"{head.decode(errors='replace')}{gap}… {self.total:,} bytes total, {cut:,} cut; "
            f"full output: {self.ref} …\n{tail.decode(errors='replace')}"
        )

    def outcome(self, prefix: str = "", *, ok: bool = True) -> ToolOutcome:
        text = prefix + (self.text() or "(no output)")
        return ToolOutcome(
            ok=ok,
            output=text if ok else "",
            error=None if ok else text,
            full_output_ref=self.ref if self.truncated else None,
            output_bytes=self.total,
        )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> OutputCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spill(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self._path.open("wb")
        self._file.write(self._head + self._tail)  # everything so far: nothing was dropped yet


def _whole_lines(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    """Drop the partial lines at the cut (and with them any split character), unless that drops all."""
    end = head.rfind(b"\n") + 1
    start = tail.find(b"\n") + 1
    return head[: end or len(head)], tail[start:] if 0 < start < len(tail) else tail


def _text_outcome(call: _Call, text: str) -> ToolOutcome:
    with call.capture() as capture:
        capture.write(text.encode())
    return capture.outcome()


class _OutputPipe:
    """The pipe a command writes stdout and stderr to, pumped into an OutputCapture.

    Our own pipe rather than asyncio's PIPE: with that, `Process.wait()` would also wait
    for every background child to close its copy of the output.
    """

    def __init__(self, capture: OutputCapture, grace_s: float) -> None:
        self._capture = capture
        self._grace_s = grace_s
        self.write_fd: int | None = None

    async def __aenter__(self) -> _OutputPipe:
        read_fd, self.write_fd = os.pipe()
        reader = asyncio.StreamReader()
        self._transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
        )
        self._pump = asyncio.create_task(_pump(reader, self._capture))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close_write_end()
        await self.drained(self._grace_s)
        self._transport.close()  # a process that left the group could hold the pipe forever
        await self._pump

    def close_write_end(self) -> None:
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    async def drained(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for every writer to close the pipe and its data to be captured."""
        await asyncio.wait([self._pump], timeout=timeout_s)


async def _pump(reader: asyncio.StreamReader, capture: OutputCapture) -> None:
    while chunk := await reader.read(65_536):
        await asyncio.to_thread(capture.write, chunk)


# --- process groups ------------------------------------------------------------------


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
        return "it is no longer running"
    if kill_process_group(pgid, grace_s):
        return "it was still running and has now been killed"
    return "it is no longer running"


def _same_leader(pgid: int, leader_start: str | None) -> bool:
    # A live leader with another start time means the group id was reused by a new group.
    fields = proc_stat(str(pgid))
    return fields is None or leader_start is None or fields[19] == leader_start


def _command_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in SECRET_ENV and not k.startswith(SECRET_ENV_PREFIX)
    }


def _exit_text(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return f"exit code: {returncode}"


# --- small helpers -------------------------------------------------------------------


def _decode_text(data: bytes) -> str | None:
    """The UTF-8 text, or None for binary content (a NUL byte, or not valid UTF-8)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _binary(shown: str, size: int) -> ToolError:
    return ToolError(
        f"{shown} is a binary file ({size:,} bytes), not UTF-8 text; it cannot be read or edited as text"
    )


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}… [line clipped: {len(line):,} chars]"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _describe_os_error(e: OSError, workspace: str) -> str:
    reason = _PATH_ERRNOS[e.errno]
    if not e.filename:
        return reason
    root = os.path.realpath(workspace)
    filename = os.fsdecode(e.filename)
    if filename.startswith(root + os.sep):
        filename = os.path.relpath(filename, root)
    return f"{filename}: {reason}"
