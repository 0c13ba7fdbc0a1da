"""Where the CLI's lines go. A label, when set, starts every line (the offline demo's)."""

from __future__ import annotations

import sys
from typing import TextIO


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
        for part in text.split("\n"):
            stream.write(f"{self.label} {part}\n" if self.label else f"{part}\n")
        stream.flush()  # lines must appear as steps finish, also when piped
