"""The user's tools (durable_agent/tools.py): schemas, effects, retries, cache, cost, loading.

Real dev server, real workers (in process, or `python worker.py` subprocesses that load
`tests.tool_fixtures` from DURABLE_AGENT_TOOLS), the scripted model stub.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from activities.user_tools import UserToolActivities
from durable_agent.model_server import ModelServer
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import start, until, wait_for
from tests.scripts import Script, answer, tool_results, tools
from tests.test_crash import worker_env
from worker import build_worker
from workflows.types import ALL_TOOLS, AgentStatus

FIXTURES = "tests.tool_fixtures"
ROOT = Path(__file__).resolve().parent.parent


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_python_tool_gets_its_schema_runs_and_is_redacted(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOL_TEST_SECRET", "hunter2-very-secret-value")
    model_server.responder = Script(
        [tools(("shout", {"text": "hello"}), ("shout", {"txt": "typo"})), answer("shouted")]
    )
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="shout", workspace=str(workspace), tools=["shout"])
        result = await handle.result()
    assert result.state == "completed"
    offered = model_server.requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["shout"]
    shout = offered[0]["function"]
    assert shout["description"].startswith("Shout the text back")
    assert shout["parameters"]["properties"]["text"]["description"] == "What to shout"
    said, typo = tool_results(model_server.requests[1])
    assert said.startswith("HELLO ") and "hunter2" not in said  # the secret was redacted
    assert typo.startswith("ERROR: bad arguments for shout")


async def test_tools_null_offers_the_nine_built_ins_not_every_tool_a_worker_loaded(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([answer("done")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):  # send_payment, shout, ... loaded
        handle = await start(client, task_queue, goal="g", workspace=str(workspace))
        await handle.result()
    offered = [t["function"]["name"] for t in model_server.requests[0]["tools"]]
    assert offered == list(ALL_TOOLS), offered  # a user's tool is offered only to a run that names it


async def test_an_unknown_tool_closes_the_run_at_its_start(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["read_file", "no_such"])
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert "no_such" in str(failure.value.cause)
    assert model_server.requests == []  # 0 model calls


async def test_a_read_tool_is_retried(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    counter = workspace / "calls.txt"
    model_server.responder = Script([tools(("flaky_read", {"counter": str(counter)})), answer("read")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["flaky_read"])
        result = await handle.result()
    assert result.state == "completed"
    assert lines(counter) == ["call"] * 3  # two failures retried, the third answered
    assert tool_results(model_server.requests[1]) == ["value after 3 calls"]


async def test_a_retry_reads_what_the_failed_attempt_last_gave_heartbeat(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    ledger = workspace / "attempts.txt"
    model_server.responder = Script([tools(("resumable", {"ledger": str(ledger)})), answer("resumed")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["resumable"])
        result = await handle.result()
    assert result.state == "completed"
    # The worker's own beats, sent while the tool slept, did not wipe out the tool's checkpoint.
    assert lines(ledger) == ["attempt 1 saw []", "attempt 2 saw ['checkpoint', 1]"]
    assert tool_results(model_server.requests[1]) == ["resumed from ['checkpoint', 1]"]


async def test_a_write_tool_that_raises_is_a_tool_error_run_once(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    ledger = workspace / "payments.txt"
    model_server.responder = Script([tools(("declined_payment", {"ledger": str(ledger)})), answer("declined")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["declined_payment"])
        result = await handle.result()
    assert result.state == "completed" and result.output == "declined"
    assert lines(ledger) == ["tried"]  # not retried
    assert tool_results(model_server.requests[1]) == ["ERROR: declined_payment raised ValueError: card declined"]


async def test_a_short_tool_runs_as_a_local_activity_of_the_runs_worker(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    ledger = workspace / "stamps.txt"
    model_server.responder = Script([tools(("stamp", {"ledger": str(ledger)})), answer("stamped")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["stamp", "shout"])
        result = await handle.result()
    assert result.state == "completed" and tool_results(model_server.requests[1]) == ["stamped"]
    (stamped,) = lines(ledger)
    assert stamped.startswith(f"stamped {handle.id}")
    events = (await handle.fetch_history()).events
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events]
    assert "stamp" not in scheduled  # no round trip through its task queue
    markers = [e.marker_recorded_event_attributes for e in events if e.HasField("marker_recorded_event_attributes")]
    assert any(b"run_tool_here" in m.SerializeToString() for m in markers)  # it ran as a local activity


async def test_a_short_tool_the_runs_worker_lacks_goes_to_its_queue(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """The run resolves `stamp` on a worker that has it, waits for an approval, and goes on on
    a worker without it: the call falls back to the tool's own queue, served elsewhere."""
    from durable_agent.plugin import tool_worker
    from durable_agent.tools import tool_queue
    from tests.tool_fixtures import stamp

    ledger = workspace / "stamps.txt"
    model_server.responder = Script([tools(("stamp", {"ledger": str(ledger)})), answer("stamped")])
    gate = {"tools": ["stamp"]}
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["stamp"], approval=gate)
        status = await wait_for(handle, lambda s: bool(s.pending_approvals))
    served = UserToolActivities([stamp], task_queue).queues()[tool_queue(task_queue, "stamp")]
    async with build_worker(client, task_queue), tool_worker(client, tool_queue(task_queue, "stamp"), served):
        await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.state == "completed" and tool_results(model_server.requests[1]) == ["stamped"]
    assert len(lines(ledger)) == 1
    events = (await handle.fetch_history()).events
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events]
    assert scheduled.count("stamp") == 1  # after the local attempt found no such activity here


