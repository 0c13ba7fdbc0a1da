"""History bytes per step stay flat, and wall time per step, on a 200-step run.

`python -m bench.history [--steps 200]`: a zero-latency model, each step one model call
plus two tool calls (write a file, run a short command). `historySizeBytes` is read with
`temporal workflow describe --output json` while the model call of steps 50, 100 and 200
is in flight (the stub holds its reply until the reading is done).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time

from bench.harness import StepScript, bench, bench_input
from durable_agent.connection import connect
from durable_agent.runs import start_agent
from durable_agent.server import temporal_binary


def history_size(address: str, workflow_id: str) -> int:
    described = subprocess.run(
        [temporal_binary(), "--address", address, "workflow", "describe", "-w", workflow_id, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(described.stdout)["workflowExecutionInfo"]["historySizeBytes"])


async def measure(steps: int, marks: list[int]) -> dict[str, object]:
    script = StepScript(steps)
    sizes: dict[int, int] = {}
    paused_s = 0.0
    workflow_id = f"history-{steps}"
    with bench(script) as b:

        def reader(step: int):
            def read() -> None:
                nonlocal paused_s
                started = time.perf_counter()
                sizes[step] = history_size(b.server.address, workflow_id)
                paused_s += time.perf_counter() - started

            return read

        for step in marks:
            script.hooks[step - 1] = reader(step)  # turn index = step - 1
        b.start_worker()
        client = await connect(b.server.address)
        agent = bench_input("benchmark", b.workspace(), steps, continue_as_new_every=10 * steps)
        started = time.perf_counter()
        handle = await start_agent(client, agent, workflow_id, b.task_queue)
        result = await handle.result()
        wall = time.perf_counter() - started - paused_s
    per_step = {
        f"{a}->{z}": round((sizes[z] - sizes[a]) / (z - a))
        for a, z in zip(marks, marks[1:], strict=False)
        if a in sizes and z in sizes
    }
    return {
        "steps": result.steps,
        "state": result.state,
        "ms_per_step": round(1000 * wall / result.steps, 1),
        "history_bytes_at_step": sizes,
        "history_bytes_per_step": per_step,
        "bytes_per_step_overall": {s: round(v / s) for s, v in sizes.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    marks = [m for m in (50, 100, 200) if m <= args.steps]
    print(json.dumps(asyncio.run(measure(args.steps, marks)), indent=2), flush=True)
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
