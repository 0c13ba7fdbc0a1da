"""An activity attempt the server no longer waits for ends without a traceback in the log.

When a run closes while one of its activities still runs (a cancel, a model call the run
abandons), or the server has already timed the attempt out, the worker learns it at the
next heartbeat and cancels the activity. The SDK logs such a cancel, not asked for by the
workflow, as a failure with its traceback ("CancelledError: Activity cancelled"), though
nothing went wrong and nobody reads the outcome. This interceptor reports it as one
BENIGN error instead, which the SDK logs at debug level. Cancels the workflow asked for,
pauses, resets and worker shutdowns are left to the SDK, which handles each already.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor


class StoppedAttemptInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _StoppedAttemptInbound(next)


class _StoppedAttemptInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is None or not (details.not_found or details.timed_out):
                raise
            why = "its run or the attempt is gone" if details.not_found else "the server timed the attempt out"
            raise ApplicationError(
                f"stopped: {why}", type="AttemptStopped", category=ApplicationErrorCategory.BENIGN
            ) from None
