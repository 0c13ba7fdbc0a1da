"""A tool's dependency that is down: the run waits for it, as for the model endpoint.
A part of `AgentWorkflow` (workflows/agent.py), whose state it works on.

A tool call that fails with `DependencyDown` (its worker confirmed, by a probe, that the service
the tool raised `DependencyUnavailable` for is down: activities/dependency_outages.py) does not
become a tool error. The run waits in `wait_for_dependency`, on a worker of the tool, until that
worker's one probe loop for the dependency sees it answer, saying "waiting for <dependency>
since T" in `status` and the Web UI, then makes the call again under a new idempotency key (the
tool said the call took no effect). Past `limits.outage_wait_s` a person decides. An activity
tool of another worker may fail with `DependencyUnavailable` and details `{"dependency",
"probe"}` (a URL): the run then waits on its own queue, whose workers probe the URL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled
    from workflows.outages import ENDPOINT_WAIT_RETRY, EndpointWaited
    from workflows.tool_catalog import ToolSpec
    from workflows.types import NOT_RUN, ToolCallInput, ToolOutcome

DEPENDENCY_DOWN = "DependencyDown"
"""A call our worker did not make, or gave up, because a probe found its dependency down."""
DEPENDENCY_UNAVAILABLE = "DependencyUnavailable"
"""The same said by another worker's activity tool, unconfirmed: our worker probes first."""


class DependencyDetails(BaseModel):
    """The details of a `DependencyDown` (or an activity tool's `DependencyUnavailable`) error."""

    dependency: str
    probe: str | None = None
    """The probe's URL, when it is one: a worker that never saw the tool fail can probe it too."""


class DependencyWait(BaseModel):
    dependency: str
    since: str
    """When the run first saw it down (its own clock, ISO 8601)."""
    error: str
    probe: str | None = None
    failed_at: str | None = None
    """When the run learned of the call's failure that this wait is for (ISO 8601): a worker
    whose probe has found the dependency up since then does not probe again. None in waits
    recorded before it was sent."""


class DependencyIsDown(Exception):
    """Inside the workflow only: a tool call found its dependency down."""

    def __init__(self, details: DependencyDetails, error: BaseException) -> None:
        super().__init__(details.dependency)
        self.details = details
        self.error = error


def dependency_down(error: BaseException) -> DependencyIsDown | None:
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type in (DEPENDENCY_DOWN, DEPENDENCY_UNAVAILABLE):
            try:
                details = DependencyDetails.model_validate(cause.details[0] if cause.details else None)
            except ValidationError:  # another worker's error without our details: an ordinary failure
                return None
            return DependencyIsDown(details, error)
        cause = cause.__cause__
    return None


class DependencyWaits:
    """The wait for a tool's dependency, as `AgentWorkflow` runs it."""

    async def _waiting_out_dependencies(
        self, spec: ToolSpec, request: ToolCallInput, call: Callable[[ToolCallInput], Awaitable[ToolOutcome]]
    ) -> ToolOutcome:
        """`call(request)`, again each time its dependency answers after an outage."""
        since: datetime | None = None
        tries = 0
        while True:
            try:
                return await call(request)
            except DependencyIsDown as down:
                if not self._caps_on:  # recorded before outages waited: the tool error it was
                    return ToolOutcome(ok=False, error=f"{spec.name} failed: {failure_message(down.error)}")
                since = since or workflow.now()
                tries += 1
                # The tool said the call took no effect: a new key, or a write's journal would
                # answer "outcome unknown" for the try it began.
                key = request.idempotency_key.split("/outage-")[0]
                request = request.model_copy(update={"idempotency_key": f"{key}/outage-{tries}"})
                if await self._wait_for_dependency(spec, down, since):
                    continue
                resolution = await self._needs_attention(
                    f"{self._carry.step}:{request.call_id}",
                    what=f"{spec.name}: its dependency {down.details.dependency} is down",
                    error=self._dependency_text(down, since),
                    attempts=tries,
                )
                if resolution.action == "skip":
                    return ToolOutcome(ok=False, error=f"{NOT_RUN}skipped by a person: {resolution.note or 'no note'}")
                since = None  # retry: an outage is waited out afresh

    async def _wait_for_dependency(self, spec: ToolSpec, down: DependencyIsDown, since: datetime) -> bool:
        """True once the dependency answers; False when the outage has lasted `outage_wait_s`."""
        left = self._limits.outage_wait_s - (workflow.now() - since).total_seconds()
        if left <= 0:
            return False
        name, at = down.details.dependency, since.isoformat(timespec="seconds")
        error, probe = failure_message(down.error)[:500], down.details.probe
        failed_at = workflow.now().isoformat()
        wait = DependencyWait(dependency=name, since=at, error=error, probe=probe, failed_at=failed_at)
        self._doing = f"waiting for {name} since {at}"
        self._publish()
        # A Python tool's workers know its probe (and took it over from the tool); another
        # worker's tool is probed from ours, by its URL.
        queue = spec.task_queue if spec.source == "python" else workflow.info().task_queue
        try:
            await workflow.execute_activity(
                "wait_for_dependency",
                wait,
                result_type=EndpointWaited,
                task_queue=queue,
                schedule_to_close_timeout=timedelta(seconds=left),
                heartbeat_timeout=options.MODEL_HEARTBEAT_TIMEOUT,
                retry_policy=ENDPOINT_WAIT_RETRY,
                summary=f"wait_for_dependency: {name} down since {at}"[:120],
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return False
        return True

    def _dependency_text(self, down: DependencyIsDown, since: datetime) -> str:
        at = since.isoformat(timespec="seconds")
        waited = f"limits.outage_wait_s = {self._limits.outage_wait_s:g} s"
        return f"{down.details.dependency} is down since {at}, longer than {waited}: {failure_message(down.error)}"
