"""A tool's dependency that goes down: the run waits for it, as for the model endpoint.

The dependency is a real HTTP service in its own process (tests/payments_service.py), not
started (its port refuses connections) while it is down; the tools (tests/dependency_tools.py)
raise `DependencyUnavailable` when it refuses. The service's log is the record of what it got.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer
from durable_agent.server import free_port
from tests.helpers import start, until, wait_for
from tests.scripts import Script, tool_results, tools
from worker import build_worker
from workflows.types import AgentStatus

ROOT = Path(__file__).resolve().parent.parent
TOOLS = "tests.dependency_tools"


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
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def received(self, prefix: str) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if line.startswith(prefix)]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path / "payments.log")
    yield service
    service.down()


async def test_a_run_waits_for_its_tools_dependency_and_pays_once_when_it_is_back(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, service: Service
) -> None:
    model_server.responder = Script([tools(("pay", {"service": service.url, "amount": 5}))], final="paid")
    async with build_worker(client, task_queue, tool_modules=[TOOLS]):
        handle = await start(client, task_queue, goal="pay 5", workspace=str(workspace), tools=["pay"])
        waiting = await wait_for(handle, lambda s: s.activity.startswith("waiting for payments-api since"), 60)
        assert waiting.state == "running"
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "waiting for payments-api since" in metadata.current_details, metadata.current_details
        states: set[str] = set()
        down_until = time.monotonic() + 5  # past the first probes (1 s, then 2 s apart)
        while time.monotonic() < down_until:
            states.add((await handle.query("status", result_type=AgentStatus)).state)
            await asyncio.sleep(0.3)
        await service.up()
        result = await asyncio.wait_for(handle.result(), 120)
    assert states == {"running"}, states  # it neither failed nor needed a person
    assert (result.state, result.output) == ("completed", "paid")
    paid = service.received("POST /pay")
    assert len(paid) == 1, paid  # made once, after the service was back: the effect happened once
    assert paid[0].endswith("/outage-1"), paid  # under a new key: the refused try took no effect
    assert service.received("GET /health"), "the worker's probe found it back"
    assert tool_results(model_server.requests[-1]) == [f"ok {paid[0].removeprefix('POST /pay ')}"]


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


async def test_another_workers_activity_tool_says_its_dependency_is_down_and_ours_probe_it(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, service: Service
) -> None:
    """An activity tool (plain Temporal, no durable-agent code) fails with `DependencyUnavailable`
    and the probe's URL in its details: the run waits on its own workers, which probe the URL."""

    @activity.defn(name="refund")
    async def refund(call: dict) -> dict:
        try:
            async with httpx.AsyncClient() as http:
                answer = await http.post(f"{service.url}/refund", content=call["idempotency_key"])
        except httpx.ConnectError as e:
            details = {"dependency": "payments-api", "probe": f"{service.url}/health"}
            raise ApplicationError(str(e), details, type="DependencyUnavailable", non_retryable=True) from e
        return {"ok": True, "output": answer.text}

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
