"""A tool's dependency that goes down: the run waits for it, as for the model endpoint.

The dependency is a real HTTP service in its own process (tests/payments_service.py), not
started (its port refuses connections) while it is down; the tools (tests/dependency_tools.py)
raise `DependencyUnavailable` when it refuses. The service's log is the record of what it got.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from durable_agent.connection import connect
from durable_agent.metrics import worker_runtime
from durable_agent.model_server import ModelServer, Reply
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import start, until, wait_for
from tests.scripts import Script, tool_results, tools
from tests.test_metrics import scrape, value
from worker import build_worker
from workflows.types import AgentStatus

ROOT = Path(__file__).resolve().parent.parent
TOOLS = "tests.dependency_tools"
MCP_FIXTURE = str(ROOT / "tests" / "mcp_fixture_server.py")


class Service:
    """The payments service: started and stopped on one port."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None

    async def up(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.payments_service", str(self.port), str(self.log)], cwd=ROOT
        )
        await until(self._listening, within_s=30)

    def down(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()

    def _listening(self) -> bool:
        return self.listening(self.port)

    @staticmethod
    def listening(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def received(self, prefix: str) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if line.startswith(prefix)]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path / "payments.log")
    yield service
    service.down()


async def test_runs_wait_for_their_tools_dependency_and_pay_once_each_when_it_is_back(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, service: Service, tmp_path: Path
) -> None:
    tries = tmp_path / "tries"
    call = ("pay", {"service": service.url, "amount": 5, "tries": str(tries)})
    model_server.responder = Script([tools(call)], final="paid")
    async with build_worker(client, task_queue, tool_modules=[TOOLS]):
        handles = [
            await start(client, task_queue, goal=f"pay {i}", workspace=str(workspace), tools=["pay"]) for i in range(4)
        ]
        for handle in handles:
            waiting = await wait_for(handle, lambda s: s.activity.startswith("waiting for payments-api since"), 60)
            assert waiting.state == "running"
        metadata = await handles[0].query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "waiting for payments-api since" in metadata.current_details, metadata.current_details
        states: set[str] = set()
        down_until = time.monotonic() + 5  # past the first probes (1 s, then 2 s apart)
        while time.monotonic() < down_until:
            for handle in handles:
                states.add((await handle.query("status", result_type=AgentStatus)).state)
            await asyncio.sleep(0.3)
        tried_while_down = len(tries.read_text().splitlines())
        await service.up()
        results = [await asyncio.wait_for(handle.result(), 120) for handle in handles]
    assert states == {"running"}, states  # none failed nor needed a person
    assert [(r.state, r.output) for r in results] == [("completed", "paid")] * 4
    # While it was down each run tried it at most once (the try that found it down); the
    # worker's gate failed any later call without running the tool.
    assert 1 <= tried_while_down <= 4, tried_while_down
    paid = service.received("POST /pay")
    assert len(paid) == 4, paid  # each run's call made once, after the service was back
    assert all(line.endswith("/outage-1") for line in paid), paid  # under a new key: the refused try took no effect
    assert len({line.split()[-1] for line in paid}) == 4, paid
    # One probe loop for the four waiting runs: the probe that found it back, not one per run.
    assert 1 <= len(service.received("GET /health")) <= 2, service.received("GET /health")
    assert sorted(tool_results(r)[0] for r in model_server.requests if tool_results(r)) == sorted(
        f"ok {line.removeprefix('POST /pay ')}" for line in paid
    )


async def test_a_dependency_down_longer_than_outage_wait_s_needs_a_person(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, service: Service
) -> None:
    """The short read tool runs as a local activity of the run's worker: the same wait."""
    model_server.responder = Script([tools(("balance", {"service": service.url}))], final="known")
    async with build_worker(client, task_queue, tool_modules=[TOOLS]):
        handle = await start(
            client, task_queue, goal="balance", workspace=str(workspace), tools=["balance"], limits={"outage_wait_s": 4}
        )
        status = await wait_for(handle, lambda s: s.state == "needs_attention", 60)
        assert status.attention is not None
        assert "payments-api is down since" in status.attention.last_error, status.attention
        assert "limits.outage_wait_s = 4 s" in status.attention.last_error, status.attention
        assert service.received("") == []
        await service.up()
        await handle.execute_update("resolve", {"action": "retry"})
        result = await asyncio.wait_for(handle.result(), 120)
    assert (result.state, result.output) == ("completed", "known")
    assert len(service.received("POST /balance")) == 1


