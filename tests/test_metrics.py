"""Metrics of a scripted run, read from the worker's Prometheus endpoint."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.connection import connect
from durable_agent.metrics import publish_waiting_runs, worker_runtime
from durable_agent.model_server import Failure, ModelServer, Reply, count_assistant_turns
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import counted, start, tasks_run_again, wait_for
from tests.scripts import Script, tools
from worker import build_worker

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        if match := SAMPLE.match(line):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            samples.append((match["name"], labels, float(match["value"])))
    return samples


def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, found, v in samples if n == name and all(found.get(k) == w for k, w in labels.items()))


async def gauge_shows_one_waiting(port: int, task_queue: str) -> None:
    while value(scrape(port), "durable_agent_runs_waiting", state="awaiting_approval", task_queue=task_queue) != 1:
        await asyncio.sleep(0.2)


async def visibility_shows_waiting(client: Client, workflow_id: str) -> None:
    query = f'WorkflowId="{workflow_id}" AND AgentState="awaiting_approval"'
    while (await client.count_workflows(query)).count != 1:
        await asyncio.sleep(0.2)


def fails_once(reply: Reply) -> Any:
    """The model's first answer to this turn is an HTTP 500; the retry gets the reply."""
    failed: set[int] = set()

    def turn(request: dict[str, Any]) -> Reply | Failure:
        index = count_assistant_turns(request)
        if index not in failed:
            failed.add(index)
            return Failure(500, "upstream hiccup", headers={"retry-after-ms": "10"})
        return reply

    return turn


async def test_a_scripted_runs_metrics(
    temporal_server: EmbeddedServer,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("DURABLE_AGENT_METRICS_PORT", f"127.0.0.1:{port}")
    client: Client = await connect(temporal_server.address, worker_runtime())
    model_server.responder = Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "a"}), ("list_files", {}), input_tokens=100),
            fails_once(tools(("run_command", {"command": "cat a.txt"}), input_tokens=200)),
            # b.txt is written inside the command's activity, before it: a tool call all the same
            tools(
                ("write_file", {"path": "b.txt", "content": "b"}),
                ("run_command", {"command": "echo b"}),
                input_tokens=100,
            ),
            Reply(content="done", no_usage=True),  # its tokens are estimated, and counted as such
        ]
    )
    # No workflow cache: every workflow task replays the run from the start, and a workflow
    # metric recorded during a replay would count twice.
    async with build_worker(client, task_queue, max_cached_workflows=0):
        handle = await start(
            client,
            task_queue,
            goal="metrics",
            workspace=str(workspace),
            approval={"commands": ["^cat"]},
            limits={"soft_steps": 2, "hard_steps": 10},
        )
        status = await wait_for(handle, lambda s: bool(s.pending_approvals))
        # The query answers before visibility has the state; the gauge counts every 30 s from
        # visibility, so it starts once visibility has the run's new state.
        await asyncio.wait_for(visibility_shows_waiting(client, handle.id), timeout=60)
        waiting = asyncio.create_task(publish_waiting_runs(client, task_queue))
        try:
            await asyncio.wait_for(gauge_shows_one_waiting(port, task_queue), timeout=60)
        finally:
            waiting.cancel()
        await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
        result = await handle.result()
    assert result.state == "completed" and result.steps == 4

    samples = scrape(port)
    mine = {"task_queue": task_queue}
    model = {**mine, "model": "gpt-4.1-mini"}
    assert value(samples, "durable_agent_model_calls", outcome="ok", **model) == 4
    assert value(samples, "durable_agent_model_calls", outcome="error", error_type="ModelHttp500", **model) == 1
    assert value(samples, "durable_agent_tokens", direction="input", **model) == result.usage.input_tokens
    assert value(samples, "durable_agent_tokens", direction="output", **model) == result.usage.output_tokens
    assert result.usage.estimated_calls == 1
    estimated_input = value(samples, "durable_agent_tokens_estimated", direction="input", **model)
    assert estimated_input == result.usage.input_tokens - 400 > 0  # all but the scripted 100, 200 and 100
    assert value(samples, "durable_agent_cost_usd_sum", **model) == pytest.approx(result.usage.cost_usd)
    assert value(samples, "durable_agent_model_call_duration_count", **model) == 5
    assert value(samples, "durable_agent_tool_calls", tool="run_command", outcome="ok", **mine) == 2
    # Counted in workflow tasks (the local tools run in them too): exact, plus one per task
    # the server dropped after the worker had run it.
    again = await tasks_run_again(handle)

    def metric(expected: int, name: str, **labels: str) -> None:
        counted(f"{name} {labels}", value(samples, name, **labels), expected, again)

    metric(2, "durable_agent_tool_calls", tool="write_file", outcome="ok", **mine)  # one local, one with the command
    metric(1, "durable_agent_tool_calls", tool="list_files", outcome="ok", **mine)
    metric(4, "durable_agent_steps", **mine)
    metric(1, "durable_agent_waits", state="awaiting_approval", **mine)
    metric(1, "durable_agent_wait_duration_count", state="awaiting_approval", **mine)
    assert value(samples, "durable_agent_wait_duration_sum", state="awaiting_approval", **mine) > 0
    metric(1, "durable_agent_runs_closed", state="completed", stop_reason="final_answer", **mine)
    metric(1, "durable_agent_soft_tiers", budget="steps", **mine)
    assert value(samples, "durable_agent_recoveries", kind="tool_retry", **mine) == 0
    # The example alert rules use metrics the worker really exports.
    exported = {name for name, _, _ in samples}
    alerting = set(re.findall(r"durable_agent_[a-z_]+", (ROOT / "docs" / "alerts.yml").read_text()))
    assert alerting and alerting <= exported
    # The SDK's own worker metrics come out of the same endpoint.
    assert any(name.startswith("temporal_") for name, _, _ in samples)


def listening_addresses(pid: int, port: int) -> set[str]:
    """The local IPv4 addresses on which process `pid`'s network namespace listens on `port`
    (/proc/PID/net/tcp: hex address:port, state 0A = LISTEN)."""
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


SERVE_METRICS = (  # the runtime serves while it is referenced
    "from durable_agent.metrics import worker_runtime; r = worker_runtime(); print('up', flush=True); input()"
)


@pytest.mark.parametrize("address, expected", [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_the_metrics_port_listens_on_loopback_unless_an_address_is_given(
    address: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    env = {**os.environ, "DURABLE_AGENT_METRICS_PORT": str(port)}
    env.pop("DURABLE_AGENT_METRICS_ADDRESS", None)
    if address is not None:
        env["DURABLE_AGENT_METRICS_ADDRESS"] = address
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_METRICS], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"up\n"
        assert listening_addresses(process.pid, port) == {expected}
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("command", [["durable-agent", "worker"], ["python", "worker.py"]])
def test_a_second_worker_on_a_taken_metrics_port_says_so_in_one_line(command: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "DURABLE_AGENT_METRICS_PORT": str(port), "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
        done = subprocess.run(
            [str(Path(sys.executable).parent / command[0]), *command[1:]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in lines[0], done.stderr
