"""The README's promises about the CLI mid-run: Ctrl-C only detaches (exit 130), a killed
CLI leaves the run going, `watch` re-attaches; exit codes 3 (stopped) and 4 (cancelled)."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer, Reply
from tests.helpers import start, until, wait_for
from tests.scripts import Script, tools
from tests.test_cli import ROOT, cli_env, durable_agent
from workflows.types import AgentStatus


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
async def test_the_run_goes_on_when_its_cli_is_interrupted_or_killed_and_watch_reattaches(
    stop: signal.Signals, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    held = threading.Event()

    def held_answer(request: dict[str, Any]) -> Reply:
        held.wait(120)  # the run is mid-call while the CLI is stopped
        return Reply(content="finished without its CLI")

    model_server.responder = Script([tools(("write_file", {"path": "a.txt", "content": "a"})), held_answer])
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    run_id = f"detach-{task_queue}"
    cli = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "durable_agent.cli", "run", "x", "--workspace", str(workspace)],
        *["--no-worker", "--id", run_id],
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await until(lambda: len(model_server.requests) == 2)  # step 2's model call is in flight
        assert cli.stdout is not None
        printed = await asyncio.wait_for(cli.stdout.readline(), 30)
        assert printed.startswith(b"started run " + run_id.encode()), printed  # and the CLI follows it
        cli.send_signal(stop)
        out, _ = await asyncio.wait_for(cli.communicate(), 30)
    finally:
        if cli.returncode is None:
            cli.kill()
    handle = client.get_workflow_handle(run_id)
    if stop == signal.SIGINT:
        assert cli.returncode == 130
        assert f"detached; the run goes on. Re-attach: durable-agent watch {run_id}" in out.decode()
    else:
        assert cli.returncode == -signal.SIGKILL
    assert (await handle.query("status", result_type=AgentStatus)).state == "running"
    watching = asyncio.create_task(durable_agent("watch", run_id, env=env, timeout_s=120))
    held.set()
    watched = await watching
    assert watched.returncode == 0, watched
    assert "completed (final_answer) after 2 steps" in watched.stdout
    assert "  finished without its CLI" in watched.stdout.splitlines()


async def test_exit_codes_3_for_a_stopped_run_and_4_for_a_cancelled_one(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = lambda request: Reply(tool_calls=[("list_files", {})])  # never done
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    stopped = await durable_agent(
        "run", "x", "--workspace", str(workspace), "--no-worker", "--hard-steps", "2", "--soft-steps", "1", env=env
    )
    assert stopped.returncode == 3, stopped
    assert "stopped (hard_step_limit)" in stopped.stdout

    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await wait_for(handle, lambda s: s.step >= 1)
    watching = asyncio.create_task(durable_agent("watch", handle.id, env=env, timeout_s=120))
    await handle.cancel()
    watched = await watching
    assert watched.returncode == 4, watched
    assert "cancelled" in watched.stdout
