"""What a call of the user's own tool costs, against the built-in `write_file`.

`python -m bench tools [--steps N] [--rounds R]`: one agent of N steps, each one call of a
tool that writes a small file in the workspace: the built-in `write_file` (a local
activity, journaled), or `note` (bench/tool_module.py: an `@tool(effect="write")` function,
a regular activity on its tool's own task queue). A real dev server, one in-process worker
(built by worker.py, on DurableAgentPlugin), the zero-latency model stub in this process;
modes alternate round by round. Figures: wall ms per step and CPU ms per step of this
process (worker, workflow, stub and client together: the same for both modes but the tool).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from durable_agent.connection import connect
from durable_agent.model_server import ModelServer, Reply, count_assistant_turns
from durable_agent.server import free_port, start_server
from tests.helpers import start
from worker import build_worker

MODES = {
    "write_file": lambda n: ("write_file", {"path": f"out/step-{n}.txt", "content": f"step {n}\n"}),
    "note": lambda n: ("note", {"name": f"step-{n}", "text": f"step {n}\n"}),
}


def responder(mode: str, steps: int) -> Any:
    def reply(request: dict[str, Any]) -> Reply:
        turn = count_assistant_turns(request)
        return Reply(tool_calls=[MODES[mode](turn)]) if turn < steps else Reply(content="done")

    return reply


async def one_run(
    client: Any, queue: str, server: ModelServer, mode: str, steps: int, root: Path
) -> tuple[float, float]:
    server.responder = responder(mode, steps)
    workspace = root / uuid.uuid4().hex[:8]
    workspace.mkdir()
    tools = ["note"] if mode == "note" else ["write_file"]
    wall, cpu = time.perf_counter(), time.process_time()
    handle = await start(client, queue, goal=f"bench {mode}", workspace=str(workspace), tools=tools)
    result = await handle.result()
    assert result.state == "completed" and result.usage.tool_calls == steps, result
    return (time.perf_counter() - wall) * 1000 / steps, (time.process_time() - cpu) * 1000 / steps


async def measure(steps: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    root = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    os.environ["DURABLE_AGENT_WORKSPACE_ROOTS"] = str(root)
    server = start_server(root / "home", port=free_port(), ui_port=None, persistent=False)
    figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    try:
        with ModelServer(responder("write_file", steps)) as model:
            os.environ.update(OPENAI_BASE_URL=model.base_url, OPENAI_API_KEY="bench")
            client = await connect(server.address)
            queue = f"bench-tools-{uuid.uuid4().hex[:6]}"
            async with build_worker(client, queue, tool_modules=["bench.tool_module"]):
                await one_run(client, queue, model, "note", 3, root)  # warm up both paths
                await one_run(client, queue, model, "write_file", 3, root)
                for _ in range(rounds):
                    for mode in MODES:
                        figures[mode].append(await one_run(client, queue, model, mode, steps, root))
    finally:
        server.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench tools", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.steps, args.rounds))
    print(f"{args.steps} steps x {args.rounds} rounds, medians per step:")
    print_medians(figures)


def print_medians(figures: dict[str, list[tuple[float, float]]]) -> None:
    """One row per mode: the median wall and CPU ms of its runs."""
    print(f"{'tool':<12} {'wall ms':>8} {'CPU ms':>8}")
    for mode, runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{mode:<12} {wall:>8.1f} {cpu:>8.1f}")
