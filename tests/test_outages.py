"""A model endpoint that goes down: runs wait for it, probing once per worker, and go on.

The endpoint is the scripted stub in its `down` mode: every request, completions and the
probes' `GET /models`, is answered HTTP 503 and counted (`ModelServer.refused`).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.worker import Worker

from activities.endpoint_health import EndpointGate
from activities.model_clients import ModelClients
from activities.model_outages import ModelOutages
from durable_agent.connection import connect
from durable_agent.metrics import worker_runtime
from durable_agent.model_server import Failure, ModelServer, Reply, count_assistant_turns
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import query_status, start, until, wait_for
from tests.scripts import Script, tools
from tests.test_metrics import scrape, value
from tests.test_resolve_all import durable_agent
from worker import build_worker
from workflows.types import AgentStatus

OUTAGE_S = 40


async def test_an_outage_longer_than_outage_wait_s_needs_a_person(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="back")
    model_server.down = True
    # Long enough that `durable-agent status`, a new process on a loaded machine, sees the wait.
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), limits={"outage_wait_s": 25})
    waiting = await wait_for(handle, lambda s: s.activity.startswith("waiting for the model endpoint"))
    assert waiting.state == "running"
    # The Web UI's Current Details of the run say it too.
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "waiting for the model endpoint since" in metadata.current_details, metadata.current_details
    shown = await durable_agent("status", handle.id)  # and `durable-agent status`
    assert "now: waiting for the model endpoint since" in shown.stdout, shown
    status = await wait_for(handle, lambda s: s.state == "needs_attention", timeout_s=60)
    assert status.attention is not None and "limits.outage_wait_s" in status.attention.last_error, status.attention
    model_server.down = False
    await handle.execute_update("resolve", {"action": "retry"})
    result = await asyncio.wait_for(handle.result(), 90)
    assert result.state == "completed" and result.output == "back"


async def test_two_hundred_waiters_share_one_probe_loop(model_server: ModelServer) -> None:
    """The worker's gate, against the real stub: 200 waits cost the probes of one."""
    outages = ModelOutages(ModelClients(AsyncOpenAI(base_url=model_server.base_url, api_key="k", max_retries=0)))
    gate = EndpointGate(outages.probe, first_s=0.25, max_interval_s=1.0)
    endpoint = model_server.base_url
    model_server.down = True
    waiters = [asyncio.ensure_future(gate.wait_until_up(endpoint, "refused")) for _ in range(200)]
    await asyncio.sleep(6)
    assert not any(w.done() for w in waiters)
    model_server.down = False
    up_at = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert time.monotonic() - up_at <= 1.5  # the next probe, at most max_interval_s away
    # One confirming probe, then 0.25, 0.75, 1.75, 2.75, 3.75, 4.75, 5.75 s (the wait doubles up
    # to its cap, then stays): 8, not 200 of each; 5 had the wait gone on doubling.
    assert 7 <= model_server.refused["GET"] <= 10, model_server.refused
    assert gate.waiting() == {}


async def test_a_wait_that_begins_after_its_outage_ended_costs_no_other_probe() -> None:
    """A wait retried late (its attempt timed out on a stalled worker) or slow to start: the
    probe that found the endpoint up since the run's call failed answers it. A call that failed
    after that probe is probed afresh."""
    answers: list[bool] = []
    up = [False]

    async def probe(endpoint: str) -> bool:
        answers.append(up[0])
        return up[0]

    gate = EndpointGate(probe, first_s=0.05, max_interval_s=0.05)
    failed_at = datetime.now(UTC)
    waiter = asyncio.ensure_future(gate.wait_until_up("e", "refused", failed_at))
    await until(lambda: len(answers) >= 2, within_s=5)  # the confirming probe, then the loop's
    up[0] = True
    await asyncio.wait_for(waiter, 5)
    probes = len(answers)
    await asyncio.wait_for(gate.wait_until_up("e", "refused", failed_at), 1)  # the same failure's late wait
    assert len(answers) == probes
    await asyncio.wait_for(gate.wait_until_up("e", "refused again", datetime.now(UTC)), 1)
    assert answers[probes:] == [True]  # a later failure: one probe, which finds it up


