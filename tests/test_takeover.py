"""A new worker takes over, at once, the tool calls of a dead worker on the same machine.

Whose process is gone, and whose is not, is decided from real processes; the takeover runs
against the real server, with a real worker process SIGKILLed in the middle of a command.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowHandle

from activities.host import machine_tag
from durable_agent.model_server import ModelServer
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from durable_agent.takeover import (
    WORKER_GONE,
    Holder,
    abandoned,
    held_by_dead_neighbour,
    parse_identity,
    take_over,
    worker_identity,
)
from tests.helpers import skip_without, start, until
from tests.scripts import Script, answer, tool_results, tools
from tests.test_crash import ledger_lines, worker_env


@pytest.fixture(autouse=True)
def needs_proc() -> None:
    if machine_tag() is None:
        skip_without("proc", "needs /proc to tell whether a process is gone")


STARTED = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED


@pytest.fixture
def me() -> Holder:
    holder = parse_identity(worker_identity())
    assert holder is not None
    return holder


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def identity_of(pid: int, me: Holder) -> str:
    return f"{pid}@{me.host}#{me.tag}"


def test_a_worker_identity_names_its_process_host_and_machine(me: Holder) -> None:
    assert me == Holder(os.getpid(), socket.gethostname(), machine_tag())
    assert parse_identity(f"123@{me.host}") is None  # the SDK's default identity: no tag, never judged
    assert parse_identity("not an identity#abc") is None


def test_only_a_gone_process_of_this_machine_counts_as_dead(me: Holder, sleeper: subprocess.Popen[bytes]) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    assert held_by_dead_neighbour(identity_of(exited.pid, me), me)
    assert not held_by_dead_neighbour(identity_of(sleeper.pid, me), me)
    assert not held_by_dead_neighbour(identity_of(me.pid, me), me)
    # The same pid elsewhere says nothing: another host, another boot or pid namespace.
    assert not held_by_dead_neighbour(f"{exited.pid}@other-host#{me.tag}", me)
    assert not held_by_dead_neighbour(f"{exited.pid}@{me.host}#0000beef", me)


def test_a_killed_process_not_yet_reaped_counts_as_dead(me: Holder, sleeper: subprocess.Popen[bytes]) -> None:
    sleeper.kill()
    deadline = time.monotonic() + 10
    while not held_by_dead_neighbour(identity_of(sleeper.pid, me), me):  # a zombie until waited for
        assert time.monotonic() < deadline, "the killed process never died"
    assert sleeper.poll() is not None


NOW = datetime.now(UTC)


def pending(
    state: PendingActivityState.ValueType, worker: str, started_s_ago: float, beat_s_ago: float | None = None
) -> PendingActivityInfo:
    """An attempt as the server describes it, timed from NOW."""
    info = PendingActivityInfo(state=state, last_worker_identity=worker)
    info.last_started_time.FromDatetime(NOW - timedelta(seconds=started_s_ago))
    if beat_s_ago is not None:
        info.last_heartbeat_time.FromDatetime(NOW - timedelta(seconds=beat_s_ago))
    return info


def test_only_a_started_attempt_of_a_dead_worker_is_abandoned(me: Holder, sleeper: subprocess.Popen[bytes]) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    dead, alive = identity_of(exited.pid, me), identity_of(sleeper.pid, me)
    assert abandoned(pending(STARTED, dead, started_s_ago=1), me, NOW)
    assert not abandoned(pending(STARTED, alive, started_s_ago=1), me, NOW)
    scheduled = PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED  # waiting for its retry already
    assert not abandoned(pending(scheduled, dead, started_s_ago=1), me, NOW)


def test_an_attempt_about_to_time_out_is_left_to_its_timeout(me: Holder) -> None:
    """The server may start the retry between the description and the fail, which would
    then fail the retry: within a second of the heartbeat timeout (5 s), the timeout decides."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    dead = identity_of(exited.pid, me)
    assert not abandoned(pending(STARTED, dead, started_s_ago=4.5), me, NOW)
    assert not abandoned(pending(STARTED, dead, started_s_ago=60, beat_s_ago=4.2), me, NOW)
    assert abandoned(pending(STARTED, dead, started_s_ago=60, beat_s_ago=2), me, NOW)
    assert abandoned(pending(STARTED, dead, started_s_ago=3.5), me, NOW)


async def test_a_dead_workers_command_is_retried_at_once_and_not_run_twice(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    model_server.responder = Script(
        [tools(("run_command", {"command": "echo started >> ledger.txt; sleep 60"})), answer("done")]
    )
    env = worker_env(temporal_server, model_server, task_queue)
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(client, task_queue, goal="take me over", workspace=str(workspace))
        await until(lambda: ledger_lines(workspace / "ledger.txt") == ["started"])  # the command runs
        await fresh_heartbeat(handle)
        kill_hard(worker)  # the command's sandbox dies with it
        # Well inside the 5 s heartbeat timeout, which would otherwise retry the call.
        assert await take_over(client, task_queue, worker_identity()) == 1
        worker = spawn_worker(env, tmp_path / "w1.log")
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        stop_gently(worker)

    assert result.state == "completed"
    assert ledger_lines(workspace / "ledger.txt") == ["started"]  # not run a second time
    [command_result] = tool_results(model_server.requests[-1])
    assert "killed before it finished" in command_result and "it is no longer running" in command_result
    retried = [
        e.activity_task_started_event_attributes
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    # The command's second attempt, at once; the model calls (activities too) ran once each.
    assert [(a.attempt, a.last_failure.application_failure_info.type) for a in retried if a.attempt > 1] == [
        (2, WORKER_GONE)
    ]


async def fresh_heartbeat(handle: WorkflowHandle) -> None:
    """Until the command's attempt has just heartbeated: its heartbeat timeout is then as far off as it gets."""
    first = 0
    while True:
        beat = await last_heartbeat(handle)
        if first and beat != first:
            return
        first = first or beat
        await asyncio.sleep(0.02)


async def last_heartbeat(handle: WorkflowHandle) -> int:
    """The running attempt's last heartbeat, in ns since the epoch; 0 before it has one."""
    for activity in (await handle.describe()).raw_description.pending_activities:
        if activity.state == STARTED and activity.HasField("last_heartbeat_time"):
            return activity.last_heartbeat_time.ToNanoseconds()
    return 0
