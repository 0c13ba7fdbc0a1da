"""Calls running in this worker process, which outlive an attempt the server gave up.

The server times an attempt out when its heartbeats stop arriving, though its worker may
live on: a machine too loaded to send them in time, a process stopped for a while. The call
goes on here. The retry, when it comes to this process, waits for that same call and reports
its outcome (or finds it kept, should the call have ended before the retry came), where
otherwise it would find the call's start record in the journal and report the call
interrupted (a command) or of unknown outcome (a write tool), or call the model again. A
retry that goes to another worker still does that. Only a cancellation someone asked for (by
the run, the activity's pause or reset, the worker's shutdown) stops the call. A call whose
run has closed is stopped at once (a run that ends abandons its model call: the server then
no longer knows the attempt either); one that no attempt awaits ORPHAN_GRACE_S after its
attempt was given up (the retry went elsewhere) is stopped then; one still running past its
attempt's start-to-close timeout was given up for taking too long, not for a stall: the
retry stops it and goes on as if it ran elsewhere.

Every tool call that is a regular activity takes this one path: `run_command`
(activities/tools/__init__.py), the write tools, a user's and an MCP server's
(activities/write_once.py), and the read and idempotent ones (activities/user_tools.py,
activities/mcp_tools.py), which would otherwise run twice at once; and the model call
(activities/model.py), which would otherwise be made, and paid for, twice. A tool call is
keyed by its idempotency key, a model call by its activity (`activity_key`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from activities.heartbeat import LATEST_BEATS, activity_key, heartbeating

ORPHAN_GRACE_S = 30.0
"""How long a call whose attempt the server gave up, and whose run is open, waits for a retry
to collect it: the retry comes within a second unless it went to another worker."""

REMEMBERED = 10_000
"""How many finished calls' keys the process remembers (about 1 MB)."""


Outcome = TypeVar("Outcome")


class RunningCall(Generic[Outcome]):
    """A call running in this process and the attempts waiting for it."""

    def __init__(self, task: asyncio.Task[Outcome], deadline: float | None) -> None:
        self.task = task
        self.waiting = 0
        self.deadline = deadline
        """When, on the event loop's clock, its attempt's start-to-close timeout ran out."""
        self._watch: asyncio.Task[None] | None = None
        self.given_up = False
        """The server gave up an attempt that awaited it: its outcome may be for a retry to collect."""

    async def outcome(self) -> Outcome:
        """The call's outcome. Cancelling the waiting attempt stops the call when the
        cancellation was asked for; when the server gave the attempt up instead, the call
        goes on for a retry to collect (`_stop_when_orphaned`)."""
        self.waiting += 1
        try:
            return await asyncio.shield(self.task)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is None or not (details.timed_out or details.not_found):
                self.task.cancel()
                await asyncio.wait([self.task])  # e.g. a command's process group killed, CANCELLED recorded
            else:
                self.given_up = True
                self._watch = asyncio.get_running_loop().create_task(self._stop_when_orphaned(_run_of_attempt()))
            raise
        finally:
            self.waiting -= 1

    async def _stop_when_orphaned(self, run: WorkflowHandle[Any, Any] | None) -> None:
        """The attempt was given up: the call stops at once if its run has closed (a run
        that ends abandons its model call, and no retry will come), else after
        ORPHAN_GRACE_S unless a retry waits for it by then."""
        if run is not None:
            try:
                closed = (await run.describe()).status != WorkflowExecutionStatus.RUNNING
            except RPCError:
                closed = False  # unknown: the grace decides
            if closed:
                self.task.cancel()
                return
        await asyncio.sleep(ORPHAN_GRACE_S)
        if self.waiting == 0:
            self.task.cancel()


def _run_of_attempt() -> WorkflowHandle[Any, Any] | None:
    """The current attempt's run; None where no client is at hand (the SDK's test environment)."""
    info = activity.info()
    try:
        client = activity.client()
    except RuntimeError:
        return None
    return client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)


class CallsHere:
    """This process's running calls, and the keys of the latest that ended, by idempotency key."""

    def __init__(self) -> None:
        self._running: dict[str, RunningCall[Any]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._uncollected: dict[str, tuple[Any, float]] = {}
        """Outcomes of calls that ended after the server gave up their attempt and before its
        retry came, kept for the retry until ORPHAN_GRACE_S later (on the event loop's clock):
        a model call has no journal to answer from."""

    async def running(self, key: str) -> RunningCall[Any] | None:
        """The call of `key` running here for a retry to wait for; one past its attempt's
        start-to-close timeout is stopped first (a command records CANCELLED) and not returned."""
        running = self._running.get(key)
        if running is None or running.deadline is None or asyncio.get_running_loop().time() < running.deadline:
            return running
        running.task.cancel()
        await asyncio.wait([running.task])
        return None

    def __contains__(self, key: str) -> bool:
        return key in self._running

    def ran(self, key: str) -> bool:
        """Whether an attempt of the call ran (and ended) in this process: its retry needs
        no sticky release (activities/heartbeat.py), the run's worker is alive."""
        return key in self._ended

    async def joined(self, key: str) -> Any | None:
        """The outcome of the call of `key` still running here, awaited; None when none runs
        here. This attempt's beats send on what the call's own beats last sent (a command's
        output, a user tool's checkpoint, a model reply so far): a follower and a later
        attempt read them."""
        if (uncollected := self._uncollected.pop(key, None)) is not None:
            outcome, until = uncollected
            if asyncio.get_running_loop().time() < until:
                return outcome
        running = await self.running(key)
        if running is None:
            return None
        beats, given_up = activity_key(), tuple(activity.info().heartbeat_details)
        async with heartbeating(release_sticky=False, progress=lambda: LATEST_BEATS.get(beats, given_up)):
            return await running.outcome()

    async def outcome_of(self, key: str, start: Callable[[], Coroutine[Any, Any, Outcome]]) -> Outcome:
        """The outcome of the call of `key`: of the one still running here (or just ended)
        if there is one (`joined`), else of the call `start()` begins (`run`)."""
        if (outcome := await self.joined(key)) is not None:
            return outcome
        return await self.run(key, start())

    async def run(self, key: str, call: Coroutine[Any, Any, Outcome]) -> Outcome:
        """`call`'s outcome, the call registered while it runs (`RunningCall.outcome`)."""
        timeout = activity.info().start_to_close_timeout
        deadline = asyncio.get_running_loop().time() + timeout.total_seconds() if timeout else None
        running = self._running[key] = RunningCall(asyncio.create_task(call), deadline)
        running.task.add_done_callback(lambda task: self._end(key, task))
        return await running.outcome()

    def _end(self, key: str, task: asyncio.Task[Any]) -> None:
        ended = self._running.pop(key)
        now = asyncio.get_running_loop().time()
        for stale in [k for k, (_, until) in self._uncollected.items() if until <= now]:
            del self._uncollected[stale]
        # task.exception() also marks a failure as seen: a given-up attempt may have left no one awaiting it.
        if not task.cancelled() and task.exception() is None and ended.given_up and ended.waiting == 0:
            self._uncollected[key] = (task.result(), now + ORPHAN_GRACE_S)
        self._ended[key] = None
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)


CALLS_HERE = CallsHere()
"""The process's one registry: a retry may come to any worker of the process."""
