"""The user's tool `python -m bench tools` measures: the same work as `write_file`'s."""

from __future__ import annotations

from pathlib import Path

from durable_agent import tool


@tool(effect="write", timeout_s=5)
def note(name: str, text: str) -> str:
    """Write a note."""
    path = Path("/tmp/bench-tools-notes") / f"{name}.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return f"wrote {len(text)} characters"
