"""A workspace-bound user tool for tests/test_hosts.py (`DURABLE_AGENT_TOOLS=tests.host_tools`)."""

from __future__ import annotations

import os

from durable_agent import tool, tool_context


@tool(effect="write", workspace=True)
def host_note(text: str) -> str:
    """Append `text` to tool-notes.txt in the run's workspace, with the pid of the worker that ran it."""
    with open(os.path.join(tool_context().workspace, "tool-notes.txt"), "a") as f:
        f.write(f"{text} {os.getpid()}\n")
    return "noted"
