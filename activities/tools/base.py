"""What every tool call shares: the call's workspace and journal, its errors, text helpers."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from temporalio import activity

from activities import run_files
from activities.journal import Journal, key_digest
from activities.run_files import RunFileCaps
from activities.tools.output import OutputCapture
from activities.workspace import Workspace
from workflows.types import ToolCallInput, ToolOutcome

MAX_LINE_CHARS = 2_000
"""Longer lines (minified code, data) are clipped so one line cannot eat the whole budget."""

# OSErrors that describe the path rather than the machine: retrying cannot change them.
PATH_ERRNOS: dict[int, str] = {
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


@dataclass(frozen=True)
class ToolCallContext:
    input: ToolCallInput
    workspace: Workspace
    journal: Journal
    caps: RunFileCaps

    @classmethod
    def open(cls, input: ToolCallInput, roots: list[str], caps: RunFileCaps) -> ToolCallContext:
        workspace = Workspace(input.workspace, roots)
        if not input.run_folder:  # recorded before per-chain folders: the shared ones, as then
            return cls(input, workspace, Journal(workspace.root), caps)
        folder = run_files.step_journal_path(workspace.root, input.run_folder, input.step)
        make = partial(run_files.make_step_journal, workspace.root, input.run_folder, input.step, _workflow_id())
        return cls(input, workspace, Journal(workspace.root, folder, caps.journal_max_bytes, make), caps)

    def capture(self) -> OutputCapture:
        digest = key_digest(self.input.idempotency_key)
        if not self.input.run_folder:
            return OutputCapture(self.input.output_chars, self.workspace.root, digest)
        return OutputCapture(
            self.input.output_chars,
            self.workspace.root,
            digest,
            chain=(self.input.run_folder, _workflow_id()),
            max_bytes=self.caps.outputs_max_bytes,
        )


OpenCall = Callable[[], ToolCallContext]
"""Opens a call's context (workspace checks, journal): tools call it in the thread they do
their own file-system work in."""


def _workflow_id() -> str:
    return activity.info().workflow_id if activity.in_activity() else ""


def exactly_once(call: ToolCallContext, act: Callable[[], ToolOutcome]) -> ToolOutcome:
    """Return the recorded outcome of this key, or act and record what happened."""
    key = call.input.idempotency_key
    recorded = call.journal.completed(key)
    if recorded is not None:
        return recorded
    call.journal.ensure_room()
    outcome = act()
    call.journal.complete(key, outcome)
    return outcome


def decode_text(data: bytes) -> str | None:
    """The UTF-8 text, or None for binary content (a NUL byte, or not valid UTF-8)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def binary(shown: str, size: int) -> ToolError:
    return ToolError(f"{shown} is a binary file ({size:,} bytes), not UTF-8 text; it cannot be read or edited as text")


def clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}… [line clipped: {len(line):,} chars]"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe_os_error(e: OSError, workspace: str) -> str:
    reason = PATH_ERRNOS[e.errno]
    if not e.filename:
        return reason
    try:
        root = os.path.realpath(workspace)
    except OSError:  # a folder on its path swapped between lstat and readlink (EINVAL): not said twice
        root = os.path.abspath(workspace)
    filename = os.fsdecode(e.filename)
    if filename.startswith(root + os.sep):
        filename = os.path.relpath(filename, root)
    elif os.path.isabs(filename):
        return f"a path outside the workspace: {reason}"  # never a host path: the model need not learn them
    return f"{filename}: {reason}"


def text_outcome(call: ToolCallContext, text: str) -> ToolOutcome:
    with call.capture() as capture:
        capture.write(text.encode())
    return capture.outcome()
