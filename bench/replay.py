"""How long a new worker takes to replay a run before its first new step, with and without
the SDK's sandbox.

`python -m bench.replay [--steps 49] [--rounds 5]`: records one run of the benchmark agent
as one run, with no continue-as-new (a replacement worker replays at most
`continue_as_new_every` = 50 steps after a crash), then replays it `rounds` times with
each runner.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bench.harness import StepScript, bench, bench_input
from durable_agent.connection import connect, data_converter
from durable_agent.runs import start_agent
from worker import WORKFLOW_RUNNER, build_worker
from workflows.agent import AgentWorkflow


async def record(steps: int) -> WorkflowHistory:
    with bench(StepScript(steps)) as b:
        os.environ.update({"OPENAI_BASE_URL": b.model.base_url, "OPENAI_API_KEY": "bench"})
        client = await connect(b.server.address)
        async with build_worker(client, b.task_queue):
            agent = bench_input("benchmark", b.workspace(), steps, continue_as_new_every=10 * steps)  # one run
            handle = await start_agent(client, agent, "replay", b.task_queue)
            await handle.result()
        return await handle.fetch_history()


async def replay_s(history: WorkflowHistory, runner: WorkflowRunner) -> float:
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=runner)
    started = time.perf_counter()
    result = await replayer.replay_workflow(history)
    if result.replay_failure is not None:
        raise result.replay_failure
    return time.perf_counter() - started


async def measure(steps: int, rounds: int) -> dict[str, Any]:
    history = await record(steps)
    workers = f"the worker's ({type(WORKFLOW_RUNNER).__name__})"
    runners = {"sandboxed": SandboxedWorkflowRunner(), workers: WORKFLOW_RUNNER}
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):  # interleaved, so a busy moment hits both alike
        for name, runner in runners.items():
            times[name].append(await replay_s(history, runner))
    return {
        "steps": steps,
        "events": len(history.events),
        "replay_s": {
            name: {"median": round(statistics.median(t), 3), "min": round(min(t), 3), "max": round(max(t), 3)}
            for name, t in times.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=49)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.steps, args.rounds)), indent=2), flush=True)
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
