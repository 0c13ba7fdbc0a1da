"""An activity attempt whose run is gone ends without a traceback in the worker log.

When a run closes while one of its activities still runs (a cancel during a model call,
which the run abandons), the worker learns it at the next heartbeat (the server no longer
knows the attempt) and cancels the activity. The SDK logs such a cancel, not asked for by
the workflow, as a failure with its traceback ("CancelledError: Activity cancelled"),
though nothing went wrong and nobody reads the outcome. This interceptor reports it as one
BENIGN error instead, which the SDK logs at debug level. Every other cancel is left to
the SDK: one the workflow asked for, a pause, a reset or a worker shutdown (handled
already), and an attempt the server timed out (a stalled worker, worth its warning).
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
            if details is None or not details.not_found:
                raise
            raise ApplicationError(
                "stopped: the server no longer knows this attempt (its run has closed)",
                type="AttemptStopped",
                category=ApplicationErrorCategory.BENIGN,
            ) from None
