"""Shared fixtures: one real Temporal dev server per session, a real worker per test."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Tests keep their workspaces in pytest's tmp_path: every worker of the suite, in process or
# spawned (they inherit it), accepts workspaces there.
os.environ["DURABLE_AGENT_WORKSPACE_ROOTS"] = os.path.realpath(tempfile.gettempdir())
# Workspace snapshots go to a store of the session's own, never the checkout's .durable-agent:
# made by the process that starts the session (xdist's workers inherit it), removed as it exits.
if "DURABLE_AGENT_SNAPSHOT_STORE" not in os.environ:
    os.environ["DURABLE_AGENT_SNAPSHOT_STORE"] = tempfile.mkdtemp(prefix="durable-agent-snapshots-")
    atexit.register(shutil.rmtree, os.environ["DURABLE_AGENT_SNAPSHOT_STORE"], ignore_errors=True)

from durable_agent.connection import connect  # noqa: E402
from durable_agent.model_server import ModelServer  # noqa: E402
from durable_agent.server import EmbeddedServer, free_port, start_server  # noqa: E402
from tests.scripts import Script  # noqa: E402
from worker import build_worker  # noqa: E402


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: three test processes per core. Most tests wait on a server, a worker or a
    timeout rather than compute: on 2 cores, quiet, with two per core the suite kept ~70% of
    the cores busy (user+sys 489 s in 346 s); with three, 649 tests took 308 s."""
    return 3 * (os.cpu_count() or 1)


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    home = tmp_path_factory.mktemp("temporal-home")
    server = start_server(home, port=free_port(), ui_port=None)
    os.environ["TEMPORAL_ADDRESS"] = server.address
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def client(temporal_server: EmbeddedServer) -> Client:
    return await connect(temporal_server.address)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def model_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    """A scripted OpenAI-compatible server; tests set `.responder` (default: a Script)."""
    with ModelServer(Script([])) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


@pytest.fixture
def task_queue() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture(loop_scope="session")
async def worker(client: Client, task_queue: str, model_server: ModelServer) -> AsyncIterator[Worker]:
    async with build_worker(client, task_queue) as running:
        yield running
