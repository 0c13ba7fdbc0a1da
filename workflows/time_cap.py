"""The run's clock as a cap: `limits.max_duration_s` bounds everything the run does, and
`limits.max_wait_s` bounds each wait for a person. A part of `AgentWorkflow`
(workflows/agent.py), whose state it works on.

Between steps the loop checks the time as before (workflows/limits.py). Within a step, a
command's own timeout and a model call's start-to-close are clipped to the time left, and
one watcher per run races the loop: a timer to the moment the time is up, which cancels the
loop wherever it is. Its running activities are cancelled with it; `run_command` is
cancelled with `WAIT_CANCELLATION_COMPLETED`, so its process tree is killed before the run
closes. Waits for a person stop the clock: the watcher then times the wait instead. One
timer per run and per change of state (a wait, `raise_limits`), not one per call.

The timer firing is itself the verdict: the watcher does not read the clock again to check,
and a wait that began in the same activation (the loop asking a person about a failure that
arrived with the firing) began after the time was up. Only new limits make it look again.
An activation can carry the previous workflow task's time: a legacy query task can bring the
events recorded since the run's last task, and Core hands them to the cached run at once, at
the old time. A clock check there would set another timer live where a replay (at the task's
recorded time) stops the run: a nondeterminism error that leaves the run unable to replay.
The worker refuses such activations (durable_agent/activation_guard.py, docs/limits.md); the
watcher does not rely on it, for the case the guard cannot see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.types import AgentResult, Limits, Message, StopReason

MIN_CALL_TIMEOUT = timedelta(seconds=1)
"""The shortest start-to-close a clipped call gets: a zero or negative timeout is refused."""


class TimeCap:
    """The watcher and the clipping, as `AgentWorkflow` uses them."""

    _time_up: StopReason | None = None
    """Why the watcher cancelled the loop; None while it has not."""
    _clock_floor: datetime | None = None
    """The moment the watcher's last timer was set to fire, once it has fired: the time is at
    least this, whatever an activation's clock says."""

    def _now(self) -> datetime:
        """`workflow.now()`, never before a moment a fired timer has shown past."""
        now = workflow.now()
        return max(now, self._clock_floor) if self._clock_floor is not None else now

    def _time_left_s(self) -> float:
        return self._limits.max_duration_s - self._usage_now().elapsed_s

    def _clipped(self, timeout: timedelta) -> timedelta:
        """`timeout`, or the time the run has left if that is shorter."""
        if not self._caps_on:
            return timeout
        left = timedelta(seconds=max(0.0, self._time_left_s()))
        return max(MIN_CALL_TIMEOUT, min(timeout, left))

    def _clip_command(self, args: dict[str, Any], default_s: float) -> dict[str, Any]:
        """A command's own timeout no longer than the time left: it ends (its tree killed) by
        itself at the limit, as a timeout the model is told about."""
        if not self._caps_on:
            return args
        asked = args.get("timeout_s") or default_s
        left = self._clipped(timedelta(seconds=asked)).total_seconds()
        return {**args, "timeout_s": left} if left < asked else args

    async def _capped(self, loop: Coroutine[Any, Any, AgentResult]) -> AgentResult:
        """The loop, stopped cleanly with its partial result when the watcher calls time."""
        if not self._caps_on:
            return await loop
        task = asyncio.ensure_future(loop)
        watcher = asyncio.ensure_future(self._watch_clock(task))
        try:
            return await task
        except asyncio.CancelledError:
            if self._time_up is None or not task.cancelled():
                raise  # the run itself was cancelled
            self._answer_open_calls(self._time_up)
            return self._finish("stopped", self._time_up)
        finally:
            watcher.cancel()

    async def _watch_clock(self, loop: asyncio.Future[AgentResult]) -> None:
        while True:
            limits, waiting = self._limits, self._waiting > 0
            reason: StopReason = "wait_limit" if waiting else "time_limit"
            left = self._wait_left_s() if waiting else self._time_left_s()
            if left <= 0 or await self._timer_fired(left, limits, waiting):
                self._time_up = reason
                self._doing = f"stopping: {reason}"
                loop.cancel()
                return

    async def _timer_fired(self, left_s: float, limits: Limits, waiting: bool) -> bool:
        """Waits `left_s`, or until the limits or the waiting change: True when the timer fired
        under the same limits (the time is up), False when the watcher must look again."""
        fires_at = self._now() + timedelta(seconds=left_s)
        try:
            await workflow.wait_condition(
                lambda: self._limits is not limits or (self._waiting > 0) != waiting,
                timeout=timedelta(seconds=left_s),
                timeout_summary=f"time cap: {'max_wait_s' if waiting else 'max_duration_s'}",
            )
        except TimeoutError:
            self._clock_floor = fires_at  # later than any floor before: `_now()` includes it
            if self._limits is not limits:
                return False
            if (self._waiting > 0) != waiting:
                return self._patched(options.CAP_FIRED_FIRST_PATCH)
            return True
        return False

    def _wait_left_s(self) -> float:
        now = self._now()
        began = self._wait_began or now
        return self._limits.max_wait_s - (now - began).total_seconds()

    def _answer_open_calls(self, reason: StopReason) -> None:
        """Tool calls the cancel cut short get a result: the API wants one per call, and a
        `continue` of this run sends the context again."""
        messages = self._carry.view.messages
        asked = next((m for m in reversed(messages) if m.role == "assistant"), None)
        if asked is None or not asked.tool_calls:
            return
        answered = {m.tool_call_id for m in messages if m.role == "tool"}
        for call in asked.tool_calls:
            if call.id not in answered:
                messages.append(
                    Message(
                        role="tool",
                        content=f"ERROR: cancelled: the run stopped ({reason}) while this call was open; "
                        "it may have partly run",
                        tool_call_id=call.id,
                        step=self._carry.step,
                        kind="tool_result",
                        tool_name=call.name,
                    )
                )
