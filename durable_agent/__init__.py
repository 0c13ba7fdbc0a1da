"""durable-agent: LLM agents as Temporal workflows.

The names a user's code imports: `tool` and `tool_context` (durable_agent/tools.py),
`DurableAgentPlugin` (durable_agent/plugin.py), `run_agent` (durable_agent/child.py) and
`DependencyUnavailable` (durable_agent/dependencies.py).
Loaded on first use, so that the CLI's start does not import the workflow and activities.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "tool": "durable_agent.tools",
    "tool_context": "durable_agent.tools",
    "ToolContext": "durable_agent.tools",
    "DurableAgentPlugin": "durable_agent.plugin",
    "run_agent": "durable_agent.child",
    "DependencyUnavailable": "durable_agent.dependencies",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'durable_agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
