"""Local activities that only the run's host serves, and the stickiness they ask to reset.

A run pinned to a host first tries its short workspace-bound calls as local activities whose
id names the host (workflows/hosts.py, `local_activity_id`): the worker running the run's
workflow task runs them only when it is that host's worker, and refuses them at once
otherwise (never running them: the workspace is not here). The run then makes the call on
the host's queue, with an id that asks the host's worker to reset the run's stickiness first
(`UNSTICK_SUFFIX`), so the run's next workflow task may land on the host's worker.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.heartbeat import reset_stickiness
from workflows.hosts import ELSEWHERE, UNSTICK_SUFFIX, host_of_local_activity


class HostCheckInterceptor(Interceptor):
    """On every worker of the plugin; `host`: this worker's host name, or None."""

    def __init__(self, host: str | None) -> None:
        self.host = host

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _HostCheckInbound(next, self.host)


class _HostCheckInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, host: str | None) -> None:
        super().__init__(next)
        self._host = host

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.is_local:
            wanted = host_of_local_activity(info.activity_id)
            if wanted is not None and wanted != self._host:
                # BENIGN: the run's normal way to learn where its workflow task runs.
                raise ApplicationError(
                    f"this worker is not host {wanted}'s (it is {self._host or 'no host'}'s)",
                    type=ELSEWHERE,
                    non_retryable=True,
                    category=ApplicationErrorCategory.BENIGN,
                )
        elif info.activity_id.endswith(UNSTICK_SUFFIX) and info.attempt == 1:
            await reset_stickiness()
        return await super().execute_activity(input)
