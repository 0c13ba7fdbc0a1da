"""A tool's output: head and tail for the model, the whole stream saved by reference."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import BinaryIO

from temporalio import activity

from activities import run_files
from activities.redaction import StreamRedactor, worker_redactor
from activities.regular_files import create_regular
from activities.workspace import RESERVED_DIR
from workflows.types import ToolOutcome

OUTPUTS_DIR = f"{RESERVED_DIR}/outputs"
MARKER_RESERVE = 200
"""Room left in the output budget for the truncation marker and the exit-code line."""
SAVED_OUTPUT_MAX_BYTES = 64 * 2**20
"""What one call's saved output keeps: its first 64 MiB (a command printing without end fills
no disk)."""
OUTPUTS_MAX_BYTES = 512 * 2**20
"""What `outputs/` of one workspace holds at most: before a new output is saved, the oldest
ones are dropped, each replaced by a line saying so."""


class OutputCapture:
    """Keeps a stream's head and tail for the model and saves the whole stream to a file.

    Memory stays within the budget however much the stream carries: until the stream
    outgrows the budget everything is kept in memory; from then on the head is frozen,
    the tail rolls, and every byte also goes to `<workspace>/.durable-agent/outputs/`.
    The stream is redacted of secrets (activities/redaction.py) before it is kept or saved.
    """

    def __init__(
        self,
        budget_chars: int,
        workspace_root: str,
        digest: str,
        chain: tuple[str, str] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """`chain`: the run chain's folder name and workflow id: the output goes to the
        chain's own folder, which holds at most `max_bytes`; None: the shared folder."""
        keep = max(budget_chars - MARKER_RESERVE, 64)
        self._head_max = keep // 2
        self._tail_max = keep - self._head_max
        self._workspace_root = workspace_root
        self._chain = chain
        self._max_bytes = max_bytes if max_bytes is not None else OUTPUTS_MAX_BYTES
        self._save_max = min(SAVED_OUTPUT_MAX_BYTES, self._max_bytes // 4)
        self.ref = f"{OUTPUTS_DIR}/{chain[0]}/{digest}.txt" if chain else f"{OUTPUTS_DIR}/{digest}.txt"
        self._path = Path(workspace_root) / self.ref
        self.dropped: list[tuple[str, int]] = []
        """Earlier saved outputs of the folder replaced by a note to make room: (name, bytes)."""
        self._head = bytearray()
        self._tail = bytearray()
        self._file: BinaryIO | None = None
        self._redactor = StreamRedactor(worker_redactor())
        self.total = 0
        self._saved = 0

    @property
    def truncated(self) -> bool:
        return self._file is not None

    def write(self, data: bytes) -> None:
        self._keep(self._redactor.feed(data))

    def _keep(self, data: bytes) -> None:
        if self._file is None and self.total + len(data) > self._head_max + self._tail_max:
            self._spill()
        if self._file is not None and self._saved < self._save_max:
            kept = data[: self._save_max - self._saved]
            self._file.write(kept)
            self._saved += len(kept)
        self.total += len(data)
        room = self._head_max - len(self._head)
        self._head += data[:room]
        self._tail += data[room:]
        del self._tail[: -self._tail_max]

    def tail_text(self, chars: int) -> str:
        """The last `chars` characters kept so far (redacted): a running command's latest output."""
        return bytes(self._head + self._tail)[-4 * chars :].decode(errors="replace")[-chars:]

    def text(self) -> str:
        if not self.truncated:
            return (self._head + self._tail).decode(errors="replace")
        head, tail = _whole_lines(bytes(self._head), bytes(self._tail))
        cut = self.total - len(head) - len(tail)
        gap = "" if head.endswith(b"\n") else "\n"
        saved = f"full output: {self.ref}"
        if self._saved < self.total:
            saved = f"its first {self._saved:,} bytes saved in {self.ref}, {self.total - self._saved:,} not saved"
        return (
            f"{head.decode(errors='replace')}{gap}… {self.total:,} bytes total, {cut:,} cut; "
            f"{saved} …\n{tail.decode(errors='replace')}{self._dropped_note()}"
        )

    def _dropped_note(self) -> str:
        if not self.dropped:
            return ""
        names = ", ".join(name for name, _ in self.dropped[:5]) + (", …" if len(self.dropped) > 5 else "")
        held = sum(size for _, size in self.dropped)
        return (
            f"\n[to keep this run's saved outputs within {self._max_bytes:,} bytes, {len(self.dropped)} earlier "
            f"saved output(s) ({held:,} bytes) were replaced by a note: {names}]"
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
        self._keep(self._redactor.flush())
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> OutputCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spill(self) -> None:
        # Made and written through the folder's descriptor: a link in place of any level, or a
        # folder on the workspace's path swapped for one, is refused, never written through.
        if self._chain is None:
            folder = run_files.made_reserved(self._workspace_root, "outputs")
        else:
            folder = run_files.opened_chain(self._workspace_root, "outputs", *self._chain)
        with folder as folder_fd:
            self.dropped = drop_oldest_outputs(folder_fd, self._max_bytes - self._save_max)
            self._file = create_regular(self._path.name, folder_fd)
        if self.dropped:
            activity.logger.warning(
                "%s over its cap of %d bytes: replaced %d saved output(s) (%d bytes) by a note: %s",
                self._path.parent,
                self._max_bytes,
                len(self.dropped),
                sum(size for _, size in self.dropped),
                ", ".join(name for name, _ in self.dropped),
            )
        self._file.write(self._head + self._tail)  # everything so far: nothing was dropped yet
        self._saved = len(self._head) + len(self._tail)


def drop_oldest_outputs(folder_fd: int, keep_bytes: int) -> list[tuple[str, int]]:
    """Replace the oldest saved outputs of the opened folder by a line saying so until it
    holds at most `keep_bytes`; returns what was replaced: (file name, bytes it held)."""
    entries = []
    with os.scandir(folder_fd) as listed:
        for entry in listed:
            if entry.is_file(follow_symlinks=False) and entry.name != run_files.IDENTITY_FILE:
                stat = entry.stat(follow_symlinks=False)
                entries.append((stat.st_mtime, stat.st_size, entry.name))
    total = sum(size for _, size, _ in entries)
    dropped: list[tuple[str, int]] = []
    for _, size, name in sorted(entries):
        if total <= keep_bytes:
            break
        note = f"[dropped: this output held {size:,} bytes; the folder keeps {keep_bytes:,} bytes of older outputs]\n"
        with create_regular(name, folder_fd) as f:
            f.write(note.encode())
        dropped.append((name, size))
        total -= size - len(note)
    return dropped


def _whole_lines(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    """Drop the partial lines at the cut (and with them any split character), unless that drops all."""
    end = head.rfind(b"\n") + 1
    start = tail.find(b"\n") + 1
    return head[: end or len(head)], tail[start:] if 0 < start < len(tail) else tail


class OutputPipe:
    """The pipe a command writes stdout and stderr to, pumped into an OutputCapture.

    Our own pipe rather than asyncio's PIPE: with that, `Process.wait()` would also wait
    for every background child to close its copy of the output.
    """

    def __init__(self, capture: OutputCapture, grace_s: float) -> None:
        self._capture = capture
        self._grace_s = grace_s
        self.write_fd: int | None = None

    async def __aenter__(self) -> OutputPipe:
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
