"""The archive of folded steps: written when steps are folded, read by `recall` and `export`.

    <workspace>/.durable-agent/archive/<run>/steps-<first>-<last>.jsonl   one Message a line

A chain's archive holds at most `DURABLE_AGENT_ARCHIVE_MAX_BYTES` (activities/run_files.py);
steps folded past it are not archived, and a `steps-<first>-<last>.not-archived.txt` note,
the run's transcript and `recall` say so.

A file per compaction, written atomically and named by its steps, so a retried write
writes the same file again. It lives in the workspace, like the tool journal, because
that is what every worker that runs the run's tools can see; it is not in Temporal's
history, so it outlives the retention of the run's histories and crosses continue-as-new
without being carried.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import run_files
from activities.journal import write_at
from activities.regular_files import read_regular_at
from activities.run_files import HostileLayout, RunFileCaps, run_file_caps
from activities.workspace import Workspace, WorkspaceError
from workflows.compaction import ARCHIVE_ROOT
from workflows.context import RECORD_ONLY_KINDS
from workflows.types import ArchiveWrite, ArchiveWritten, Message, RecallInput, ToolOutcome

_MESSAGES = TypeAdapter(list[Message])
NOT_ARCHIVED_SUFFIX = ".not-archived.txt"
ARCHIVE_MODE = 0o600
"""The run's own conversation: its worker's user alone reads it, as the journal."""


def archive_file(first_step: int, last_step: int) -> str:
    return f"steps-{first_step:06d}-{last_step:06d}.jsonl"


def write_steps(request: ArchiveWrite, max_bytes: int = RunFileCaps().archive_max_bytes) -> ArchiveWritten:
    """Write the steps, unless that takes the chain's archive over `max_bytes`: then the steps
    are folded without being archived, a small note file says so, and so does the result."""
    root = Workspace(request.workspace).root
    name = archive_file(request.first_step, request.last_step)
    data = b"".join(m.model_dump_json(exclude_defaults=True).encode() + b"\n" for m in request.messages)
    with _opened_archive(root, request.archive_dir) as folder_fd:
        held = _archived_bytes(folder_fd, name)
        if held + len(data) > max_bytes:
            return _not_archived(request, folder_fd, name, held, len(data), max_bytes)
        write_at(folder_fd, name, data, ARCHIVE_MODE)
    return ArchiveWritten(path=f"{request.archive_dir}/{name}", messages=len(request.messages), bytes=len(data))


@contextmanager
def _opened_archive(root: str, archive_dir: str) -> Iterator[int]:
    """The run's archive folder, made if missing, through descriptors from the workspace's
    (run_files): never through a link, nor through a folder on the workspace's path swapped for one."""
    workflow_id = activity.info().workflow_id if activity.in_activity() else ""
    with run_files.opened_chain(root, "archive", _chain_of(archive_dir), workflow_id) as fd:
        yield fd


def _chain_of(archive_dir: str) -> str:
    """The run chain of an archive folder, which the workflow names `ARCHIVE_ROOT/<chain>`."""
    chain = archive_dir.rsplit("/", 1)[-1]
    if archive_dir != f"{ARCHIVE_ROOT}/{chain}" or chain in ("", ".", ".."):
        raise HostileLayout(f"{archive_dir} is not a run's archive folder ({ARCHIVE_ROOT}/<run>)")
    return chain


def _archived_bytes(folder_fd: int, except_name: str) -> int:
    """The archive's bytes, leaving out the file about to be (re)written."""
    with os.scandir(folder_fd) as entries:
        return sum(
            e.stat(follow_symlinks=False).st_size
            for e in entries
            if fnmatch(e.name, "steps-*.jsonl") and e.name != except_name and e.is_file(follow_symlinks=False)
        )


def _not_archived(
    request: ArchiveWrite, folder_fd: int, name: str, held: int, size: int, max_bytes: int
) -> ArchiveWritten:
    note = (
        f"steps {request.first_step}-{request.last_step} ({size:,} bytes) were folded without being archived: "
        f"the run's archive holds {held:,} bytes and its cap is {max_bytes:,} (DURABLE_AGENT_ARCHIVE_MAX_BYTES); "
        "`recall` and `export` cannot return them"
    )
    write_at(folder_fd, f"{name.removesuffix('.jsonl')}{NOT_ARCHIVED_SUFFIX}", note.encode() + b"\n", ARCHIVE_MODE)
    activity.logger.warning("archive %s: %s", request.archive_dir, note)
    return ArchiveWritten(path="", messages=len(request.messages), bytes=0, not_archived=note)


