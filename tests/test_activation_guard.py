"""The worker refuses an activation whose new events came without their workflow task's
time (durable_agent/activation_guard.py): such an activation's `workflow.now()` is not the
one a replay gives the same events."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities import model_context
from durable_agent.activation_guard import (
    FreshClockRunner,
    GuardedSandboxedRunner,
    GuardedUnsandboxedRunner,
    Stamp,
    _GuardedInstance,
    brings_a_local_result_late,
    guarded,
    is_stale,
    refused,
    stamp,
)
from durable_agent.model_server import ModelServer
from durable_agent.plugin import DurableAgentPlugin
from durable_agent.stale_queries import STALE_ACTIVATION
from tests.helpers import start, wait_for
from tests.scripts import Script, answer, tools
from tests.test_replay import replay_failure
from worker import build_worker
from workflows.types import TERMINAL_STATES, AgentStatus, ModelContext, ModelContextRef, ModelContextRequest

T0, T1 = 1_764_770_000_000_000_000, 1_764_770_004_000_000_000  # ns: a task, and the next one 4 s later


def activation(ns: int, history_length: int, *jobs: str, replaying: bool = False) -> WorkflowActivation:
    act = WorkflowActivation(run_id="r", history_length=history_length, is_replaying=replaying)
    act.timestamp.FromNanoseconds(ns)
    for job in jobs:
        getattr(act.jobs.add(), job).SetInParent()
    return act


def flags(*acts: WorkflowActivation) -> list[bool]:
    """`is_stale` over a run's activations in order, as the guard sees them."""
    last: Stamp | None = None
    seen = []
    for act in acts:
        seen.append(is_stale(act, last))
        last = stamp(act, last)
    return seen


def test_new_events_at_the_previous_tasks_time_are_stale_and_nothing_else_is() -> None:
    # The activation CI's failure showed: live, history up to the next task's WORKFLOW_TASK_SCHEDULED
    # (12), the timer's firing, and the first task's clock; a query's activation followed.
    assert flags(
        activation(T0, 3, "initialize_workflow"),
        activation(T0, 3, "resolve_activity"),  # a local activity, in the same task
        activation(T0, 12, "fire_timer"),
        activation(T0, 12, "query_workflow"),
    ) == [False, False, True, False]
    assert (
        flags(
            activation(T0, 3, "initialize_workflow"),
            activation(T0, 3, "query_workflow"),  # a query with nothing new
            activation(T1, 8, "fire_timer"),  # the next task: its own time
            activation(T1, 8, "resolve_activity"),
            activation(T1, 8, "remove_from_cache"),
        )
        == [False] * 5
    )
    # The clock never goes back in Core; were an activation's older than the latest seen, it is no new task's.
    assert flags(
        activation(T0, 3, "initialize_workflow"),
        activation(T1, 3, "resolve_activity"),
        activation(T0, 12, "fire_timer"),
    ) == [False, False, True]
    # Replay applies each task's events at that task's recorded time: never refused.
    replayed = [
        activation(T0, 3, "initialize_workflow", replaying=True),
        activation(T0, 12, "fire_timer", replaying=True),
    ]
    assert flags(*replayed) == [False, False]


class _Answering:
    """A workflow instance that answers every activation with `completion`."""

    def __init__(self, completion: WorkflowActivationCompletion) -> None:
        self.completion = completion

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self.completion

    def get_info(self) -> Any:
        return types.SimpleNamespace(workflow_id="w")


def test_after_a_rejected_update_the_same_length_of_history_can_be_stale() -> None:
    """Core drops a rejected update's speculative task (two events) and keeps its time: the
    timer's firing and the next task's scheduling then reach the update's history length."""
    rejected = WorkflowActivationCompletion(run_id="r")
    rejected.successful.commands.add().update_response.rejected.message = "no"
    instance = _GuardedInstance(_Answering(rejected), is_stale)  # type: ignore[arg-type]
    instance.activate(activation(T0, 3, "initialize_workflow"))
    instance.activate(activation(T1, 5, "do_update"))  # the speculative task: scheduled 4, started 5
    refused = instance.activate(activation(T1, 5, "fire_timer"))  # timer fired 4, next task scheduled 5
    assert STALE_ACTIVATION in refused.failed.failure.message


