"""How a failed activity reaches the agent's workflow, and what it says."""

from __future__ import annotations

import asyncio

from temporalio.exceptions import ActivityError, ApplicationError, FailureError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

ACTIVITY_FAILED = (ActivityError, ApplicationError, TemporalTimeoutError)
"""How a failed activity surfaces: a regular one wrapped in ActivityError; a local one (the
file tools, and the model call of runs recorded before it became a regular activity) as
its own error (a non-retryable one, or the last attempt's), a timeout, or wrapped. A
cancelled one surfaces as one of these too: `raise_if_cancelled` tells it apart."""


def raise_if_cancelled(error: BaseException) -> None:
    """An activity that failed because the run is being cancelled: the cancel goes on up to
    `run`, which closes the run as `cancelled`, rather than counting as a failed call."""
    if is_cancelled_exception(error):
        raise asyncio.CancelledError() from error


def failure_message(error: BaseException) -> str:
    """What went wrong, beneath the ActivityError wrapper: the activity's own error, whose
    message is written for people (not the low-level exception it was raised from)."""
    cause: BaseException | None = error
    while isinstance(cause, ActivityError) and cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, FailureError) and cause.message:
        return cause.message
    return str(cause or error)


def attempts(error: FailureError, maximum: int) -> int:
    # The retry state says why retrying ended; the attempt count itself is not in the error.
    state = error.retry_state if isinstance(error, ActivityError) else None
    if state is not None:
        return maximum if state.name == "MAXIMUM_ATTEMPTS_REACHED" else 1
    return 1 if isinstance(error, ApplicationError) and error.non_retryable else maximum


def counted_attempts(error: BaseException) -> int | None:
    """The failures a call counted itself (activities/model_attempts.py), when it did."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
            count = cause.details[0].get("failed_attempts")
            if isinstance(count, int):
                return count
        cause = cause.__cause__
    return None


def timed_out(error: BaseException, kind: str | None = None) -> bool:
    """The activity timed out (of `kind`, a `TimeoutType` name such as "SCHEDULE_TO_START", if given)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, TemporalTimeoutError):
            return kind is None or (cause.type is not None and cause.type.name == kind)
        cause = cause.__cause__
    return False


def worker_lost(error: BaseException) -> bool:
    """The attempt ended because its worker stopped: timed out, or failed by a replacement
    worker that found its process gone (durable_agent/takeover.py's "WorkerGone")."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type == "WorkerGone":
            return True
        cause = cause.__cause__
    return timed_out(error)


def failure_type(error: BaseException) -> str | None:
    """The type of the first ApplicationError in the cause chain (`NotFoundError`: an activity
    this worker does not have)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return cause.type
        cause = cause.__cause__
    return None
