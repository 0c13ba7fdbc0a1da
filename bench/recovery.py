"""Time from SIGKILL of a worker to the run's next finished step, over repeated kills.

`python -m bench.recovery [--kills 10] [--restart-delay 0.5]`: one long run of the
benchmark agent; a worker is SIGKILLed at a random moment, a new one started 0.5 s later.
Recovery time = from the kill to the next step beginning in history, i.e. the step that
was in flight has finished on the new worker and the next one has begun.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from typing import Any

from temporalio.client import Client, WorkflowHandle

from bench.harness import RecheckingScript, bench, bench_input
from durable_agent.connection import connect
from durable_agent.runs import start_agent
from workflows.agent import AGENT_STEP


async def recorded_step(handle: WorkflowHandle) -> int:
    """The step the run's history has reached: the `AgentStep` search attribute, written by
    a completed workflow task. A `status` query would not do: it answers from the worker's
    memory, which runs ahead of history while a task is in flight, and a kill timed on it
    can land before the previous recovery was recorded, so that two recoveries overlap."""
    description = await handle.describe()
    return description.typed_search_attributes.get(AGENT_STEP) or 0


async def wait_progress(handle: WorkflowHandle, beyond: int) -> None:
    while True:
        step = await recorded_step(handle)
        if step > beyond:
            return
        await asyncio.sleep(0.05)


async def steps_begun(client: Client, workflow_id: str) -> list[float]:
    """Times (epoch seconds) at which each step began, over every run of the chain: the
    search-attribute upsert that publishes the new step number before its model call."""
    times = []
    async for run in client.list_workflows(f'WorkflowId="{workflow_id}"'):
        history = await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history()
        times += [
            event.event_time.ToDatetime().timestamp()
            for event in history.events
            if event.HasField("upsert_workflow_search_attributes_event_attributes")
        ]
    return sorted(times)


async def measure(kills: int, restart_delay_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    steps = 60 * kills + 100
    script = RecheckingScript(steps)  # re-checks a command it was told was interrupted, as a real model would
    kill_times: list[float] = []
    with bench(script) as b:
        worker = b.start_worker()
        client = await connect(b.server.address)
        workspace = b.workspace()
        agent = bench_input("benchmark", workspace, steps)
        handle = await start_agent(client, agent, "recovery", b.task_queue)
        for _ in range(kills):
            # Two steps recorded since the last kill: that recovery is over before the next kill.
            await wait_progress(handle, await recorded_step(handle) + 2)
            await asyncio.sleep(rng.uniform(0, 0.3))
            b.kill_worker(worker)
            kill_times.append(time.time())
            await asyncio.sleep(restart_delay_s)
            worker = b.start_worker()
        result = await handle.result()
        begun = await steps_begun(client, "recovery")
        ledger = (workspace / "ledger.txt").read_text().split()
    recoveries = [min(t for t in begun if t > k) - k for k in kill_times]
    return {
        "kills": kills,
        "restart_delay_s": restart_delay_s,
        "recovery_s": [round(r, 2) for r in recoveries],
        "median_s": round(statistics.median(recoveries), 2),
        "worst_s": round(max(recoveries), 2),
        "state": result.state,
        "steps": result.steps,
        "model_calls_served": len(b.model.requests),
        "commands_reported_interrupted": len(script.rechecked),
        "side_effects_duplicated": len(ledger) - len(set(ledger)),
        "side_effects_missing": steps - len(set(ledger)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--restart-delay", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.kills, args.restart_delay, args.seed)), indent=2), flush=True)
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