def with_local_result(act: WorkflowActivation, local: bool = True) -> WorkflowActivation:
    """`act` with an activity's result among its jobs: a local activity's, or a regular one's."""
    act.jobs.add().resolve_activity.is_local = local
    return act


def test_a_local_result_that_comes_with_the_next_tasks_events_is_refused_and_nothing_else_is() -> None:
    def late(*acts: WorkflowActivation) -> list[bool]:
        last: Stamp | None = None
        seen = []
        for act in acts:
            seen.append(brings_a_local_result_late(act, last))
            last = stamp(act, last)
        return seen

    # What the bare workflow below showed: the first task's query, then the next task's first
    # activation with the signal and the run-opening's result together.
    assert late(
        activation(T0, 3, "initialize_workflow"),
        activation(T0, 3, "query_workflow"),
        with_local_result(activation(T1, 10, "signal_workflow")),
    ) == [False, False, True]
    assert (
        late(
            activation(T0, 3, "initialize_workflow"),
            with_local_result(activation(T0, 3)),  # in its own task: the usual way
            activation(T1, 8, "signal_workflow"),
            with_local_result(activation(T1, 11)),  # alone in a new task (after a task's heartbeat)
            with_local_result(activation(T1, 14, "signal_workflow"), local=False),  # a regular activity's
            with_local_result(activation(T1, 17, "signal_workflow", replaying=True)),  # replayed
        )
        == [False] * 6
    )
    first = activation(T0, 3, "initialize_workflow")
    assert refused(with_local_result(activation(T1, 10, "do_update")), stamp(first, None))


async def test_every_runner_of_an_agent_worker_is_guarded_and_stays_guarded(client: Client) -> None:
    config = build_worker(client, f"guard-{uuid.uuid4().hex[:8]}").config(active_config=True)
    for key in ("workflow_runner", "unsandboxed_workflow_runner"):  # the second: workflows with sandboxed=False
        assert isinstance(config[key], GuardedUnsandboxedRunner), config[key]  # type: ignore[literal-required]
        assert guarded(config[key]) is config[key]  # type: ignore[literal-required]
    # A user's worker with the SDK's sandbox, and the OpenTelemetry plugin after ours: the
    # plugin still sees a SandboxedWorkflowRunner (its passthrough applies), and keeps the guard.
    user = Worker(client, task_queue=f"guard-{uuid.uuid4().hex[:8]}", plugins=[DurableAgentPlugin()])
    runner = OpenTelemetryPlugin().configure_worker(user.config(active_config=True))["workflow_runner"]  # type: ignore[typeddict-item]
    assert isinstance(runner, GuardedSandboxedRunner) and isinstance(runner, SandboxedWorkflowRunner)
    assert "opentelemetry" in runner.restrictions.passthrough_modules
    assert type(dataclasses.replace(runner)) is GuardedSandboxedRunner
    custom = FreshClockRunner(UnsandboxedWorkflowRunner())
    assert guarded(custom) is custom


@workflow.defn
class Gate:
    """Waits for `open`, with no timer or activity pending meanwhile: a query then goes to the
    worker as a legacy query task."""

    def __init__(self) -> None:
        self.opened = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.opened)
        await workflow.sleep(0.1)
        return "through"

    @workflow.signal
    def open(self) -> None:
        self.opened = True

    @workflow.query
    def is_open(self) -> bool:
        return self.opened


def refusing(variant: str, refused: list[int], let_through: int = 0) -> FreshClockRunner:
    """A runner that refuses, once, the first activation with a job of `variant` after `let_through` of them."""
    seen: list[int] = []

    def judge(act: WorkflowActivation, last: Stamp | None) -> bool:
        if refused or not any(job.WhichOneof("variant") == variant for job in act.jobs):
            return False
        seen.append(act.history_length)
        if len(seen) <= let_through:
            return False
        refused.append(act.history_length)
        return True

    return FreshClockRunner(UnsandboxedWorkflowRunner(), judge)


