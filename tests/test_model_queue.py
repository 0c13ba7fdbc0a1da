"""Model calls as regular activities: on their own task queue, at a fleet-wide rate, with
the context delivered by reference (worker cache or the `model_context` query)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities import model_context
from activities.model import ModelActivities
from durable_agent import DurableAgentPlugin
from durable_agent.model_queue import model_call_waiting
from durable_agent.model_server import Failure, ModelServer, Reply
from durable_agent.processes import spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import start, until, wait_for
from tests.scripts import Script, answer, tool_results, tools
from tests.test_crash import worker_env
from tests.test_replay import replayer
from worker import build_model_worker, build_worker
from workflows.context_handoff import context_page
from workflows.options import MODEL_START_TO_CLOSE
from workflows.types import ModelContext, ModelContextRequest


@dataclass
class ModelQueueWorker:
    queue: str
    process: Popen[bytes]


@pytest.fixture
def model_queue_worker(
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ModelQueueWorker]:
    """Model calls on a queue of their own, polled only by a worker process: the agent worker
    (this process) routes them there and does not poll it, so no cache of the worker that
    runs a call holds its context, and every call reads it from the run with the query."""
    queue = f"{task_queue}-model"
    monkeypatch.setenv("DURABLE_AGENT_MODEL_TASK_QUEUE", queue)
    process = spawn_worker(worker_env(temporal_server, model_server, queue), tmp_path / "model.log")
    try:
        yield ModelQueueWorker(queue, process)
    finally:
        stop_gently(process)


async def test_a_model_worker_without_the_run_reads_the_context_from_it(
    client: Client, model_server: ModelServer, task_queue: str, workspace: Path, model_queue_worker: ModelQueueWorker
) -> None:
    model_server.responder = Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "alpha"})),
            tools(("read_file", {"path": "a.txt"})),
            answer("read it"),
        ]
    )
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="write then read", workspace=str(workspace))
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.state == "completed" and result.output == "read it"
    assert len(model_server.requests) == 3
    assert "alpha" in tool_results(model_server.requests[-1])[-1]  # the whole context arrived
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "call_model"
    ]
    assert [s.task_queue.name for s in scheduled] == [model_queue_worker.queue] * 3
    model_calls = {
        e.event_id
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "call_model"
    }
    started = [
        e.activity_task_started_event_attributes.identity
        for e in history.events
        if e.activity_task_started_event_attributes.scheduled_event_id in model_calls
    ]
    assert len(started) == 3 and all(i.startswith(f"{model_queue_worker.process.pid}@") for i in started)
    # The queue is the worker's configuration: a replay without the routing still matches.
    assert (await replayer().replay_workflow(history)).replay_failure is None


async def test_a_context_over_a_query_answers_limit_is_read_in_pages(
    client: Client, model_server: ModelServer, task_queue: str, workspace: Path, model_queue_worker: ModelQueueWorker
) -> None:
    # A query's answer is refused over 2 MB: a 3.4 MB context read whole could never be read.
    model_server.responder = Script([tools(("list_files", {}))], final="read it all")
    big = [f"note {i}: " + "x" * 850_000 for i in range(4)]
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="read the notes",
            workspace=str(workspace),
            context={"max_context_tokens": 5_000_000},
            limits={"max_tokens": 20_000_000, "max_cost_usd": 1_000},
        )
        for text in big:
            await handle.signal("add_message", {"text": text})
        result = await asyncio.wait_for(handle.result(), timeout=90)
    assert result.state == "completed" and result.output == "read it all", result
    contents = [m.get("content") for m in model_server.requests[-1]["messages"]]
    assert all(text in contents for text in big)


def test_a_context_page_holds_at_least_one_message_and_says_where_the_next_starts() -> None:
    messages = [{"role": "user", "content": "x" * 400_000} for _ in range(5)] + [
        {"role": "user", "content": "y" * 3_000_000}
    ]
    pages, first = [], 0
    while first is not None:
        page, first = context_page(messages, first)
        pages.append(page)
    assert [len(p) for p in pages] == [2, 2, 1, 1]  # at most PAGE_BYTES each, or one message alone
    assert [m for p in pages for m in p] == messages


class Unanswered:
    """A run handle whose query finds no worker `outage` times, then answers."""

    def __init__(self, outage: int) -> None:
        self.outage, self.asked = outage, 0

    async def query(self, name: str, request: ModelContextRequest, result_type: type) -> ModelContext:
        self.asked += 1
        if self.asked <= self.outage:
            raise RPCError("no poller seen for task queue recently", RPCStatusCode.DEADLINE_EXCEEDED, b"")
        return ModelContext(ref=request.call(), messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(("outage", "answered"), [(3, True), (30, False)])
async def test_a_call_asks_a_run_that_no_worker_answers_again_before_it_gives_up(
    outage: int, answered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An agent worker's restart must not use up the model call's attempts (each ~25 s).
    waits: list[float] = []
    clock = [0.0]

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds + 25  # each unanswered query takes ~25 s

    monkeypatch.setattr(model_context.asyncio, "sleep", no_wait)
    monkeypatch.setattr(model_context, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    handle = Unanswered(outage)
    request = ModelContextRequest(run_id="r", message_count=1, digest="d", first_message=0)
    ask = ActivityEnvironment().run(model_context._query_page, handle, request)
    if answered:
        assert (await ask).messages == [{"role": "user", "content": "hi"}]
        assert waits == [1.0, 2.0, 4.0]
    else:
        with pytest.raises(ApplicationError, match="could not read the context") as raised:
            await ask
        assert raised.value.type == "ContextUnavailable" and not raised.value.non_retryable
        # Given up within the attempt's start-to-close, the last query included.
        assert handle.asked == len(waits) + 1 and clock[0] < MODEL_START_TO_CLOSE.total_seconds()


async def test_the_model_rate_is_enforced_by_the_server(
    client: Client,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_MODEL_RPS", "1")
    arrivals: list[float] = []
    script = Script([tools(("list_files", {}))] * 2, final="done")

    def timed(request: dict[str, Any]) -> Any:
        arrivals.append(time.monotonic())
        return script(request)

    model_server.responder = timed
    model_worker = build_model_worker(client, task_queue)
    assert model_worker is not None and model_worker.config()["task_queue"] == f"{task_queue}-model"
    async with build_worker(client, task_queue), model_worker:
        handles = [await start(client, task_queue, goal=f"agent {i}", workspace=str(workspace)) for i in range(3)]
        # What `durable-agent status` adds: a model call held back by the rate, not started.
        waiting = await asyncio.wait_for(first_waiting(handles), timeout=30)
        assert "scheduled, not started" in waiting and "DURABLE_AGENT_MODEL_RPS" in waiting
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), timeout=90)
    assert all(r.state == "completed" for r in results)
    assert len(arrivals) == 9
    # Nine zero-latency calls take well under a second unlimited; at one a second the
    # server spaces them out (allowing a burst of two at the start).
    assert arrivals[-1] - arrivals[0] >= 6.0


@pytest.mark.parametrize("own_queue", [False, True], ids=["agent-worker", "model-queue-worker"])
async def test_a_stopped_worker_leaves_no_model_connection_open(
    client: Client,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    own_queue: bool,
) -> None:
    """Whichever worker calls the model closes its connections when it stops. Left to the
    garbage collector, their close was scheduled on a loop no longer running, and never ran."""
    if own_queue:
        monkeypatch.setenv("DURABLE_AGENT_MODEL_TASK_QUEUE", f"{task_queue}-model")
    model_server.responder = lambda request: answer("done")
    workers = [build_worker(client, task_queue), build_model_worker(client, task_queue)]
    assert (workers[1] is not None) == own_queue
    async with contextlib.AsyncExitStack() as running:
        for worker in filter(None, workers):
            await running.enter_async_context(worker)
        handle = await start(client, task_queue, goal="answer", workspace=str(workspace))
        assert (await handle.result()).state == "completed"
        assert model_server.open_connections == 1  # kept for the next call while the worker runs
    await until(lambda: model_server.open_connections == 0, within_s=10)


async def test_each_of_two_workers_of_one_plugin_closes_its_own_model_connections(
    temporal_server: EmbeddedServer, client: Client, model_server: ModelServer, task_queue: str, workspace: Path
) -> None:
    """A user's plugin given to two workers of one queue (on two connections: the SDK refuses
    two on one): each has its own model clients, and the one that stops closes its own (it
    closed the last configured one's, whose calls in flight then failed)."""
    model_server.responder = lambda request: answer("done")
    plugin = DurableAgentPlugin()
    first = Worker(client, task_queue=task_queue, plugins=[plugin])
    other_connection = await Client.connect(temporal_server.address, data_converter=client.data_converter)
    Worker(other_connection, task_queue=task_queue, plugins=[plugin])  # configured after the first, never run
    async with first:
        handle = await start(client, task_queue, goal="answer", workspace=str(workspace))
        assert (await handle.result()).state == "completed"
        assert model_server.open_connections == 1
    await until(lambda: model_server.open_connections == 0, within_s=10)


async def test_a_stopped_worker_ends_its_model_endpoint_probes_and_makes_no_client(model_server: ModelServer) -> None:
    """A worker that stops while a model endpoint is down: its probe loop ends with it (it went
    on probing through a client made after the worker had closed its own), and a call still
    running after the stop (one the server gave up on) starts no probe and makes no client."""
    model = ModelActivities()
    gate = model.outages.gate
    async with model.serving():
        outage = gate.mark_down("http://127.0.0.1:9/v1/", "connection refused")
        await asyncio.sleep(0)
    assert outage.prober is not None and outage.prober.done()
    assert outage.healthy.is_set() and gate.waiting() == {}  # its waiters went on

    assert await gate.confirm("http://127.0.0.1:9/v1/", "read error") is None  # no probe: its own error stands
    assert gate.mark_down("http://127.0.0.1:9/v1/", "read error").prober is None and gate.waiting() == {}
    with pytest.raises(ApplicationError, match="the worker has stopped"):
        async with model.outages._clients.lease():
            pass
    assert gate.probes == 0 and model_server.connections == 0


async def test_a_plugin_closes_its_model_calls_where_a_worker_brings_its_own_call_model(client: Client) -> None:
    """A worker given its own `call_model` still runs the plugin's `wait_for_model_endpoint`,
    whose probes the plugin ends when the worker stops."""

    @activity.defn(name="call_model")
    async def own_call_model(input: object) -> object:
        return input

    plugin = DurableAgentPlugin()
    worker = Worker(client, task_queue=f"own-model-{uuid.uuid4()}", activities=[own_call_model], plugins=[plugin])
    [model] = plugin._models
    async with worker:
        assert model.outages.gate.mark_down("http://127.0.0.1:9/v1/", "down").prober is not None
    assert model.outages.gate.waiting() == {}  # its probe ended with the worker
    assert model.outages.gate.mark_down("http://127.0.0.1:9/v1/", "down").prober is None


def test_a_rate_puts_model_calls_on_their_own_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_agent.worker_settings import SettingsError, worker_settings

    monkeypatch.delenv("DURABLE_AGENT_MODEL_TASK_QUEUE", raising=False)
    monkeypatch.delenv("DURABLE_AGENT_MODEL_RPS", raising=False)
    assert worker_settings("q").model_task_queue == "q"
    monkeypatch.setenv("DURABLE_AGENT_MODEL_RPS", "2.5")
    settings = worker_settings("q")
    assert settings.model_task_queue == "q-model" and settings.model_rps == 2.5
    for bad in ("-1", "0", "1e-300", "abc", "inf", "nan", "1e300"):
        monkeypatch.setenv("DURABLE_AGENT_MODEL_RPS", bad)
        with pytest.raises(SettingsError, match="DURABLE_AGENT_MODEL_RPS"):
            worker_settings("q")
    monkeypatch.delenv("DURABLE_AGENT_MODEL_RPS")
    monkeypatch.setenv("DURABLE_AGENT_MODEL_TASK_QUEUE", "   ")  # only spaces: unset
    assert worker_settings("q").model_task_queue == "q"


async def test_a_worker_gets_the_readmes_slot_defaults(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_agent.worker_settings import ENV_FIELDS

    for variable in ENV_FIELDS.values():
        monkeypatch.delenv(variable, raising=False)
    # README: "worker slots (defaults 1,000 / 20 / 200 / 2,000)", as the SDK's Worker gets them.
    config = build_worker(client, "slot-defaults").config()
    slots = ("max_concurrent_activities", "max_concurrent_workflow_tasks", "max_concurrent_local_activities")
    assert [config.get(name) for name in (*slots, "max_cached_workflows")] == [1_000, 20, 200, 2_000]


@pytest.mark.parametrize("bad", ["abc", "-1", "0", "1.5", "99999999999999999999"])
def test_a_worker_slot_setting_out_of_range_names_its_variable(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_agent.worker_settings import SettingsError, worker_settings

    monkeypatch.setenv("DURABLE_AGENT_MAX_CONCURRENT_ACTIVITIES", bad)
    with pytest.raises(SettingsError, match="DURABLE_AGENT_MAX_CONCURRENT_ACTIVITIES"):
        worker_settings("q")


async def test_cancel_while_the_model_answers_ends_the_run_cleanly(
    client: Client, worker: Worker, model_server: ModelServer, task_queue: str, workspace: Path
) -> None:
    asked, release = threading.Event(), threading.Event()

    def slow(request: dict[str, Any]) -> Reply:
        asked.set()
        release.wait(timeout=30)
        return Reply(tool_calls=[("list_files", {})])

    model_server.responder = Script([slow])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await asyncio.to_thread(asked.wait, 30)
    status = await wait_for(handle, lambda s: "calling" in s.activity)
    assert status.state == "running"
    # What the Web UI shows of it: a started activity whose heartbeat says what it does.
    pending = await pending_model_call(handle)
    assert pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED and pending.attempt == 1
    details = await DataConverter.default.decode(pending.heartbeat_details.payloads)
    assert details[0]["phase"] == "waiting for the model" and details[0]["context_from"] == "cache"
    # The context query, asked by hand with a malformed argument, says what is wrong.
    with pytest.raises(WorkflowQueryFailedError, match="first_message"):
        await handle.query("model_context", {"run_id": "r", "message_count": 1, "digest": "d", "first_message": -1})
    await handle.cancel()
    result = await asyncio.wait_for(handle.result(), timeout=60)  # the cancel lands at a beat (~3.3 s)
    release.set()
    assert result.state == "cancelled" and result.stop_reason == "cancelled"
    assert len(model_server.requests) == 1


async def test_status_says_when_a_failed_model_call_is_retried(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # Between attempts the call is scheduled with a start time in the future: not a wait for
    # the rate limit, and not a negative time.
    model_server.responder = Script([lambda request: Failure(503, "overloaded", headers={"retry-after": "20"})])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    waiting = await asyncio.wait_for(first_waiting([handle]), timeout=30)
    assert "waiting to retry: attempt 2 starts in" in waiting and "overloaded" in waiting, waiting
    seconds = int(waiting.split("starts in ")[1].split(" s")[0])
    assert 0 <= seconds <= 20
    await handle.cancel()
    assert (await handle.result()).state == "cancelled"


async def pending_model_call(handle: WorkflowHandle) -> PendingActivityInfo:
    """The run's pending call_model, once it has heartbeated."""
    while True:
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name == "call_model" and pending.heartbeat_details.payloads:
                return pending
        await asyncio.sleep(0.1)


async def first_waiting(handles: list[WorkflowHandle]) -> str:
    while True:
        for handle in handles:
            waiting = await model_call_waiting(handle)
            if waiting is not None:
                return waiting
        await asyncio.sleep(0.05)


async def test_replies_on_the_model_queue_are_redacted_like_any_other(
    client: Client,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The model queue's own worker records the replies: it must redact them too.
    secret = "sk-proj-Zq81xVb3Lm0Pw7Rt5Yu2Io9Kj4Hg6Fd"
    monkeypatch.setenv("DURABLE_AGENT_MODEL_TASK_QUEUE", f"{task_queue}-model")
    model_server.responder = Script([], final=f"the key is {secret}")
    model_worker = build_model_worker(client, task_queue)
    assert model_worker is not None
    async with build_worker(client, task_queue), model_worker:
        handle = await start(client, task_queue, goal="say the key", workspace=str(workspace))
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert secret not in result.output and "[REDACTED:" in result.output
    history = await handle.fetch_history()
    assert secret.encode() not in history.to_json().encode()
