"""A model endpoint that keeps failing: the run waits for it, and a person is the last resort.
A part of `AgentWorkflow` (workflows/agent.py), whose state it works on.

A call that fails with `ModelEndpointDown` (activities/model_outages.py: its worker saw the
endpoint fail transiently and now probes it) does not make the run need attention. The run
waits in `wait_for_model_endpoint` until the worker's probe finds the endpoint answering,
saying "waiting for the model endpoint since T" in `status` and the Web UI, then calls again.
Only when the outage has lasted `limits.outage_wait_s` does the run need attention. The wait
counts as running time (`max_duration_s`): it is not a person's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled

ENDPOINT_DOWN = "ModelEndpointDown"
"""The error type of a model call its worker did not make, or gave up, because the endpoint is down."""

ENDPOINT_WAIT_RETRY = RetryPolicy(
    initial_interval=options.RETRY_FIRST,
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
)
"""Unbounded attempts: the wait's schedule-to-close (the outage time left) bounds it. An attempt
ends early only when its worker dies; the next worker takes the wait over."""


class EndpointWait(BaseModel):
    since: str
    """When the run first saw the endpoint down (its own clock, ISO 8601)."""
    error: str
    """The failure that showed the outage, for the worker's details."""


class EndpointWaited(BaseModel):
    probes: int
    """Probes the worker had sent by the end of the wait, over all its runs: one loop per endpoint."""


def endpoint_down(error: BaseException) -> bool:
    cause: BaseException | None = error
    while cause is not None:
        if getattr(cause, "type", None) == ENDPOINT_DOWN:
            return True
        cause = cause.__cause__
    return False


class OutageWaits:
    """The wait for a failing model endpoint, as `AgentWorkflow` runs it."""

    _outage_since: datetime | None = None
    """When the current outage began, by this run's clock; None while the endpoint answers."""

    async def _wait_out_outage(self, error: BaseException) -> bool:
        """True once the endpoint answers again (call again); False when `error` is no outage,
        or the outage has lasted `limits.outage_wait_s`: then a person decides."""
        if not self._caps_on or not endpoint_down(error):
            return False
        now = workflow.now()
        self._outage_since = self._outage_since or now
        left = self._limits.outage_wait_s - (now - self._outage_since).total_seconds()
        if left <= 0:
            return False
        since = self._outage_since.isoformat(timespec="seconds")
        self._doing = f"waiting for the model endpoint since {since}"
        self._publish()
        try:
            await workflow.execute_activity(
                "wait_for_model_endpoint",
                EndpointWait(since=since, error=failure_message(error)[:500]),
                result_type=EndpointWaited,
                schedule_to_close_timeout=timedelta(seconds=left),
                heartbeat_timeout=options.MODEL_HEARTBEAT_TIMEOUT,
                retry_policy=ENDPOINT_WAIT_RETRY,
                summary=f"wait_for_model_endpoint: down since {since}",
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return False
        return True

    def _outage_text(self, error: BaseException) -> str:
        """The attention report's error after an outage that outlasted `outage_wait_s`."""
        message = failure_message(error)
        if self._outage_since is None or not endpoint_down(error):
            return message
        since = self._outage_since.isoformat(timespec="seconds")
        waited = f"limits.outage_wait_s = {self._limits.outage_wait_s:g} s"
        return f"the model endpoint has failed since {since}, longer than {waited}: {message}"