async def event_types(handle: WorkflowHandle[Any, Any]) -> list[int]:
    return [e.event_type async for e in handle.fetch_history_events()]


async def test_a_refused_query_fails_and_asked_again_is_answered_by_the_replayed_run(client: Client) -> None:
    """The guard's answer to a query's activation, on the real server: the run waits for a
    signal, so the query goes to the worker as a legacy query task; Core fails that query and
    evicts the run, which the next query replays. No workflow task fails."""
    refused: list[int] = []
    queue = f"guard-{uuid.uuid4().hex[:8]}"
    runner = refusing("query_workflow", refused, let_through=1)
    plain = Client(client.service_client, namespace=client.namespace, data_converter=client.data_converter)
    async with Worker(client, task_queue=queue, workflows=[Gate], workflow_runner=runner):
        handle = await client.start_workflow(Gate.run, id=f"gate-{uuid.uuid4().hex}", task_queue=queue)
        assert await handle.query(Gate.is_open) is False  # answered: the run is cached, its first task done
        with pytest.raises(WorkflowQueryFailedError, match=STALE_ACTIVATION):  # a client that does not ask again
            await plain.get_workflow_handle(handle.id).query(Gate.is_open)
        assert await handle.query(Gate.is_open) is False  # asked again: answered, from the replayed run
        assert len(refused) == 1
        refused.clear()  # the runner refuses the next query's activation too
        assert await handle.query(Gate.is_open) is False  # `connect`'s client: refused, asked again, answered
        assert len(refused) == 1
        users = Client(client.service_client, namespace=client.namespace, plugins=[DurableAgentPlugin()])
        refused.clear()
        assert await users.get_workflow_handle(handle.id).query(Gate.is_open) is False  # a user's, by the plugin
        assert len(refused) == 1
        await handle.signal(Gate.open)
        assert await asyncio.wait_for(handle.result(), 30) == "through"
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in await event_types(handle)


async def test_a_refused_workflow_task_fails_once_and_its_retry_replays_to_the_end(client: Client) -> None:
    """What a false alarm on a workflow task costs: the task fails, its retry replays the
    history on a new instance and the run goes on."""
    refused: list[int] = []
    queue = f"guard-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Gate], workflow_runner=refusing("signal_workflow", refused)):
        handle = await client.start_workflow(Gate.run, id=f"gate-{uuid.uuid4().hex}", task_queue=queue)
        await handle.signal(Gate.open)
        assert await asyncio.wait_for(handle.result(), 30) == "through"
    assert len(refused) == 1
    assert (await event_types(handle)).count(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED) == 1


class RaceEvents:
    """The race's moments, by event rather than by time: the query holds the run's first task,
    the signal reaches the server, then the local activity ends while the task is still held."""

    def __init__(self) -> None:
        self.answering = threading.Event()
        self.signalled = threading.Event()
        self.local_done = threading.Event()

    def hold_the_task(self) -> None:
        """In the query: until the local activity ended and its result has reached core. Under the
        SDK's 2 s deadlock timeout: a machine too slow for it misses the race (`raced` retries)."""
        self.answering.set()
        if self.local_done.wait(HOLD_MAX_S):
            time.sleep(LOCAL_RESULT_MARGIN_S)


HOLD_MAX_S = 1.4
"""The longest the query waits for the local activity: with the margin, under 2 s."""
LOCAL_RESULT_MARGIN_S = 0.3
"""After the local activity returned: its result reaching core, one call on the worker's idle event loop."""

RACES: dict[str, RaceEvents] = {}
"""By workflow id."""


@activity.defn
async def open_quickly() -> None:
    race = RACES[activity.info().workflow_id]
    await asyncio.to_thread(race.signalled.wait, 30)  # ends after the signal, while the query holds the task
    race.local_done.set()


@activity.defn
async def act_on_it() -> None:
    pass