async def test_the_worker_metrics_say_runs_wait_for_the_endpoint_and_since_when(
    temporal_server: EmbeddedServer,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("DURABLE_AGENT_METRICS_PORT", f"127.0.0.1:{port}")
    client = await connect(temporal_server.address, worker_runtime())
    model_server.responder = Script([], final="back")
    model_server.down = True
    async with build_worker(client, task_queue):
        began = time.time()
        handle = await start(client, task_queue, goal="x", workspace=str(workspace))
        await wait_for(handle, lambda s: s.activity.startswith("waiting for the model endpoint"))

        def waiting() -> tuple[float, float]:
            samples = scrape(port)
            return value(samples, "durable_agent_model_endpoint_waiting"), value(
                samples, "durable_agent_model_endpoint_down_since"
            )

        await until(lambda: waiting()[0] == 1, within_s=20)
        assert began - 5 <= waiting()[1] <= time.time()  # since when: Unix seconds
        model_server.down = False
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.output == "back"
        assert waiting() == (0, 0)


async def test_rate_limits_beyond_retry_after_are_waited_out(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """An endpoint answering 429 past a call's six attempts: the run waits, then goes on."""
    limited_until = time.monotonic() + 6

    def respond(request: dict) -> Reply | Failure:
        if time.monotonic() < limited_until:
            return Failure(429, "slow down", headers={"retry-after-ms": "10"})
        return Reply(content="through")

    model_server.responder = respond
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    states: set[str] = set()
    while time.monotonic() < limited_until:
        states.add((await handle.query("status", result_type=AgentStatus)).state)
        await asyncio.sleep(0.3)
    result = await asyncio.wait_for(handle.result(), 90)
    assert "needs_attention" not in states and (result.state, result.output) == ("completed", "through")
    refused = len(model_server.requests) - 1
    assert 6 <= refused <= 60, refused  # six quick attempts per cycle, a cycle per probe (1 s and more apart)


async def test_twenty_waiting_runs_cost_the_endpoint_the_probes_of_one(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """Real runs wait out a 40 s outage and finish exactly; the small twin of `python -m bench outage
    --runs 200`: the stub's own count of the probes."""
    runs, steps = 20, 3
    script = Script([tools(("list_files", {}))] * steps, final="done")

    went_down: list[bool] = []

    def respond(request: dict) -> Reply | Failure:
        if count_assistant_turns(request) == 1 and not went_down:  # the first run to ask for step 2
            went_down.append(True)
            model_server.down = True
        return script(request)

    model_server.responder = respond
    handles = [await start(client, task_queue, goal=f"run {i}", workspace=str(workspace)) for i in range(runs)]
    for handle in handles:
        await wait_for(handle, lambda s: s.activity.startswith("waiting for the model endpoint since"), 120)
    # 40 s of outage, longer than a call's retries: the probes 1, 3, 7, 15 and 31 s after it began.
    # Meanwhile every run stays `running`, saying what it waits for.
    states: set[str] = set()
    while time.monotonic() - model_server.refused_log[0][0] < OUTAGE_S:
        for handle in handles:
            if (status := await query_status(handle)) is None:
                continue  # no worker answered this time; ask again next round
            waiting = status.activity.startswith("waiting for the model endpoint since")
            states.add(status.state if waiting else f"{status.state}: {status.activity}")
        await asyncio.sleep(1)
    probes, reached = model_server.refused["GET"], model_server.refused["POST"]
    model_server.down = False
    results = [await asyncio.wait_for(handle.result(), 180) for handle in handles]
    assert states == {"running"}, states
    assert [(r.state, r.usage.model_calls) for r in results] == [("completed", steps + 1)] * runs
    assert len(model_server.requests) == runs * (steps + 1)  # every call answered once, none repeated
    assert reached <= runs, reached  # at most the one call per run that found it down
    # One probe loop for the twenty runs: the confirming probe and 5 more, not 20 of each.
    assert 2 <= probes <= 8, probes
