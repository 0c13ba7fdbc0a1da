"""Where the CLI's lines go, escaped of terminal controls. A label, when set, starts every
line (the offline demo's)."""

from __future__ import annotations

import sys
from typing import TextIO

from workflows.visible import visible


class Console:
    def __init__(self, label: str | None = None) -> None:
        self.label = label

    def line(self, text: str = "") -> None:
        self._write(sys.stdout, text)

    def lines(self, texts: list[str]) -> None:
        for text in texts:
            self.line(text)

    def error(self, text: str) -> None:
        self._write(sys.stderr, text)

    def _write(self, stream: TextIO, text: str) -> None:
        # Model and tool text reaches every command's output: its terminal controls are
        # shown escaped, never sent to the terminal (workflows/visible.py).
        for part in visible(text).split("\n"):
            stream.write(f"{self.label} {part}\n" if self.label else f"{part}\n")
        stream.flush()  # lines must appear as steps finish, also when piped
