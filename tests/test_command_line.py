"""What a person meets at the command line: help, errors, worker processes, the demo."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer
from tests.helpers import start
from tests.scripts import Script, tools
from tests.test_cli import ROOT, cli_env

WORKER_COMMANDS = {
    "durable-agent worker": [sys.executable, "-m", "durable_agent.cli", "worker"],
    "python worker.py": [sys.executable, "worker.py"],
}


@pytest.mark.parametrize("command", WORKER_COMMANDS)
async def test_both_worker_commands_run_the_same_worker(
    command: str,
    client: Client,
    temporal_server: EmbeddedServer,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
) -> None:
    model_server.responder = Script([tools(("write_file", {"path": "w.txt", "content": "w"}))], final="done")
    process = await asyncio.create_subprocess_exec(
        *WORKER_COMMANDS[command],
        cwd=ROOT,
        env=cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        first = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert first == f"worker polling task queue {task_queue!r} on {temporal_server.address}\n"
        handle = await start(client, task_queue, goal="write w.txt", workspace=str(workspace))
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.state == "completed" and (workspace / "w.txt").read_text() == "w"
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stdout.read(), 30)).decode()
        assert await process.wait() == 0, rest
        assert rest.splitlines()[-2:] == [
            "stopping: in-flight activities get a few seconds to finish",
            "worker stopped",
        ]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