@workflow.defn(sandboxed=False)
class LocalThenBranch:
    """A local activity, then a choice that a signal changes: the shape of an agent run's opening
    (the `open_run` local activity, then a model call unless a `pause` came)."""

    def __init__(self) -> None:
        self.paused = False

    @workflow.run
    async def run(self) -> str:
        await workflow.execute_local_activity(open_quickly, start_to_close_timeout=timedelta(seconds=30))
        if self.paused:
            await workflow.sleep(0.1)
            return "paused first"
        await workflow.execute_activity(act_on_it, start_to_close_timeout=timedelta(seconds=30))
        return "acted first"

    @workflow.signal
    def pause(self) -> None:
        self.paused = True

    @workflow.query
    def is_paused(self) -> bool:
        RACES[workflow.info().workflow_id].hold_the_task()
        return self.paused


async def a_query_with_the_first_task_then_a_signal(client: Client, runner: Any) -> WorkflowHandle[Any, Any]:
    """The race CI met: a query that comes with the run's first task, a signal during that
    task, and a local activity that ends while the query is answered. Core records the local
    activity's marker in the first task and hands its result to the run only with the next
    task, after the signal."""
    queue, workflow_id = f"guard-{uuid.uuid4().hex[:8]}", f"branch-{uuid.uuid4().hex}"
    race = RACES[workflow_id] = RaceEvents()
    handle = await client.start_workflow(LocalThenBranch.run, id=workflow_id, task_queue=queue)
    asked = asyncio.create_task(handle.query(LocalThenBranch.is_paused))  # no worker yet: it waits for the first task
    await asyncio.sleep(0.5)
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[LocalThenBranch],
        activities=[open_quickly, act_on_it],
        unsandboxed_workflow_runner=runner,  # the workflow is not sandboxed: its query sleeps
    )
    async with worker:
        assert await asyncio.to_thread(race.answering.wait, 30)
        await handle.signal(LocalThenBranch.pause)
        race.signalled.set()
        await asyncio.wait_for(handle.result(), 30)
        assert await asked is False
    return handle


async def test_a_local_result_that_comes_after_a_signal_is_replayed_in_its_recorded_place(client: Client) -> None:
    """Without the guard the SDK records a history its own replay refuses (a nondeterminism
    error, and a run no new worker can take over); with it, the run's second task is refused
    once, its retry replays the first task with the local activity's result where its marker
    is, and the history replays."""
    replayer = Replayer(workflows=[LocalThenBranch])

    async def unreplayable(handle: WorkflowHandle[Any, Any]) -> bool:
        failure = (
            await replayer.replay_workflow(await handle.fetch_history(), raise_on_replay_failure=False)
        ).replay_failure
        return failure is not None and "Nondeterminism" in str(failure)

    bare = await raced(client, UnsandboxedWorkflowRunner(), unreplayable)
    assert await bare.result() == "paused first"  # live, the signal came first

    async def refused(handle: WorkflowHandle[Any, Any]) -> bool:
        return EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED in await event_types(handle)

    handle = await raced(client, guarded(UnsandboxedWorkflowRunner()), refused)
    history = await handle.fetch_history()
    assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
    assert await handle.result() == "acted first"  # as its history has it: the result, then the signal
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert len(failed) == 1
    assert "a local activity's result came with the next task's events" in (
        failed[0].workflow_task_failed_event_attributes.failure.message
    )


async def raced(
    client: Client, runner: Any, race_shows: Callable[[WorkflowHandle[Any, Any]], Awaitable[bool]], attempts: int = 3
) -> WorkflowHandle[Any, Any]:
    """A run that met the race, as `race_shows(handle)` tells from its history: a machine too
    loaded to end the local activity within the query's hold misses it, and a new run tries."""
    for _ in range(attempts):
        handle = await a_query_with_the_first_task_then_a_signal(client, runner)
        if await race_shows(handle):
            return handle
    raise AssertionError(f"no run of {attempts} met the race")


