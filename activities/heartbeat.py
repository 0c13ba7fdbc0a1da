"""Fast crash recovery, activity side: heartbeat while working, hand the run over after a crash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.service import RPCError

BEATS_PER_TIMEOUT = 3
"""A beat every third of the call's heartbeat timeout, the first one a third after the start:
every ~1.7 s for a command (5 s), every ~3.3 s for a model call (10 s); the worker sends
at most one per 0.5 s."""


LIVE_BEAT_S = 1.0
"""While `live()` says so (a followed model reply has news: a line ended, a tool call
began; and no follower asks the worker for it, activities/live_replies.py), a beat within a
second: the beats carry the reply so far to `run` and `watch` (the worker forwards at most
one per 0.5 s). Otherwise the usual pace."""


LATEST_BEATS: dict[str, tuple[Any, ...]] = {}
"""By activity (`activity_key`), what the running call's beats last sent: an attempt that
joins the call after the server gave up the attempt that began it (activities/calls_here.py)
sends them on, so a follower and a later attempt see the call's progress."""


def activity_key() -> str:
    """The current activity's key, the same in all its attempts: a run's activity id is unique."""
    info = activity.info()
    return f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"


@asynccontextmanager
async def heartbeating(
    *details: Any,
    release_sticky: bool = True,
    live: Callable[[], bool] | None = None,
    progress: Callable[[], tuple[Any, ...]] | None = None,
) -> AsyncIterator[None]:
    """Heartbeat from a background task for as long as the block runs.

    A callable detail is called at each beat, so a beat sends the latest progress (however
    often the work updates it). The work inside must not block the event loop (use
    `asyncio.to_thread`), or the heartbeats starve and the server times the activity out.
    A local activity (the file tools) neither beats nor hands its run over: it runs inside the run's workflow task,
    which the worker keeps alive itself. `release_sticky`: False when this process ran the
    earlier attempt itself, so the run's worker is alive (see `release_sticky_run`).
    `progress`: in place of `details`, what each beat sends (a user tool's own latest
    heartbeat details): a beat without them would wipe them out for the next attempt.
    """
    if activity.info().is_local:
        yield
        return
    timeout = activity.info().heartbeat_timeout
    interval_s = timeout.total_seconds() / BEATS_PER_TIMEOUT if timeout else 1.0

    tick_s = min(interval_s, LIVE_BEAT_S) if live is not None else interval_s
    loop = asyncio.get_running_loop()
    key = activity_key()

    async def beat() -> None:
        # The first beat waits an interval: a call that ends sooner (most commands) costs the
        # server no heartbeat at all, and the server's heartbeat timeout covers the gap.
        last = loop.time()
        while True:
            await asyncio.sleep(tick_s)
            due = interval_s if live is None or not live() else LIVE_BEAT_S
            if loop.time() - last < due - 0.01:
                continue
            sent = progress() if progress is not None else tuple(d() if callable(d) else d for d in details)
            activity.heartbeat(*sent)
            LATEST_BEATS[key] = sent
            last = loop.time()

    task = asyncio.create_task(beat())  # before the release: its round trip counts against the timeout
    try:
        if release_sticky:
            await release_sticky_run()
        yield
    finally:
        task.cancel()
        LATEST_BEATS.pop(key, None)


async def release_sticky_run() -> None:
    """On a retried attempt, let any worker take the run's next workflow task at once.

    A retry usually means the previous worker died. Its run is still "sticky" to that
    worker's queue, so the task this activity's completion schedules would wait out the
    sticky timeout there first. Resetting stickiness costs one replay on the next worker.
    """
    if activity.info().attempt > 1:
        await reset_stickiness()


async def reset_stickiness() -> None:
    """The run's next workflow task goes to its task queue, where any worker takes it."""
    info = activity.info()
    request = ResetStickyTaskQueueRequest(
        namespace=info.workflow_namespace,
        execution=WorkflowExecution(workflow_id=info.workflow_id, run_id=info.workflow_run_id),
    )
    try:
        await activity.client().workflow_service.reset_sticky_task_queue(request)
    except RPCError as e:  # best effort: the run still moves on after the sticky timeout
        activity.logger.warning("could not reset stickiness: %s", e)
