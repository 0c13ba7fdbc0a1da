"""Which tool calls wait for a person (`AgentInput.approval`)."""

from __future__ import annotations

import re
from typing import Any

from workflows.types import Approval


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