def read_archive(folder: Path) -> list[Message]:
    """Every archived message of a run, in step order; a damaged file is an error that says which."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        return _archived_messages(fd, str(folder))
    finally:
        os.close(fd)


def _archived_messages(folder_fd: int, shown: str) -> list[Message]:
    messages: list[Message] = []
    for name in _names(folder_fd, "steps-*.jsonl"):
        data = read_regular_at(folder_fd, name)
        if data is None:
            continue  # not a regular file: never one of ours, nor followed
        try:
            messages += _MESSAGES.validate_json(b"[" + b",".join(data.splitlines()) + b"]")
        except ValidationError as e:
            raise ValueError(f"archive file {shown}/{name} is damaged: {e.errors()[0]['msg']}") from None
    return messages


def _not_archived_notes(folder_fd: int) -> list[str]:
    """What the notes left at the archive's cap say, in step order."""
    notes = (read_regular_at(folder_fd, name) for name in _names(folder_fd, f"steps-*{NOT_ARCHIVED_SUFFIX}"))
    return [note.decode(errors="replace").strip() for note in notes if note is not None]


def _names(folder_fd: int, pattern: str) -> list[str]:
    with os.scandir(folder_fd) as entries:
        return sorted(e.name for e in entries if fnmatch(e.name, pattern))


@contextmanager
def _archive_to_read(root: str, archive_dir: str) -> Iterator[int | None]:
    """The run's archive folder opened as `_opened_archive` opens it, without making it: None if
    there is none."""
    with ExitStack() as stack:
        try:
            fd: int | None = stack.enter_context(run_files.reserved_folder(root, "archive", _chain_of(archive_dir)))
        except FileNotFoundError:
            fd = None
        yield fd


def recall_text(request: RecallInput) -> ToolOutcome:
    """The folded steps asked for, verbatim, grouped by step, within the output budget."""
    try:
        with _archive_to_read(Workspace(request.workspace).root, request.archive_dir) as folder_fd:
            archived = [] if folder_fd is None else _archived_messages(folder_fd, request.archive_dir)
            notes = [] if folder_fd is None else _not_archived_notes(folder_fd)
    except (ValueError, HostileLayout, OSError) as e:  # retrying cannot repair a damaged or planted archive
        return ToolOutcome(ok=False, error=f"the archive cannot be read: {e}")
    by_step: dict[int, list[Message]] = {}
    for message in archived:
        if message.kind not in RECORD_ONLY_KINDS:  # what the model was sent, nothing else
            by_step.setdefault(message.step, []).append(message)
    steps = _selected(by_step, request)
    if not steps:
        asked = f"query {request.query!r}" if request.query else f"steps {request.first_step}-{request.last_step}"
        lost = "".join(f" Note: {note}." for note in notes)
        return ToolOutcome(
            ok=True,
            output=f"No folded step matches {asked}. Steps from {request.in_context_from} on are "
            f"still in your context, verbatim.{lost}",
        )
    parts: list[str] = []
    used = 0
    for index, step in enumerate(steps):
        text = _step_text(step, by_step[step])
        if parts and used + len(text) > request.output_chars:
            rest = steps[index:]
            parts.append(f"... {len(rest)} more matching step(s) ({rest[0]}-{rest[-1]}): ask for fewer steps.")
            break
        parts.append(text)
        used += len(text)
    return ToolOutcome(ok=True, output="\n\n".join(parts))


def _selected(by_step: dict[int, list[Message]], request: RecallInput) -> list[int]:
    steps = sorted(by_step)
    if request.first_step is not None and request.last_step is not None:
        steps = [s for s in steps if request.first_step <= s <= request.last_step]
    if request.query:
        needle = request.query.casefold()
        steps = [s for s in steps if any(needle in _searchable(m) for m in by_step[s])]
    return steps


def _searchable(message: Message) -> str:
    return " ".join([message.content or "", *(c.arguments for c in message.tool_calls)]).casefold()


def _step_text(step: int, messages: list[Message]) -> str:
    lines = [f"--- step {step} ---"]
    for m in messages:
        label = m.role if m.role != "tool" else f"tool result ({m.tool_name or m.kind}, {m.tool_call_id})"
        if m.kind and m.role != "tool":
            label += f" ({m.kind})"
        if m.content:
            lines.append(f"{label}:\n{m.content}")
        lines += [f"{m.role} called {c.name} {c.arguments} ({c.id})" for c in m.tool_calls]
    return "\n".join(lines)


class ArchiveActivities:
    """`archive_steps` and the `recall` tool; the workflow runs both as local activities."""

    def __init__(self, caps: RunFileCaps | None = None) -> None:
        """`caps`: what one chain's archive holds; default from the environment."""
        self._caps = caps if caps is not None else run_file_caps()

    def all(self) -> list[Any]:
        return [self.archive_steps, self.recall]

    @activity.defn(name="archive_steps")
    async def archive_steps(self, request: ArchiveWrite) -> ArchiveWritten:
        try:
            return await asyncio.to_thread(write_steps, request, self._caps.archive_max_bytes)
        except (WorkspaceError, HostileLayout) as e:
            raise ApplicationError(str(e), type="WorkspaceError", non_retryable=True) from e
        except OSError as e:
            raise ApplicationError(f"archive_steps could not write: {e}", type="ArchiveWriteFailed") from e

    @activity.defn(name="recall")
    async def recall(self, request: RecallInput) -> ToolOutcome:
        try:
            return await asyncio.to_thread(recall_text, request)
        except WorkspaceError as e:
            return ToolOutcome(ok=False, error=str(e))
