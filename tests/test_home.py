"""durable-agent's home (`DURABLE_AGENT_HOME`): the server database there is its owner's
alone, and no workspace may hold it."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.mcp_config import McpServer
from activities.mcp_sessions import McpUnavailable, SessionPool
from activities.tools import ToolActivities
from durable_agent.model_server import ModelServer
from durable_agent.server import free_port, port_open
from tests.helpers import start
from tests.scripts import Script, tools
from tests.test_cli import cli_env, durable_agent, one_line_error
from tests.unprivileged import NOBODY, nobody_folder, unprivileged_argv, unprivileged_unavailable
from workflows.types import ToolCallInput

ROOT = Path(__file__).resolve().parent.parent


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def read_as_nobody(path: Path, scratch: Path) -> subprocess.CompletedProcess[str]:
    argv = unprivileged_argv(["head", "-c", "16", str(path)], scratch)
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every local user may enter (0755), as a home's parent often is."""
    folder = nobody_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_server_database_and_its_home_are_open_to_their_owner_only(open_folder: Path) -> None:
    home = open_folder / "home"
    port = free_port()
    env = {**os.environ, "DURABLE_AGENT_HOME": str(home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.cli", "server", "--port", str(port), "--ui-port", str(free_port())],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert server.stdout is not None and b"Temporal dev server:" in server.stdout.readline()
        files = sorted(home.glob("temporal.sqlite*")) + sorted(home.glob("*.log"))
        assert home / "temporal.sqlite" in files
        assert mode(home) == 0o700
        assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}
        # The effect that matters: another local user reads none of it.
        if (why := unprivileged_unavailable()) is None:
            scratch = nobody_folder()
            try:
                read = read_as_nobody(home / "temporal.sqlite", scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            assert read.returncode != 0 and "Permission denied" in read.stderr, read
            assert "SQLite" not in read.stdout
        else:
            print(f"not read as uid {NOBODY}: {why}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert not port_open("127.0.0.1", port)


async def test_run_refuses_a_workspace_that_holds_the_home_before_starting_anything(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = workspace / "state"
    address = f"127.0.0.1:{free_port()}"
    env = cli_env(TEMPORAL_ADDRESS=address, DURABLE_AGENT_HOME=str(home))
    refused = await durable_agent("run", "x", "--workspace", str(workspace), env=env)
    one_line_error(refused, 2, "holds durable-agent's home")
    assert not home.exists() and list(workspace.iterdir()) == []
    assert not port_open("127.0.0.1", int(address.rsplit(":", 1)[1]))


@pytest.mark.parametrize("variable", ["TMPDIR", "XDG_RUNTIME_DIR"])
async def test_run_refuses_a_workspace_that_holds_the_temporary_folder(tmp_path: Path, variable: str) -> None:
    workspace = tmp_path / "ws"
    (workspace / "tmp").mkdir(parents=True)
    address = f"127.0.0.1:{free_port()}"
    env = cli_env(TEMPORAL_ADDRESS=address, OPENAI_API_KEY="unused", **{variable: str(workspace / "tmp")})
    refused = await durable_agent("run", "x", "--workspace", str(workspace), env=env)
    one_line_error(refused, 2, f"holds or lies in the worker's folder {workspace / 'tmp'} ({variable})")
    assert list(workspace.iterdir()) == [workspace / "tmp"] and list((workspace / "tmp").iterdir()) == []
    assert not port_open("127.0.0.1", int(address.rsplit(":", 1)[1]))


@pytest.mark.parametrize("held", ["home", "temporary folder"])
async def test_the_worker_closes_a_run_whose_workspace_holds_its_state(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: str,
) -> None:
    if held == "home":
        monkeypatch.setenv("DURABLE_AGENT_HOME", str(workspace / "nested" / "home"))
        said = "holds durable-agent's home"
    else:
        (workspace / "tmp").mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(workspace / "tmp"))
        said = "holds or lies in the worker's folder"
    model_server.responder = Script([tools(("run_command", {"command": "echo ran > ran.txt"}))])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert said in str(failure.value.cause)
    assert model_server.requests == [] and not (workspace / "ran.txt").exists()


@pytest.mark.parametrize("place", ["holds the temporary folder", "lies in the live replies' folder"])
async def test_commands_and_mcp_servers_are_refused_in_a_workspace_at_the_workers_sockets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, place: str
) -> None:
    """Checked again before each command and each MCP server start, for a worker whose temporary
    folder differs from the one that started the run: both bind the workspace read-write."""
    temporary = tmp_path / "ws" / "tmp"
    workspace = temporary.parent if place.startswith("holds") else temporary / f"durable-agent-live-{os.geteuid()}"
    workspace.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setenv("DURABLE_AGENT_WORKSPACE_ROOTS", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    call = ToolCallInput(
        call_id="c", idempotency_key="k", workspace=str(workspace), arguments={"command": "echo ran > ran.txt"}
    )
    refused = await ActivityEnvironment().run(ToolActivities().run_command, call)
    assert not refused.ok and "the worker's folder" in (refused.error or "")
    assert not (workspace / "ran.txt").exists()
    server = McpServer(command=sys.executable, args=["-c", "open('ran.txt', 'w')"])
    with pytest.raises(McpUnavailable, match="the worker's folder"):
        await SessionPool().get("run", "fx", server, str(workspace))
    assert not (workspace / "ran.txt").exists()
