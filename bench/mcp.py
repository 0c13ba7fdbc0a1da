"""What a call of an MCP server's tool costs in a run, against a direct `mcp` client call on
the same server and against the built-in `write_file`.

`python -m bench mcp [--steps N] [--rounds R]`: one agent of N steps, each one call of a tool
that appends a line to a file in the workspace: `mcp__fx__append_line` of
tests/mcp_fixture_server.py (a write: journaled, a regular activity, the server sandboxed and
its session kept for the run), or the built-in `write_file` (a local activity, journaled).
Beside them, the same server's `append_line` called N times straight from an `mcp`
`ClientSession`, started the same way (sandboxed, activities/mcp_sessions.py): the server's
own cost, which the run's figure includes. A real dev server, one in-process worker (worker.py,
on DurableAgentPlugin), the zero-latency model stub in this process; modes alternate round by
round. Figures: wall ms per step (a call for the direct client) and CPU ms of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from activities.mcp_config import McpServer
from activities.mcp_sessions import McpSession
from bench.tool_calls import print_medians
from durable_agent.connection import connect
from durable_agent.model_server import ModelServer, Reply, count_assistant_turns
from durable_agent.server import free_port, start_server
from tests.helpers import start
from worker import build_worker

FIXTURE = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_fixture_server.py")
SERVER = McpServer(command=sys.executable, args=[FIXTURE])
MODES = {
    "mcp": lambda n: ("mcp__fx__append_line", {"path": "notes.txt", "line": f"step {n}"}),
    "write_file": lambda n: ("write_file", {"path": f"out/step-{n}.txt", "content": f"step {n}\n"}),
}


def responder(mode: str, steps: int, clock: list[tuple[float, float]] | None = None) -> Any:
    """The model: a call per step, then an answer; `clock` gets (wall, CPU) at each request."""

    def reply(request: dict[str, Any]) -> Reply:
        if clock is not None:
            clock.append((time.perf_counter(), time.process_time()))
        turn = count_assistant_turns(request)
        return Reply(tool_calls=[MODES[mode](turn)]) if turn < steps else Reply(content="done")

    return reply


async def one_run(
    client: Any, queue: str, server: ModelServer, mode: str, steps: int, root: Path
) -> tuple[float, float]:
    """Per step, from the second model call to the last: the run's start (the server's start
    and tool list) and its close (the session's) are paid once per run, not per call."""
    clock: list[tuple[float, float]] = []
    server.responder = responder(mode, steps, clock)
    workspace = root / uuid.uuid4().hex[:8]
    workspace.mkdir()
    fields: dict[str, Any] = {"mcp_servers": ["fx"]} if mode == "mcp" else {"tools": ["write_file"]}
    handle = await start(client, queue, goal=f"bench {mode}", workspace=str(workspace), **fields)
    result = await handle.result()
    assert result.state == "completed" and result.usage.tool_calls == steps, result
    (wall0, cpu0), (wall1, cpu1) = clock[1], clock[-1]
    return (wall1 - wall0) * 1000 / (steps - 1), (cpu1 - cpu0) * 1000 / (steps - 1)


async def direct(steps: int, root: Path) -> tuple[float, float]:
    workspace = root / uuid.uuid4().hex[:8]
    workspace.mkdir()
    session = McpSession("fx", SERVER, str(workspace))
    await session.open()
    try:
        await session.client().call_tool("append_line", {"path": "notes.txt", "line": "warm"})
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(steps):
            await session.client().call_tool("append_line", {"path": "notes.txt", "line": f"step {n}"})
        return (time.perf_counter() - wall) * 1000 / steps, (time.process_time() - cpu) * 1000 / steps
    finally:
        await session.close()


async def measure(steps: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    root = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    config = root / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"fx": SERVER.model_dump(include={"command", "args"})}}))
    os.environ.update(DURABLE_AGENT_WORKSPACE_ROOTS=str(root), DURABLE_AGENT_MCP_CONFIG=str(config))
    server = start_server(root / "home", port=free_port(), ui_port=None, persistent=False)
    figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in [*MODES, "direct"]}
    try:
        with ModelServer(responder("write_file", steps)) as model:
            os.environ.update(OPENAI_BASE_URL=model.base_url, OPENAI_API_KEY="bench")
            client = await connect(server.address)
            queue = f"bench-mcp-{uuid.uuid4().hex[:6]}"
            async with build_worker(client, queue):
                for mode in MODES:  # warm up every path
                    await one_run(client, queue, model, mode, 3, root)
                for _ in range(rounds):
                    for mode in MODES:
                        figures[mode].append(await one_run(client, queue, model, mode, steps, root))
                    figures["direct"].append(await direct(steps, root))
    finally:
        server.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench mcp", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    figures = asyncio.run(measure(args.steps, args.rounds))
    print(f"{args.steps} steps x {args.rounds} rounds, medians per step (per call for direct); load {load:.1f}:")
    print_medians(figures)
