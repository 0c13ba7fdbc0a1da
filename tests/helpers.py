"""Starting runs and waiting on them, shared by the tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.runs import chain_histories, start_agent
from durable_agent.server import temporal_binary
from workflows.types import AgentInput, AgentStatus, Message


async def start(client: Client, task_queue: str, start_signal: str | None = None, **fields: object):
    agent = AgentInput.model_validate(fields)
    return await start_agent(client, agent, f"agent-{uuid.uuid4().hex[:10]}", task_queue, start_signal=start_signal)


async def wait_for(
    handle: WorkflowHandle, predicate: Callable[[AgentStatus], bool], timeout_s: float = 30
) -> AgentStatus:
    async def poll() -> AgentStatus:
        while True:
            status = await query_status(handle)
            if status is not None and predicate(status):
                return status
            await asyncio.sleep(0.1)

    return await asyncio.wait_for(poll(), timeout=timeout_s)


QUERY_GAVE_UP = frozenset({RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE})
"""How a query ends when no worker answers it in time: right after the run's worker was killed,
the server hands it to the dead worker's sticky queue first ("Timeout expired", "context
canceled"); a poller asks again, as `durable-agent status` does."""


async def query_status(handle: WorkflowHandle) -> AgentStatus | None:
    """The run's status, or None when no worker answered this time."""
    try:
        return await handle.query("status", result_type=AgentStatus)
    except RPCError as err:
        if err.status not in QUERY_GAVE_UP:
            raise
        return None


async def tasks_run_again(handle: WorkflowHandle) -> int:
    """Workflow tasks of the run that timed out or failed after the worker started them.

    The worker ran such a task, recording its metrics and spans; the server dropped its
    commands and the next attempt runs the same code, not as a replay, and records them
    again. With the 1.5 s task timeout (workflows/options.py), a worker stalled for that
    long under load does it: a count of what workflow tasks record is exact plus this.
    """
    return sum([_ran_and_dropped(event) async for event in handle.fetch_history_events()])


async def chain_tasks_run_again(client: Client, workflow_id: str) -> int:
    """`tasks_run_again` over every run of a continue-as-new chain."""
    histories = await chain_histories(client, workflow_id)
    return sum(_ran_and_dropped(event) for history in histories for event in history.events)


def counted(what: str, got: float, expected: int, again: int) -> None:
    """A count of what workflow tasks record: exact, plus at most one per task run again."""
    assert expected <= got <= expected + again, f"{what}: {got}, expected {expected}; {again} task(s) run again"


JOURNAL_GONE = "the tool journal is removed; "
"""How a closed run's `files` note begins, whatever attempt of its clean-up removed the journal."""


def _ran_and_dropped(event: HistoryEvent) -> bool:
    """A task that started and was dropped; a sticky task that timed out waiting never ran."""
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        return True
    if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
        return False
    return event.workflow_task_timed_out_event_attributes.timeout_type == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE


def temporal_cli(address: str) -> list[str]:
    return [temporal_binary(), "--address", address]


async def run_cli(address: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """The Temporal CLI, awaited without blocking the loop that runs the in-process worker."""
    process = await asyncio.create_subprocess_exec(
        *temporal_cli(address), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    return subprocess.CompletedProcess(list(args), process.returncode or 0, out.decode(), err.decode())


async def cli_start_agent(
    address: str, task_queue: str, workflow_id: str, agent_input: object
) -> subprocess.CompletedProcess[str]:
    """`temporal workflow start` exactly as the README shows it, with the test's queue and id."""
    return await run_cli(
        address,
        "workflow",
        "start",
        "--type",
        "AgentWorkflow",
        "--task-queue",
        task_queue,
        "--workflow-id",
        workflow_id,
        "--input",
        json.dumps(agent_input),
    )


async def rejected_update(handle: WorkflowHandle, name: str, payload: object) -> str:
    """Run an update that must be rejected; returns the reason the workflow gave."""
    try:
        await handle.execute_update(name, payload)
    except WorkflowUpdateFailedError as e:
        return str(e.cause)
    raise AssertionError(f"update {name} {payload} was accepted")


def host_processes_named(marker: str) -> list[int]:
    """Live host processes whose command line holds `marker` (a sandboxed `$$` is not a host PID)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


async def until(condition: Callable[[], bool], within_s: float = 60.0) -> None:
    """Wait until `condition()` holds, checking every 50 ms; fail after `within_s`.

    The default is long because these conditions wait on workers and servers on a loaded
    2-core CI machine; a test that must see something soon says so with `within_s`."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


ALLOW_SKIP_ENV = "DURABLE_AGENT_TEST_ALLOW_SKIP"


def skip_without(feature: str, reason: str) -> NoReturn:
    """Skip a test this machine lacks `feature` for (sandbox, cgroup, browser, root, proc).

    CI (CI=true) runs as root on Linux, where every feature should be: there a skip would
    drop the coverage silently, so it fails, unless DURABLE_AGENT_TEST_ALLOW_SKIP (a comma
    list, e.g. "sandbox,browser") names the feature: a machine that lacks it says so."""
    allowed = {name.strip() for name in os.environ.get(ALLOW_SKIP_ENV, "").split(",")}
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and feature not in allowed:
        pytest.fail(f"{reason}; CI must run this test ({ALLOW_SKIP_ENV}={feature} allows the skip)", pytrace=False)
    pytest.skip(reason)


async def stalled(process: subprocess.Popen[bytes], seconds: float) -> None:
    """The process stopped (SIGSTOP) for `seconds`, then let go on: a machine too loaded to
    run it, as CI machines are at times. `stop_gently` lets a process still stopped go on first."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(process.pid, signal.SIGCONT)


async def retried_attempts(handle: WorkflowHandle[object, object]) -> list[int]:
    """The attempt numbers above 1 of the run's finished activities: the server retried them."""
    return [
        event.activity_task_started_event_attributes.attempt
        async for event in handle.fetch_history_events()
        if event.HasField("activity_task_started_event_attributes")
        and event.activity_task_started_event_attributes.attempt > 1
    ]


async def recorded_run_s(handle: WorkflowHandle[object, object]) -> float:
    """How long the closed run took, from its start to its close, as the server recorded them:
    a stall of the test's own process does not count, as it would in a wall-clock delta."""
    description = await handle.describe()
    assert description.start_time is not None and description.close_time is not None, description
    return (description.close_time - description.start_time).total_seconds()


HELD_COMMAND = "touch started; until [ -e go ]; do sleep 0.05; done"
"""A command that marks its start and holds its step open until the test lets it go
(`release`): a test that must act while a step runs waits for `started`, never races a sleep."""


def release(workspace: Path) -> None:
    """Lets a `HELD_COMMAND` in `workspace` finish."""
    (workspace / "go").touch()


async def step_done(handle: Any, step: int) -> None:
    """Until the run's transcript holds the tool results of `step` (a pause waits for them)."""

    async def done() -> bool:
        messages = await handle.query("transcript", result_type=list[Message])
        return any(m.role == "tool" and m.step == step for m in messages)

    while not await done():
        await asyncio.sleep(0.1)