def post(url: str, body: str) -> str:
    with urllib.request.urlopen(url, data=body.encode(), timeout=5) as answer:
        return answer.read().decode()


async def test_another_workers_activity_tool_says_its_dependency_is_down_and_ours_probe_it(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, service: Service
) -> None:
    """An activity tool (plain Temporal, no durable-agent code) fails with `DependencyUnavailable`
    and the probe's URL in its details: the run waits on its own workers, which probe the URL."""

    @activity.defn(name="refund")
    async def refund(call: dict) -> dict:
        try:
            answer = await asyncio.to_thread(post, f"{service.url}/refund", call["idempotency_key"])
        except urllib.error.URLError as e:
            details = {"dependency": "payments-api", "probe": f"{service.url}/health"}
            raise ApplicationError(str(e), details, type="DependencyUnavailable", non_retryable=True) from e
        return {"ok": True, "output": answer}

    other_queue = f"{task_queue}-refunds"
    spec = {"name": "refund", "description": "Refund.", "parameters": {"type": "object"}, "task_queue": other_queue}
    model_server.responder = Script([tools(("refund", {}))], final="refunded")
    async with build_worker(client, task_queue), Worker(client, task_queue=other_queue, activities=[refund]):
        handle = await start(client, task_queue, goal="refund", workspace=str(workspace), activity_tools=[spec])
        waiting = await wait_for(handle, lambda s: s.activity.startswith("waiting for payments-api since"), 60)
        assert waiting.state == "running"
        await service.up()
        result = await asyncio.wait_for(handle.result(), 120)
    assert (result.state, result.output) == ("completed", "refunded")
    assert len(service.received("POST /refund")) == 1
    assert service.received("GET /health"), "our worker probed the URL the other worker gave"


async def test_an_http_mcp_server_that_stops_is_waited_for_and_written_to_once(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server stops between the run's start and its write call: the call finds it refusing
    connections, the run waits for `MCP server web`, and writes once when it is back."""
    port, served = free_port(), tmp_path / "served"
    served.mkdir()
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}}))
    monkeypatch.setenv("DURABLE_AGENT_MCP_CONFIG", str(config))
    processes: list[subprocess.Popen[bytes]] = []

    def serve() -> None:
        command = [sys.executable, MCP_FIXTURE, "--http", str(port)]
        processes.append(subprocess.Popen(command, cwd=served, stderr=subprocess.DEVNULL))

    def respond(request: dict) -> Reply:
        if len(processes) == 1 and processes[0].poll() is None:  # the first step: the server stops
            processes[0].kill()
            processes[0].wait()
            return tools(("mcp__web__append_line", {"path": "effects.txt", "line": "written"}))
        return Reply(content="written")

    model_server.responder = respond
    serve()
    try:
        await until(lambda: Service.listening(port), within_s=30)
        async with build_worker(client, task_queue):
            handle = await start(client, task_queue, goal="write", workspace=str(workspace), mcp_servers=["web"])
            waiting = await wait_for(handle, lambda s: s.activity.startswith("waiting for MCP server web since"), 90)
            assert waiting.state == "running"
            assert not (served / "effects.txt").exists()
            serve()
            result = await asyncio.wait_for(handle.result(), 120)
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert (result.state, result.output) == ("completed", "written")
    assert (served / "effects.txt").read_text().splitlines() == ["written"]


async def test_the_worker_metrics_say_runs_wait_for_the_dependency_and_since_when(
    temporal_server: EmbeddedServer,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    service: Service,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("DURABLE_AGENT_METRICS_PORT", f"127.0.0.1:{port}")
    client = await connect(temporal_server.address, worker_runtime())
    model_server.responder = Script([tools(("pay", {"service": service.url, "amount": 1}))], final="paid")

    def gauges() -> tuple[float, float]:
        samples = scrape(port)
        return value(samples, "durable_agent_dependency_waiting", dependency="payments-api"), value(
            samples, "durable_agent_dependency_down_since", dependency="payments-api"
        )

    async with build_worker(client, task_queue, tool_modules=[TOOLS]):
        began = time.time()
        handle = await start(client, task_queue, goal="pay", workspace=str(workspace), tools=["pay"])
        await wait_for(handle, lambda s: s.activity.startswith("waiting for payments-api"), 60)
        await until(lambda: gauges()[0] == 1, within_s=30)
        assert began - 5 <= gauges()[1] <= time.time()  # since when: Unix seconds
        await service.up()
        result = await asyncio.wait_for(handle.result(), 120)
        assert result.output == "paid"
        assert gauges() == (0, 0)
