"""A model call's own failures, counted by its worker: a worker's death is not one of them.

Temporal counts every attempt of an activity, including one whose worker died under it (a
heartbeat timeout), so a call on a worker that was killed a few times reached its last
attempt without failing that often itself. Runs that count for themselves
(`ModelCallInput.attempts`) give the call more attempts on the server (workflows/options.py,
`COUNTED_MODEL_RETRY`) and this ledger ends it after `attempts` failures of its own: on the
last one the error is raised non-retryable, with the count. A worker that dies loses its
ledger: the call's count starts again on the next worker, as retry counters are
re-initialised after a crash; the server's bound still holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio import activity
from temporalio.exceptions import ApplicationError

FAILED_ATTEMPTS = "failed_attempts"
"""The key of the count in the last error's details."""


class AttemptLedger:
    def __init__(self) -> None:
        self._failures: dict[tuple[str, str, str], int] = {}
        """By (workflow id, run id, activity id): failures of calls that will be retried."""

    @contextmanager
    def counting(self, attempts: int | None) -> Iterator[None]:
        """Around one attempt: its failure is counted, and the `attempts`-th is the last."""
        info = activity.info()
        key = (info.workflow_id, info.workflow_run_id, info.activity_id)
        try:
            yield
        except Exception as e:
            failed = self._failures.pop(key, 0) + 1
            retryable = not (isinstance(e, ApplicationError) and e.non_retryable)
            if attempts is None or not retryable:
                raise
            if failed < attempts:
                self._failures[key] = failed
                raise
            message = e.message if isinstance(e, ApplicationError) else str(e)
            kind = e.type if isinstance(e, ApplicationError) else type(e).__name__
            raise ApplicationError(message, {FAILED_ATTEMPTS: failed}, type=kind, non_retryable=True) from None
        except BaseException:
            self._failures.pop(key, None)  # cancelled: nothing more to count
            raise
        self._failures.pop(key, None)
