"""Why a running run makes no progress, from its history: no worker needed.

A workflow task that fails (a worker lacking the run's encryption key, a bug) is retried by
the server, and the run answers no query meanwhile. Its latest failure, when no task has
completed since, is what `status` says instead of "no worker answered".
"""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowHandle

ENCODED = "Encoded failure"
"""The message of a failure whose text is encrypted (durable_agent/connection.py)."""


async def failing_task(handle: WorkflowHandle[Any, Any]) -> str | None:
    """The message of the run's latest failed workflow task, if none completed after it."""
    failure: str | None = None
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_task_failed_event_attributes"):
            attributes = event.workflow_task_failed_event_attributes
            failure = f"{attributes.failure.message} (worker {attributes.identity})"
            failure = None if attributes.failure.message == ENCODED else failure
        elif event.HasField("workflow_task_completed_event_attributes"):
            failure = None
    return failure
