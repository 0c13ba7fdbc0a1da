"""`approval_diff`: what a write awaiting approval would change in its file (#23).

Read-only, run when the approval is asked: the diff recorded in history is against the
file as it was then, which is what the person approves. It reads the file through the
same checks as the file tools (inside the workspace, no symlink out, a regular file), and
its result is redacted like every activity's (activities/redaction.py).
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Awaitable, Callable

from temporalio import activity

from activities.beneath import open_regular_beneath
from activities.regular_files import NotRegularFile, fdopen_regular
from activities.tools.base import decode_text
from activities.workspace import Workspace, WorkspaceError, workspace_roots
from workflows.approval_diff import ApprovalDiff, ApprovalDiffInput
from workflows.tool_specs import EditFileArgs, WriteFileArgs

MAX_DIFFED_BYTES = 2**20
"""A larger file is not read for the diff: the person sees the call's texts, not a diff."""


class ApprovalDiffActivities:
    def __init__(self, roots: list[str] | None = None) -> None:
        self._roots = roots if roots is not None else workspace_roots()

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.approval_diff]

    @activity.defn(name="approval_diff")
    async def approval_diff(self, input: ApprovalDiffInput) -> ApprovalDiff:
        return await asyncio.to_thread(self._diff, input)

    def _diff(self, input: ApprovalDiffInput) -> ApprovalDiff:
        if input.tool == "write_file":
            write = WriteFileArgs.model_validate(input.arguments)
            path, change = write.path, lambda _: write.content
        else:
            edit = EditFileArgs.model_validate(input.arguments)
            path, change = edit.path, lambda text: _edited(text, edit)
        try:
            current = _current_text(input.workspace, path, self._roots)
            after = change(current or "")
        except (_Undiffable, WorkspaceError, NotRegularFile) as e:
            return ApprovalDiff(note=str(e))
        except OSError as e:  # the call itself will say more; the person is told why there is no diff
            return ApprovalDiff(note=f"{path} cannot be read: {e.strerror or e}")
        before_name = "/dev/null" if current is None else f"a/{path}"
        lines = difflib.unified_diff(
            (current or "").splitlines(keepends=True), after.splitlines(keepends=True), before_name, f"b/{path}"
        )
        return ApprovalDiff(diff="".join(_ended(line) for line in lines))


class _Undiffable(Exception):
    """Why no diff is shown, for the person."""


def _current_text(workspace: str, path: str, roots: list[str]) -> str | None:
    """The file's text now; None when it does not exist yet (the write creates it)."""
    folder = Workspace(workspace, roots)
    relative = folder.relative(path, for_write=True)
    with folder.opened() as root_fd:
        try:
            fd = open_regular_beneath(root_fd, relative, folder.aliases, path)
        except FileNotFoundError:
            return None
        with fdopen_regular(fd, path) as f:
            data = f.read(MAX_DIFFED_BYTES + 1)
    if len(data) > MAX_DIFFED_BYTES:
        raise _Undiffable(f"{path} is over {MAX_DIFFED_BYTES // 2**20} MiB: no diff")
    text = decode_text(data)
    if text is None:
        raise _Undiffable(f"{path} is a binary file: no diff")
    return text


def _edited(text: str, edit: EditFileArgs) -> str:
    """The edit as edit_file would apply it (activities/tools/files.py), or why it would fail."""
    count = text.count(edit.old_text)
    if count == 0:
        raise _Undiffable("old_text is not in the file as it is now: the edit would fail")
    if count > 1 and not edit.replace_all:
        raise _Undiffable(f"old_text occurs {count} times and replace_all is false: the edit would fail")
    return text.replace(edit.old_text, edit.new_text)


def _ended(line: str) -> str:
    """A diff line that lacks its line feed (a file's last line without one) gets difflib's
    marker, so the next line does not run on."""
    return line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n"
