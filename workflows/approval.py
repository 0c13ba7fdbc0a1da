"""Which tool calls wait for a person (`AgentInput.approval`)."""

from __future__ import annotations

import re
from typing import Any

from workflows.tool_specs import CUT_SUMMARY
from workflows.types import Approval, PendingApproval
from workflows.visible import one_line, visible


def approval_reason(tool: str, arguments: dict[str, Any], approval: Approval) -> str | None:
    """Why this call needs a person's decision, or None when it may run at once."""
    if tool in approval.tools:
        return f"every {tool} call needs approval"
    if tool != "run_command":
        return None
    command = str(arguments.get("command", ""))
    for pattern in approval.commands:
        if re.search(pattern, command):
            return f"command matches approval pattern {pattern!r}"
    return None


SHOWN_CONTENT_CHARS = 4_000
"""Of a file's content awaiting approval, what `status`, `watch` and the Web UI show."""


def shown_below(pending: PendingApproval) -> bool:
    """Whether a display shows `pending.shown` under the one-line summary: when the summary
    was cut, or the call writes content the summary does not show."""
    cut = CUT_SUMMARY.search(pending.summary) is not None
    return bool(pending.shown) and (cut or pending.tool in ("write_file", "edit_file"))


def approval_view(tool: str, arguments: dict[str, Any]) -> str:
    """What a person approves, escaped (workflows/visible.py): a command whole, on one line;
    a file's content (`write_file`) or an edit's texts up to SHOWN_CONTENT_CHARS, saying
    how much is not shown; other arguments one a line."""
    if tool == "run_command":
        lines = [f"command: {one_line(str(arguments.get('command', '')))}"]
        lines += [f"timeout_s: {arguments['timeout_s']}"] if arguments.get("timeout_s") is not None else []
        return "\n".join(lines)
    texts = {"write_file": ("content",), "edit_file": ("old_text", "new_text")}.get(tool, ())
    lines = [f"{name}: {one_line(str(value))[:SHOWN_CONTENT_CHARS]}" for name, value in arguments.items()]
    lines = [line for name, line in zip(arguments, lines, strict=True) if name not in texts]
    for name in texts:
        lines += _content_lines(name, str(arguments.get(name, "")))
    return "\n".join(lines)


def _content_lines(name: str, text: str) -> list[str]:
    shown = text[:SHOWN_CONTENT_CHARS]
    rest = len(text) - len(shown)
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    head = f"{name} ({len(text):,} characters, {lines:,} lines):"
    tail = [f"… {rest:,} more characters not shown"] if rest else []
    body = visible(shown).split("\n")
    if len(body) > 1 and body[-1] == "":
        body.pop()  # the line feed that ends the last line
    return [head, *(f"  | {line}" for line in body), *tail]
