"""`max_duration_s` is a cap on the whole run, and `max_wait_s` on each wait for a person.

Judged by effect: the time from the start to the result, the processes left on the host
(/proc), and the run's record of why it stopped.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer, Reply
from tests.helpers import host_processes_named, recorded_run_s, start, until, wait_for
from tests.scripts import Script, tools
from workflows import time_cap
from workflows.time_cap import TimeCap
from workflows.types import AgentStatus, Limits, Message, Usage


async def after_the_cap(handle: WorkflowHandle[Any, Any], cap_s: float) -> list[str]:
    """The run's events from the moment its time was up to its close (their type names),
    checking that the `max_duration_s` timer was the cap's and ran `cap_s` at most. That moment is
    the timer firing; or, when a call clipped to the time left ended at the cap first and the
    check before the next step stopped the run, the start of the task that cancelled the timer.
    What the run did then, in order: a loaded machine stretches the seconds between, never the order."""
    events = [e async for e in handle.fetch_history_events()]
    started = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and b"time cap: max_duration_s" in e.user_metadata.summary.data
    ]
    assert len(started) == 1, started
    assert started[0].timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds() <= cap_s
    timer_id = started[0].timer_started_event_attributes.timer_id
    ends = {EventType.EVENT_TYPE_TIMER_FIRED: "timer_fired", EventType.EVENT_TYPE_TIMER_CANCELED: "timer_canceled"}
    up = next(
        i
        for i, e in enumerate(events)
        if e.event_type in ends and getattr(e, f"{ends[e.event_type]}_event_attributes").timer_id == timer_id
    )
    if events[up].event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
        up = max(i for i in range(up) if events[i].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    return [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events[up + 1 :]]


def started_after_the_cap(after: list[str]) -> list[str]:
    """What the run started once its time was up: an activity, or another timer. (How many
    workflow tasks the close took is not judged: a loaded machine's timed-out task, or a local
    activity's heartbeat, adds one.)"""
    return [e for e in after if e in ("ACTIVITY_TASK_SCHEDULED", "TIMER_STARTED")]


async def test_a_six_second_cap_stops_a_long_command_and_kills_it(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    marker = f"{100 + uuid.uuid4().int % 900}.{uuid.uuid4().int % 10**6}"  # `sleep 1xx.nnnnnn`: this test's own
    model_server.responder = Script([tools(("run_command", {"command": f"sleep {marker}"}))])
    handle = await start(client, task_queue, goal="sleep", workspace=str(workspace), limits={"max_duration_s": 6})
    await until(lambda: bool(host_processes_named(f"sleep {marker}")), within_s=6)
    result = await asyncio.wait_for(handle.result(), 30)
    took = await recorded_run_s(handle)
    assert result.state == "stopped" and result.stop_reason == "time_limit", result
    assert took < 60, f"the run took {took:.1f} s to stop at its 6 s cap, as if it waited for the command"
    # At the cap: nothing started after it (no activity, no second timer), the run closed.
    after = await after_the_cap(handle, 6)
    assert after[-1] == "WORKFLOW_EXECUTION_COMPLETED" and not started_after_the_cap(after), after
    assert not host_processes_named(f"sleep {marker}"), "the command outlived the run"
    # The model's context says what became of the call: a result for it, never a dangling call.
    transcript = await handle.query("transcript", result_type=list[Message])
    results = [m for m in transcript if m.role == "tool" and m.tool_name == "run_command"]
    assert len(results) == 1 and "ERROR" in (results[0].content or ""), results
    assert any("goal not reached (time_limit" in line for line in result.unfinished)


async def test_a_model_call_past_the_cap_is_cancelled(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """A model that takes two minutes to answer: the run stops at its cap, not at the reply."""
    asked = threading.Event()

    def slow(request: dict[str, Any]) -> Reply:
        asked.set()
        time.sleep(120)
        return Reply(content="too late")

    model_server.responder = slow
    # 10 s: time for the call to reach the model on a loaded machine (a 4 s cap was not).
    handle = await start(client, task_queue, goal="slow", workspace=str(workspace), limits={"max_duration_s": 10})
    result = await asyncio.wait_for(handle.result(), 60)
    assert asked.is_set()
    assert result.state == "stopped" and result.stop_reason == "time_limit", result
    assert await recorded_run_s(handle) < 60  # not at the reply, two minutes in
    # At the cap: the call abandoned, nothing started after it, the run closed.
    after = await after_the_cap(handle, 10)
    assert after[-1] == "WORKFLOW_EXECUTION_COMPLETED" and not started_after_the_cap(after), after
    assert "ACTIVITY_TASK_CANCEL_REQUESTED" in after and "ACTIVITY_TASK_COMPLETED" not in after, after
    assert result.usage.model_calls == 0  # the reply never came: nothing charged


async def test_a_wait_for_a_person_is_outside_the_cap_and_has_its_own(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """Paused for longer than `max_duration_s`, the run is not stopped for time; past `max_wait_s`
    it stops with `wait_limit`."""
    model_server.responder = Script([tools(("list_files", {}))] * 50)
    handle = await start(
        client,
        task_queue,
        start_signal="pause",
        goal="wait",
        workspace=str(workspace),
        limits={"max_duration_s": 2, "max_wait_s": 4},
    )
    status = await wait_for(handle, lambda s: s.state == "paused")
    began = time.monotonic()
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.state == "stopped" and result.stop_reason == "wait_limit", result
    assert 3.5 <= time.monotonic() - began <= 8
    assert result.usage.elapsed_s < 2 and status.step == 0  # the wait was not counted as running time


async def test_raising_max_wait_s_lets_a_paused_run_wait_longer(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="resumed")
    handle = await start(
        client, task_queue, start_signal="pause", goal="wait", workspace=str(workspace), limits={"max_wait_s": 3}
    )
    await wait_for(handle, lambda s: s.state == "paused")
    await handle.execute_update("raise_limits", {"max_wait_s": 600})
    await asyncio.sleep(5)  # past the first cap: the watcher took the new one
    assert (await handle.query("status", result_type=AgentStatus)).state == "paused"
    await handle.signal("resume")
    result = await asyncio.wait_for(handle.result(), 30)
    assert (result.state, result.output) == ("completed", "resumed")


async def test_lowering_max_wait_s_stops_a_paused_run_at_the_new_cap(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="never")
    handle = await start(client, task_queue, start_signal="pause", goal="wait", workspace=str(workspace))
    await wait_for(handle, lambda s: s.state == "paused")
    lowered = time.monotonic()
    await handle.execute_update("raise_limits", {"max_wait_s": 2})
    result = await asyncio.wait_for(handle.result(), 30)
    assert (result.state, result.stop_reason) == ("stopped", "wait_limit")
    assert time.monotonic() - lowered <= 5  # not the 7 days the run started with


class _Watched(TimeCap):
    """The watcher's host: the state of `AgentWorkflow` it reads, nothing else."""

    def __init__(self, started_at: datetime, max_duration_s: float) -> None:
        self._limits = Limits(max_duration_s=max_duration_s)
        self._started_at = started_at
        self._waiting = 0
        self._wait_began: datetime | None = None
        self._doing = ""

    def _usage_now(self) -> Usage:
        return Usage(elapsed_s=(self._now() - self._started_at).total_seconds())

    def _patched(self, patch: str) -> bool:
        return True  # a run started on this code


async def test_the_cap_timer_firing_stops_the_run_whatever_the_activation_clock_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An activation can carry the time of the task before (a query that reached the worker while
    the next task was scheduled brought its events early): the timer's firing is the verdict,
    never a second timer set from that clock, which a replay at the recorded time would not set."""
    began = datetime(2026, 1, 1, tzinfo=UTC)
    stale = began + timedelta(seconds=0.03)  # after the first task's local activities, and stuck there
    timers: list[timedelta] = []

    async def timer_fires(condition: Any, *, timeout: timedelta, timeout_summary: str) -> None:
        timers.append(timeout)
        assert not condition() and len(timers) == 1, f"a second timer was set: {timers}"
        raise TimeoutError

    monkeypatch.setattr(time_cap.workflow, "now", lambda: stale)
    monkeypatch.setattr(time_cap.workflow, "wait_condition", timer_fires)
    run = _Watched(began, max_duration_s=4)
    loop = asyncio.get_running_loop().create_future()
    await run._watch_clock(loop)
    assert loop.cancelled() and run._time_up == "time_limit"
    assert timers == [timedelta(seconds=3.97)]
    # What the run reports as its time: at least the cap it was stopped at.
    assert run._usage_now().elapsed_s >= 4


async def test_a_wait_that_began_as_the_cap_fired_does_not_outlive_it_but_new_limits_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cap's timer and a model call's failure in one activation: the loop asks a person
    (a wait, which stops the clock) before the watcher runs. The time was up first: the run
    stops, it does not wait up to `max_wait_s` (seen under load: a 7-day timer after the cap's).
    New limits in that activation are a person's word, and the watcher looks again."""
    began = datetime(2026, 1, 1, tzinfo=UTC)
    monkeypatch.setattr(time_cap.workflow, "now", lambda: began + timedelta(seconds=4))
    run = _Watched(began, max_duration_s=4.5)
    timers: list[timedelta] = []

    async def fires_as_a_wait_begins(condition: Any, *, timeout: timedelta, timeout_summary: str) -> None:
        timers.append(timeout)
        run._waiting += 1
        raise TimeoutError

    monkeypatch.setattr(time_cap.workflow, "wait_condition", fires_as_a_wait_begins)
    loop = asyncio.get_running_loop().create_future()
    await run._watch_clock(loop)
    assert loop.cancelled() and run._time_up == "time_limit" and len(timers) == 1

    run = _Watched(began, max_duration_s=4.5)
    timers.clear()

    async def fires_as_limits_are_raised(condition: Any, *, timeout: timedelta, timeout_summary: str) -> None:
        timers.append(timeout)
        if len(timers) == 1:
            run._limits = Limits(max_duration_s=4.75)
        raise TimeoutError

    monkeypatch.setattr(time_cap.workflow, "wait_condition", fires_as_limits_are_raised)
    loop = asyncio.get_running_loop().create_future()
    await run._watch_clock(loop)
    assert loop.cancelled() and run._time_up == "time_limit"
    assert timers == [timedelta(seconds=0.5), timedelta(seconds=0.25)]  # the second from the new limits
