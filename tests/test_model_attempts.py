"""A model call retried because its worker died does not count against its attempts.

Real worker subprocesses, SIGKILLed while the stub holds their call; the call's own
failures are HTTP 500s from the stub.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from temporalio.client import Client

from durable_agent.model_server import Failure, ModelServer, Reply
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import retried_attempts, stalled, start, until
from tests.scripts import Script
from tests.test_crash import worker_env
from workflows import options

OWN_FAILURES = 4
"""Fewer than the call's 6 attempts; with the 2 deaths before them, more."""


class DiesThenFails:
    """Holds the first two requests until the test has killed their worker; then 500s; then a reply."""

    def __init__(self) -> None:
        self.requests = 0
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: dict[str, Any]) -> Reply | Failure:
        self.requests += 1
        if self.requests <= 2:
            self.held.set()
            self.release.wait(60)
            return Reply(content="nobody reads this")
        if self.requests <= 2 + OWN_FAILURES:
            return Failure(500, "upstream hiccup", headers={"retry-after-ms": "10"})
        return Reply(content="answered")


async def test_worker_deaths_do_not_use_up_a_model_calls_attempts(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    model = DiesThenFails()
    model_server.responder = model
    env = worker_env(temporal_server, model_server, task_queue)
    workers = [spawn_worker(env, tmp_path / "w0.log")]
    try:
        handle = await start(client, task_queue, goal="x", workspace=str(workspace))
        for death in range(2):
            await until(model.held.is_set, within_s=60)
            model.held.clear()
            kill_hard(workers[-1])
            workers.append(spawn_worker(env, tmp_path / f"w{death + 1}.log"))
        model.release.set()
        result = await asyncio.wait_for(handle.result(), 120)
    finally:
        model.release.set()
        stop_gently(workers[-1])
    assert result.state == "completed" and result.output == "answered", result
    assert model.requests == 2 + OWN_FAILURES + 1  # 7 attempts of one call: 2 deaths, 4 failures, the reply
    assert result.usage.model_calls == 1


async def test_a_model_call_whose_attempt_timed_out_on_a_stalled_worker_is_made_once(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    """The worker stops (SIGSTOP) for longer than the model call's heartbeat timeout while the
    stub holds its call: the server times the attempt out and retries it on the same worker,
    whose call is still in flight. The retry joins it: the model gets the request once."""
    stalled_s = options.MODEL_HEARTBEAT_TIMEOUT.total_seconds() + 4
    model_server.responder = Script([], final="answered")
    model_server.latency_s = stalled_s + 6  # still held when the worker goes on and the retry comes
    worker = spawn_worker(worker_env(temporal_server, model_server, task_queue), tmp_path / "w.log")
    try:
        handle = await start(client, task_queue, goal="x", workspace=str(workspace))
        await until(lambda: len(model_server.requests) == 1, within_s=60)
        await stalled(worker, stalled_s)
        result = await asyncio.wait_for(handle.result(), 120)
    finally:
        stop_gently(worker)
    assert (result.state, result.output) == ("completed", "answered")
    assert len(model_server.requests) == 1  # not made again by the retry
    assert await retried_attempts(handle), "no attempt timed out: the stall proved nothing"
