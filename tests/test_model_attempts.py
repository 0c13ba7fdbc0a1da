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
from tests.helpers import start, until
from tests.test_crash import worker_env

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
