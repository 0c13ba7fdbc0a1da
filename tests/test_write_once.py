"""A write call whose attempt the server gave up while its worker lived (activities/write_once.py,
activities/calls_here.py), in the SDK's activity environment: no server. The same against a
real server and a SIGSTOPped worker: tests/test_mcp.py."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.activity import ActivityCancellationDetails
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.calls_here import CALLS_HERE
from activities.heartbeat import heartbeating
from activities.journal import Journal
from activities.write_once import write_once
from tests.helpers import until
from workflows.types import ToolOutcome

UNKNOWN = ToolOutcome(ok=False, error="unknown")


def environment(attempt: int, start_to_close_s: float, **info: Any) -> ActivityEnvironment:
    env = ActivityEnvironment(info.pop("client", None))
    env.info = dataclasses.replace(
        env.info, attempt=attempt, start_to_close_timeout=timedelta(seconds=start_to_close_s), **info
    )
    return env


async def given_up(
    journal: Journal,
    key: str,
    act: Callable[[], Awaitable[ToolOutcome]],
    start_to_close_s: float,
    acted: list[str],
    **info: Any,
) -> None:
    """The call's first attempt, given up by the server (it no longer knows it) once the call acts."""
    first = environment(1, start_to_close_s, **info)
    attempt = asyncio.create_task(first.run(write_once, journal, key, {"tool": "t"}, act, UNKNOWN))
    await until(lambda: bool(acted), within_s=10)
    first.cancel(ActivityCancellationDetails(not_found=True))
    await asyncio.wait([attempt])
    assert attempt.cancelled() or isinstance(attempt.exception(), asyncio.CancelledError)


async def test_the_retry_waits_for_its_call_still_running_here_and_reports_its_outcome(tmp_path: Path) -> None:
    journal, acted, release = Journal(tmp_path), [], asyncio.Event()

    async def act() -> ToolOutcome:
        acted.append("paid")
        await release.wait()
        return ToolOutcome(ok=True, output="paid")

    await given_up(journal, "stalled-1", act, start_to_close_s=60, acted=acted)
    retry = asyncio.create_task(environment(2, 60).run(write_once, journal, "stalled-1", {"tool": "t"}, act, UNKNOWN))
    await asyncio.sleep(0.3)
    assert not retry.done()  # waiting for the call, not "unknown"
    release.set()
    assert await asyncio.wait_for(retry, 10) == ToolOutcome(ok=True, output="paid")
    assert acted == ["paid"]  # acted once
    assert journal.completed("stalled-1") == ToolOutcome(ok=True, output="paid")


async def test_the_retry_stops_a_call_running_past_its_start_to_close_timeout_and_says_unknown(
    tmp_path: Path,
) -> None:
    journal, acted, stopped = Journal(tmp_path), [], asyncio.Event()

    async def hangs() -> ToolOutcome:
        acted.append("began")
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    await given_up(journal, "hung-1", hangs, start_to_close_s=0.2, acted=acted)
    await asyncio.sleep(0.3)  # past the attempt's start-to-close: given up for taking too long
    outcome = await asyncio.wait_for(
        environment(2, 0.2).run(write_once, journal, "hung-1", {"tool": "t"}, hangs, UNKNOWN), 10
    )
    assert outcome == UNKNOWN and stopped.is_set() and acted == ["began"]
    assert "hung-1" not in CALLS_HERE


async def test_a_call_whose_run_has_closed_is_stopped_at_once_not_after_the_grace(
    client: Client, workspace: Path
) -> None:
    """A run that closes abandons its call (a cancel during a model call): the server no
    longer knows the attempt, and no retry will come. The worker asks whether the run is
    open: closed, the call stops at once; open, it waits the grace for a retry."""
    stopped: dict[str, asyncio.Event] = {"closed": asyncio.Event(), "open": asyncio.Event()}
    for name, closed in (("closed", True), ("open", False)):
        run = await client.start_workflow(
            "NoSuchWorkflow", id=f"calls-here-{name}-{uuid.uuid4().hex[:8]}", task_queue="nobody"
        )
        if closed:
            await run.terminate("the run closed")
        acted: list[str] = []

        async def hangs(event: asyncio.Event = stopped[name], acted: list[str] = acted) -> ToolOutcome:
            acted.append("began")
            try:
                await asyncio.Event().wait()
            finally:
                event.set()
            raise AssertionError("unreachable")

        await given_up(
            Journal(workspace),
            f"run-{name}",
            hangs,
            60,
            acted,
            client=client,
            workflow_id=run.id,
            workflow_run_id=run.result_run_id,
        )
    await asyncio.wait_for(stopped["closed"].wait(), 10)  # ORPHAN_GRACE_S is 30 s
    assert not stopped["open"].is_set() and "run-open" in CALLS_HERE
    left = await CALLS_HERE.running("run-open")
    assert left is not None
    left.task.cancel()
    await until(stopped["open"].is_set, within_s=10)


async def test_the_joining_attempt_sends_on_the_calls_latest_beats(tmp_path: Path) -> None:
    """A follower reads the attempt the server knows: the joining one. Its beats carry what the
    call's own beats (to the given-up attempt, which the server no longer reads) last sent."""
    progress, acted, release = ["began"], [], asyncio.Event()

    async def act() -> ToolOutcome:
        acted.append("began")
        async with heartbeating(lambda: progress[-1], release_sticky=False):
            await release.wait()
        return ToolOutcome(ok=True, output="done")

    await given_up(Journal(tmp_path), "beats-1", act, 60, acted)
    retry, sent = environment(2, 60), []
    retry.on_heartbeat = lambda *details: sent.append(details)
    joining = asyncio.create_task(retry.run(write_once, Journal(tmp_path), "beats-1", {"tool": "t"}, act, UNKNOWN))
    progress.append("half way")
    await until(lambda: ("half way",) in sent, within_s=10)
    release.set()
    assert await asyncio.wait_for(joining, 10) == ToolOutcome(ok=True, output="done")


async def test_a_call_that_ends_before_its_retry_comes_keeps_its_outcome_for_it() -> None:
    """A model call has no journal: its outcome, ended after the server gave its attempt up
    and before the retry came, is kept for the retry, which then does not call again."""
    calls: list[str] = []

    async def call() -> str:
        calls.append("made")
        await asyncio.sleep(0.2)
        return "the reply"

    first = environment(1, 60)
    attempt = asyncio.create_task(first.run(CALLS_HERE.run, "ended-1", call()))
    await until(lambda: bool(calls), within_s=10)
    first.cancel(ActivityCancellationDetails(not_found=True))
    await asyncio.wait([attempt])
    await until(lambda: "ended-1" not in CALLS_HERE, within_s=10)  # ended, nobody awaiting it
    assert await environment(2, 60).run(CALLS_HERE.joined, "ended-1") == "the reply"
    assert calls == ["made"]
    assert await environment(3, 60).run(CALLS_HERE.joined, "ended-1") is None  # collected once
