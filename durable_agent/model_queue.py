"""Model calls on their own task queue: where a worker's runs schedule `call_model`.

The queue is the worker's configuration (`DURABLE_AGENT_MODEL_TASK_QUEUE`), not the run's:
the workflow schedules `call_model` with no task queue, and this interceptor names it as
the call is scheduled. Replay does not compare an activity's task queue, so a fleet can
move its model calls to another queue while runs are in flight.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowHandle
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

MODEL_ACTIVITY = "call_model"
MODEL_ACTIVITIES = frozenset({MODEL_ACTIVITY, "wait_for_model_endpoint"})
"""Routed to the model queue: the call, and the wait for its endpoint (which shares its worker's probes)."""


class ModelQueueInterceptor(Interceptor):
    def __init__(self, model_task_queue: str) -> None:
        self.model_task_queue = model_task_queue

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        queue = self.model_task_queue

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(_RouteModelCalls(outbound, queue))

        return Inbound


class _RouteModelCalls(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, queue: str) -> None:
        super().__init__(next)
        self._queue = queue

    def start_activity(self, input: StartActivityInput) -> ActivityHandle:
        if input.activity in MODEL_ACTIVITIES and input.task_queue is None:
            input = dataclasses.replace(input, task_queue=self._queue)
        return super().start_activity(input)


async def model_call_waiting(handle: WorkflowHandle[Any, Any]) -> str | None:
    """What `durable-agent status` says of a model call that is scheduled but not started:
    held back by the queue's rate (`DURABLE_AGENT_MODEL_RPS`), or no worker polls its queue.
    The run itself cannot tell: nothing is recorded until the call ends."""
    description = await handle.describe()
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name != MODEL_ACTIVITY:
            continue
        if pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
            return None
        now = datetime.now(UTC)
        retry_at = _time(pending, "next_attempt_schedule_time") or _time(pending, "scheduled_time")
        if retry_at is not None and retry_at > now:  # a back-off after a failed attempt
            failure = pending.last_failure.message[:200] if pending.HasField("last_failure") else ""
            return (
                f"model call waiting to retry: attempt {pending.attempt} starts in "
                f"{(retry_at - now).total_seconds():.0f} s" + (f" (last failure: {failure})" if failure else "")
            )
        since = _time(pending, "scheduled_time")
        waited = f" for {(now - since).total_seconds():.0f} s" if since else ""
        return (
            f"model call scheduled, not started{waited} (attempt {pending.attempt}): waiting for the model "
            "queue's rate limit (DURABLE_AGENT_MODEL_RPS) or for a worker of its task queue"
        )
    return None


def _time(pending: Any, field: str) -> datetime | None:
    return getattr(pending, field).ToDatetime(tzinfo=UTC) if pending.HasField(field) else None