async def test_on_an_agent_run_the_guard_refuses_exactly_the_activations_without_a_task(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """Judged against the run's own history: a live activation's history length is its task's
    WORKFLOW_TASK_STARTED event; the guard refuses exactly those whose length is not. A run with
    local and regular activities, a pause and a resume, and a status query every 20 ms."""
    judged: list[tuple[int, bool]] = []

    def recording(act: WorkflowActivation, last: Stamp | None) -> bool:
        stale = is_stale(act, last)
        if not act.is_replaying and any(
            j.WhichOneof("variant") not in ("query_workflow", "remove_from_cache") for j in act.jobs
        ):
            judged.append((act.history_length, stale))
        return refused(act, last)

    step = [("write_file", {"path": "a.txt", "content": "a\n"}), ("run_command", {"command": "cat a.txt"})]
    model_server.responder = Script([tools(*step), tools(*step), tools(*step), answer("done")])
    async with build_worker(
        client, task_queue, workflow_runner=FreshClockRunner(UnsandboxedWorkflowRunner(), recording)
    ):
        handle = await start(client, task_queue, goal="write", workspace=str(workspace))
        asking = asyncio.create_task(ask_status_until_done(handle))
        await handle.signal("pause", {"reason": "look"})
        await wait_for(handle, lambda s: s.state == "paused")
        await handle.signal("resume")
        result = await asyncio.wait_for(handle.result(), 60)
        await asking
    assert result.state == "completed", result
    types = {e.event_id: e.event_type async for e in handle.fetch_history_events()}
    task_started = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    assert len(judged) > 10
    assert [(length, stale) for length, stale in judged if stale != (types[length] != task_started)] == []
    assert await replay_failure(await handle.fetch_history()) is None


async def ask_status_until_done(handle: WorkflowHandle[Any, Any]) -> None:
    while True:
        try:
            status = await handle.query("status", result_type=AgentStatus)
        except WorkflowQueryFailedError as e:
            # The run's events go with the failure: a nondeterminism error here (once in CI: the
            # local result that came late, `LocalThenBranch`) is told by where the events lie.
            raise AssertionError(f"{e}\nthe run's events:\n{await events_in_brief(handle)}") from e
        if status.state in TERMINAL_STATES:
            return
        await asyncio.sleep(0.02)


async def events_in_brief(handle: WorkflowHandle[Any, Any]) -> str:
    """One line an event: id, type, time and what it names (activity, marker, signal, timer)."""
    lines = []
    async for event in handle.fetch_history_events():
        kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        attributes = event.WhichOneof("attributes")
        detail = getattr(event, attributes) if attributes else None
        names = [
            getattr(getattr(detail, "activity_type", None), "name", ""),
            getattr(detail, "marker_name", ""),
            getattr(detail, "signal_name", ""),
            getattr(detail, "timer_id", ""),
        ]
        when = event.event_time.ToDatetime().strftime("%H:%M:%S.%f")
        lines.append(f"{event.event_id} {kind} {when} {' '.join(n for n in names if n)}")
    return "\n".join(lines)


class _Asked:
    """A run handle whose `model_context` query fails first with `error`, then answers `page`."""

    def __init__(self, error: str, page: ModelContext) -> None:
        self.error, self.page, self.asked = error, page, 0

    async def query(self, *args: object, **kwargs: object) -> ModelContext:
        self.asked += 1
        if self.asked == 1:
            raise WorkflowQueryFailedError(self.error)
        return self.page


async def test_the_model_calls_context_query_asks_again_when_refused_and_only_then() -> None:
    ref = ModelContextRef(run_id="r", message_count=1, digest="d")
    page = ModelContext(ref=ref, messages=[{"role": "user", "content": "hi"}], next_message=None)
    request = ModelContextRequest(**ref.model_dump(), first_message=0)
    refused = _Asked(f"{STALE_ACTIVATION}: new events reached the cached run ...", page)
    assert await model_context._query_page(refused, request) == page  # type: ignore[arg-type]
    assert refused.asked == 2
    moved_on = _Asked("the run holds another call's context", page)  # the query handler's own refusal
    with pytest.raises(ApplicationError, match="no longer waits") as raised:
        await model_context._query_page(moved_on, request)  # type: ignore[arg-type]
    assert raised.value.non_retryable and moved_on.asked == 1