async def test_cost_usd_stops_a_run_at_max_cost(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("paid_search", {"query": f"q{i}"})) for i in range(5)])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(
            client,
            task_queue,
            goal="g",
            workspace=str(workspace),
            tools=["paid_search"],
            limits={"max_cost_usd": 3.0},
        )
        result = await handle.result()
        status = await handle.query("status")
    assert result.state == "stopped" and result.stop_reason == "cost_budget"
    assert result.usage.tool_costs == {"paid_search": 4.0}  # two calls; the third never asked for
    assert result.usage.cost_usd >= 4.0
    assert status["usage"]["tool_costs"] == {"paid_search": 4.0}


async def test_sigkill_during_a_write_tool_does_not_repeat_it(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    """The write tool's worker dies after its side effect: it is not run again, and the model
    is told the outcome is unknown; an idempotent tool's call is run again with the same key."""
    payments, charges = workspace / "payments.txt", workspace / "charges.txt"
    model_server.responder = Script(
        [
            tools(("send_payment", {"ledger": str(payments), "amount": 5, "hold_s": 60})),
            tools(("charge_card", {"ledger": str(charges), "hold_s": 60})),
            answer("paid"),
        ]
    )
    env = {**worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_TOOLS": FIXTURES}
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(
            client, task_queue, goal="pay", workspace=str(workspace), tools=["send_payment", "charge_card"]
        )
        await until(lambda: lines(payments) == ["paid 5.0"])
        kill_hard(worker)
        worker = spawn_worker(env, tmp_path / "w1.log")
        await until(lambda: len(lines(charges)) == 1)
        kill_hard(worker)
        worker = spawn_worker(env, tmp_path / "w2.log")
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        stop_gently(worker)
    assert result.state == "completed"
    assert lines(payments) == ["paid 5.0"]  # the side effect happened exactly once
    told = tool_results(model_server.requests[-1])
    assert told[0].startswith("ERROR: the outcome is unknown: the worker running send_payment stopped")
    first, again = lines(charges)
    assert first == again and first.startswith(handle.id)  # re-run, with the same key
    assert told[1] == "charged"


DIES_AFTER_RECORDING = """
import os, signal
from activities.journal import Journal

record = Journal.complete


def record_then_die(self, key, outcome):
    record(self, key, outcome)
    if outcome.output.startswith("paid"):  # send_payment's outcome is on disk; its report is not sent
        os.kill(os.getpid(), signal.SIGKILL)


Journal.complete = record_then_die
import worker

worker.main()
"""


async def test_a_write_tool_that_finished_before_its_worker_died_reports_its_recorded_outcome(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    """SIGKILLed after the call's outcome reached the journal, before its worker reported it:
    the retry answers from the journal (the recorded result, not "unknown") and never pays again."""
    payments = workspace / "payments.txt"
    model_server.responder = Script([tools(("send_payment", {"ledger": str(payments), "amount": 5})), answer("paid")])
    env = {**os.environ, **worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_TOOLS": FIXTURES}
    with open(tmp_path / "dying.log", "wb") as log:
        dying = subprocess.Popen(
            [sys.executable, "-c", DIES_AFTER_RECORDING], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    worker = None
    try:
        handle = await start(client, task_queue, goal="pay", workspace=str(workspace), tools=["send_payment"])
        await until(lambda: dying.poll() is not None)
        assert dying.returncode == -9 and lines(payments) == ["paid 5.0"], (tmp_path / "dying.log").read_text()
        worker = spawn_worker(env, tmp_path / "replacement.log")
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        kill_hard(dying)  # still alive only if it never recorded the outcome
        if worker is not None:
            stop_gently(worker)
    assert result.state == "completed" and lines(payments) == ["paid 5.0"]
    assert tool_results(model_server.requests[-1]) == ["paid 5.0"]
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in (await handle.fetch_history()).events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) == 2  # the call was retried, and the retry answered from the journal


async def test_sigkill_during_a_short_write_tool_run_locally_does_not_repeat_it(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    """A local activity has no attempt of its own on the server: the replacement worker replays
    the run and calls it again, and the journal's start record keeps it from acting twice."""
    ledger = workspace / "stamps.txt"
    model_server.responder = Script([tools(("slow_stamp", {"ledger": str(ledger), "hold_s": 4})), answer("done")])
    env = {**worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_TOOLS": FIXTURES}
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(client, task_queue, goal="stamp", workspace=str(workspace), tools=["slow_stamp"])
        await until(lambda: lines(ledger) == ["stamped"])
        kill_hard(worker)
        worker = spawn_worker(env, tmp_path / "w1.log")
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        stop_gently(worker)
    assert result.state == "completed" and lines(ledger) == ["stamped"]  # acted exactly once
    (told,) = tool_results(model_server.requests[-1])
    assert told.startswith("ERROR: the outcome is unknown: the worker running slow_stamp stopped"), told


async def test_a_read_tool_whose_service_is_down_answers_from_its_cache(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    service = workspace / "service.txt"
    service.write_text("shipped")
    lookup = {"service": str(service), "order_id": "A1"}
    other = {"service": str(service), "order_id": "B2"}

    def service_goes_down(request: dict) -> object:
        service.unlink()
        return tools(("order_status", lookup), ("order_status", other))

    model_server.responder = Script([tools(("order_status", lookup)), service_goes_down, answer("answered")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), tools=["order_status"])
        result = await handle.result()
        status = await handle.query("status", result_type=AgentStatus)
    assert result.state == "completed"
    fresh = tool_results(model_server.requests[1])[0]
    assert json.loads(fresh) == {"id": "A1", "status": "shipped"}
    cached, uncached = tool_results(model_server.requests[2])[1:]
    assert cached.startswith("[cached result from ") and ": may be inaccurate]\n" in cached
    assert cached.endswith(fresh)
    assert uncached.startswith("ERROR: order_status raised ConnectionError: order service unreachable")
    assert [d.kind for d in status.degradations] == ["cached_tool_result"]
    assert len(result.degraded) == 1 and "order_status" in result.degraded[0]


async def test_a_run_waits_for_a_worker_with_its_tool_and_goes_on_when_one_starts(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    model_server.responder = Script([tools(("shout", {"text": "hi"})), answer("heard")])
    async with build_worker(client, task_queue, tool_modules=[FIXTURES]):
        # This worker resolves the run's tools at its start, then goes away.
        handle = await start(
            client, task_queue, start_signal="pause", goal="g", workspace=str(workspace), tools=["shout"]
        )
        await wait_for(handle, lambda s: s.state == "paused")
    async with build_worker(client, task_queue):  # runs workflows, has no tools
        await handle.signal("resume")
        status = await wait_for(handle, lambda s: bool(s.tool_waits), timeout_s=60)
        assert status.tool_waits[0].startswith("waiting for a worker with tool shout since ")
        assert status.state == "running"
        env = {**worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_TOOLS": FIXTURES}
        with_tool = spawn_worker(env, tmp_path / "with-tool.log")
        try:
            result = await asyncio.wait_for(handle.result(), timeout=60)
        finally:
            stop_gently(with_tool)
    assert result.state == "completed"
    assert tool_results(model_server.requests[-1])[0].startswith("HI")


async def test_an_activity_tool_is_served_by_another_teams_worker(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    password = f"shop-db-{os.urandom(8).hex()}"
    monkeypatch.setenv("SHOP_DB_PASSWORD", password)  # our worker's, and the other team's (inherited)
    ledger = tmp_path / "tickets.jsonl"
    queue = f"{task_queue}-tickets"
    ticket = {
        "name": "open_ticket",
        "description": "Open a support ticket.",
        "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
        "task_queue": queue,
        "effect": "write",
        "approval": True,
    }
    model_server.responder = Script([tools(("open_ticket", {"title": "printer on fire"})), answer("opened")])
    with open(tmp_path / "tickets.log", "wb") as log:
        other = subprocess.Popen(
            [sys.executable, "-m", "tests.ticket_worker", temporal_server.address, queue, str(ledger)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        async with build_worker(client, task_queue):
            handle = await start(client, task_queue, goal="g", workspace=str(workspace), activity_tools=[ticket])
            status = await wait_for(handle, lambda s: bool(s.pending_approvals))
            assert not ledger.exists()  # waits for a person first
            await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
            result = await asyncio.wait_for(handle.result(), timeout=60)
            transcript = await handle.query("transcript", {"from_step": 1})
    finally:
        stop_gently(other)
    assert result.state == "completed"
    offered = [t["function"]["name"] for t in model_server.requests[0]["tools"]]
    assert offered[-1] == "open_ticket" and "read_file" in offered
    (opened,) = [json.loads(line) for line in lines(ledger)]
    assert opened["title"] == "printer on fire" and opened["key"].startswith(handle.id)
    # The other worker's answer reached the model redacted of token shapes and of our worker's
    # secret values, and so did everything the run recorded of it: the transcript, its
    # local activity's marker. Only the activity's own result event keeps what that worker
    # sent (docs/tools.md: encrypt it with the codec, or redact in that worker).
    told = "ticket opened: printer on fire (token [REDACTED:openai-key]) db [REDACTED:SHOP_DB_PASSWORD]"
    assert tool_results(model_server.requests[-1]) == [told]
    assert password not in json.dumps(transcript) and "[REDACTED:SHOP_DB_PASSWORD]" in json.dumps(transcript)
    events = (await handle.fetch_history()).events
    sent = [e for e in events if e.HasField("activity_task_completed_event_attributes")]
    recorded = [e for e in events if e.HasField("marker_recorded_event_attributes")]
    assert any(password.encode() in e.SerializeToString() for e in sent)  # as the other worker sent it
    assert not any(password.encode() in e.SerializeToString() for e in recorded)
    assert any(b"[REDACTED:SHOP_DB_PASSWORD]" in e.SerializeToString() for e in recorded)


def installed_tool_distribution(site: Path) -> None:
    """A package installed as pip leaves one: its module and a dist-info naming it in the
    entry-point group `durable_agent.tools`."""
    package = site / "acme_tools"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from durable_agent import tool\n\n\n"
        "@tool\n"
        "def acme_greeting(name: str) -> str:\n"
        '    """Greet a customer of Acme."""\n'
        '    return f"Acme greets {name}"\n'
    )
    info = site / "acme_tools-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-tools\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[durable_agent.tools]\nacme = acme_tools\n")


async def test_a_worker_loads_the_tools_of_an_installed_entry_point(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    site = tmp_path / "site-packages"
    installed_tool_distribution(site)
    model_server.responder = Script([tools(("acme_greeting", {"name": "Ada"})), answer("greeted")])
    # Nothing names the module: no DURABLE_AGENT_TOOLS, no --tools; only the distribution on the path.
    env = {**worker_env(temporal_server, model_server, task_queue), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    env.pop("DURABLE_AGENT_TOOLS", None)
    worker = spawn_worker(env, tmp_path / "worker.log")
    try:
        handle = await start(client, task_queue, goal="greet", workspace=str(workspace), tools=["acme_greeting"])
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        stop_gently(worker)
    assert result.state == "completed", (tmp_path / "worker.log").read_text()
    assert tool_results(model_server.requests[1]) == ["Acme greets Ada"]


async def test_the_worker_command_loads_tool_modules_and_names_one_it_cannot(
    temporal_server: EmbeddedServer, model_server: ModelServer, task_queue: str, tmp_path: Path
) -> None:
    env = {**os.environ, **worker_env(temporal_server, model_server, task_queue)}
    command = [sys.executable, "-m", "durable_agent.cli", "worker", "--tools", FIXTURES, "--tools", "tests.no_such"]
    failed = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert failed.returncode != 0
    assert "tool module 'tests.no_such' could not be imported" in failed.stderr
