"""Tool calls running in this worker process, which outlive an attempt the server gave up.

The server times an attempt out when its heartbeats stop arriving, though its worker may
live on: a machine too loaded to send them in time, a process stopped for a while. The call
goes on here. The retry, when it comes to this process, waits for that same call and reports
its outcome, where otherwise it would find the call's start record in the journal and report
the call interrupted (a command) or of unknown outcome (a write tool). A retry that goes to
another worker still does that. Only a cancellation someone asked for (by the run, the
activity's pause or reset, the worker's shutdown) stops the call; one that no attempt awaits
ORPHAN_GRACE_S after its attempt was given up (the run closed, or the retry went elsewhere)
is stopped then; one still running past its attempt's start-to-close timeout was given up
for taking too long, not for a stall: the retry stops it and goes on as if it ran elsewhere.

Every tool call that is a regular activity takes this one path: `run_command`
(activities/tools/__init__.py), the write tools, a user's and an MCP server's
(activities/write_once.py), and the read and idempotent ones (activities/user_tools.py,
activities/mcp_tools.py), which would otherwise run twice at once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

from temporalio import activity

from activities.heartbeat import heartbeating
from workflows.types import ToolOutcome

ORPHAN_GRACE_S = 30.0
"""How long a call whose attempt the server gave up waits for a retry to collect it: the
retry comes within a second unless the run closed or it went to another worker."""

REMEMBERED = 10_000
"""How many finished calls' keys the process remembers (about 1 MB)."""


class RunningCall:
    """A call running in this process and the attempts waiting for it."""

    def __init__(self, task: asyncio.Task[ToolOutcome], deadline: float | None) -> None:
        self.task = task
        self.waiting = 0
        self.deadline = deadline
        """When, on the event loop's clock, its attempt's start-to-close timeout ran out."""

    async def outcome(self) -> ToolOutcome:
        """The call's outcome. Cancelling the waiting attempt stops the call when the
        cancellation was asked for; when the server gave the attempt up instead, the call
        goes on for a retry to collect, and is stopped if none does within ORPHAN_GRACE_S."""
        self.waiting += 1
        try:
            return await asyncio.shield(self.task)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is None or not (details.timed_out or details.not_found):
                self.task.cancel()
                await asyncio.wait([self.task])  # e.g. a command's process group killed, CANCELLED recorded
            else:
                asyncio.get_running_loop().call_later(ORPHAN_GRACE_S, self._stop_if_orphaned)
            raise
        finally:
            self.waiting -= 1

    def _stop_if_orphaned(self) -> None:
        if self.waiting == 0:
            self.task.cancel()


class CallsHere:
    """This process's running calls, and the keys of the latest that ended, by idempotency key."""

    def __init__(self) -> None:
        self._running: dict[str, RunningCall] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    async def running(self, key: str) -> RunningCall | None:
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

    async def joined(self, key: str) -> ToolOutcome | None:
        """The outcome of the call of `key` still running here, awaited; None when none runs
        here. This attempt's beats resend the details the given-up attempt last sent (a
        command's output, a user tool's checkpoint): a later attempt reads them."""
        running = await self.running(key)
        if running is None:
            return None
        last_sent = tuple(activity.info().heartbeat_details)
        async with heartbeating(release_sticky=False, progress=lambda: last_sent):
            return await running.outcome()

    async def run(self, key: str, call: Coroutine[Any, Any, ToolOutcome]) -> ToolOutcome:
        """`call`'s outcome, the call registered while it runs (`RunningCall.outcome`)."""
        timeout = activity.info().start_to_close_timeout
        deadline = asyncio.get_running_loop().time() + timeout.total_seconds() if timeout else None
        running = self._running[key] = RunningCall(asyncio.create_task(call), deadline)
        running.task.add_done_callback(lambda task: self._end(key, task))
        return await running.outcome()

    def _end(self, key: str, task: asyncio.Task[ToolOutcome]) -> None:
        if not task.cancelled():
            task.exception()  # seen: a timed-out attempt may have left no one awaiting it
        del self._running[key]
        self._ended[key] = None
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)


CALLS_HERE = CallsHere()
"""The process's one registry: a retry may come to any worker of the process."""
