"""Time from SIGKILL of a worker to the run's next finished step, over repeated kills, and
what each kill interrupted.

`python -m bench.recovery [--kills 10] [--restart-delay 0.5] [--seed 7] [--start PATH]
[--latency-ms MS]`: one long run of the benchmark agent, started by `start_agent`, by
`durable-agent run --detach --no-worker`, or by a plain `temporal workflow start` with no
`--task-timeout` (`--start start_agent|run|temporal`), against a stub model answering in
`--latency-ms` (default 0); a worker is SIGKILLed at a random moment, a new one started
`--restart-delay` s later (0: at once, as `bench compare` does). Recovery time = from the
kill (and from the restart) to the next step beginning in history, i.e. the step that was
in flight has finished on the new worker and the next one has begun. Each kill is
classified from history by what it interrupted: a workflow task (which waits out its
timeout), an activity (the model call or a command: its heartbeat timeout, or a takeover
by the new worker), or nothing in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from bench.harness import Bench, RecheckingScript, bench, bench_input
from durable_agent.connection import connect
from durable_agent.runs import chain_histories, start_agent
from durable_agent.server import temporal_binary
from durable_agent.takeover import WORKER_GONE
from workflows.types import WORKFLOW_TYPE, AgentResult

START_PATHS = ("start_agent", "run", "temporal")
RUN_ID = "recovery"


async def recorded_step(handle: WorkflowHandle) -> int:
    """The steps the run's history has recorded: its completed `call_model` activities. A
    `status` query would not do: it answers from the worker's memory, which runs ahead of
    history while a task is in flight, and a kill timed on it can land before the previous
    recovery was recorded, so that two recoveries overlap. (The `AgentStep` search attribute
    is refreshed at most every 10 s.) The bench's runs stay within one run of their chain."""
    model_calls: set[int] = set()
    completed = 0
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name == "call_model":
                model_calls.add(event.event_id)
        elif event.HasField("activity_task_completed_event_attributes"):
            completed += event.activity_task_completed_event_attributes.scheduled_event_id in model_calls
    return completed


async def wait_progress(handle: WorkflowHandle, beyond: int) -> None:
    while True:
        step = await recorded_step(handle)
        if step > beyond:
            return
        await asyncio.sleep(0.05)


@dataclass
class Event:
    at: float
    """Epoch seconds."""
    kind: str
    """The event type without its EVENT_TYPE_ prefix."""
    raw: HistoryEvent
    run: int
    """Which run of the continue-as-new chain it belongs to (event ids are per run)."""


async def chain_events(client: Client, workflow_id: str) -> list[Event]:
    """Every event of every run of the continue-as-new chain, in time order."""
    events = [
        Event(e.event_time.ToDatetime().timestamp(), EventType.Name(e.event_type).removeprefix("EVENT_TYPE_"), e, run)
        for run, history in enumerate(await chain_histories(client, workflow_id))
        for e in history.events
    ]
    return sorted(events, key=lambda e: e.at)


def step_began(event: Event) -> bool:
    # A step begins with its model call scheduled.
    return (
        event.kind == "ACTIVITY_TASK_SCHEDULED"
        and event.raw.activity_task_scheduled_event_attributes.activity_type.name == "call_model"
    )


def interrupted(events: list[Event], killed_at: float, recovered_at: float) -> str:
    """What the kill caught in flight, told by how the server got the run going again. A
    workflow task comes first: when one was in flight too, its timeout is what was waited for."""
    window = [e for e in events if killed_at < e.at <= recovered_at]
    for event in window:
        timeout = event.raw.workflow_task_timed_out_event_attributes.timeout_type
        if event.kind == "WORKFLOW_TASK_TIMED_OUT" and timeout == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE:
            # Later attempts are not recorded one by one; the started task says which it was.
            attempts = [e.raw.workflow_task_scheduled_event_attributes.attempt for e in window]
            return "workflow task" if max(attempts) <= 2 else "workflow task, then its replay timed out too"
    activity_types = {
        (e.run, e.raw.event_id): e.raw.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.kind == "ACTIVITY_TASK_SCHEDULED"
    }
    for event in window:
        started = event.raw.activity_task_started_event_attributes
        if event.kind == "ACTIVITY_TASK_STARTED" and started.attempt > 1:
            call = (
                "model call"
                if activity_types.get((event.run, started.scheduled_event_id)) == "call_model"
                else "tool call"
            )
            taken = started.last_failure.application_failure_info.type == WORKER_GONE
            return f"{call}, taken over" if taken else f"{call}, heartbeat timeout"
    return "nothing in flight"


async def start_run(path: str, b: Bench, client: Client, workspace: Path, steps: int) -> WorkflowHandle:
    """The run, started the way `path` names; its handle."""
    agent = bench_input("benchmark", workspace, steps)
    if path == "start_agent":
        return await start_agent(client, agent, RUN_ID, b.task_queue)
    if path == "temporal":
        command = [temporal_binary(), "--address", b.server.address, "workflow", "start", "--type", WORKFLOW_TYPE]
        command += ["--task-queue", b.task_queue, "--workflow-id", RUN_ID, "--input", agent.model_dump_json()]
    else:
        limits = [f"--{k.replace('_', '-')}={v}" for k, v in agent.limits.model_dump(exclude_none=True).items()]
        command = [str(Path(sys.executable).parent / "durable-agent"), "run", agent.goal, "--workspace", str(workspace)]
        command += ["--id", RUN_ID, "--no-worker", "--detach", *limits]
    env = {**os.environ, **b.worker_env}
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=60)
    return client.get_workflow_handle(RUN_ID, result_type=AgentResult)


async def measure(kills: int, restart_delay_s: float, seed: int, start: str, latency_ms: int) -> dict[str, Any]:
    rng = random.Random(seed)
    steps = 60 * kills + 100
    script = RecheckingScript(steps)  # re-checks a command it was told was interrupted, as a real model would
    kill_times: list[float] = []
    restart_times: list[float] = []
    with bench(script, latency_s=latency_ms / 1000) as b:
        worker = b.start_worker()
        client = await connect(b.server.address)
        workspace = b.workspace()
        handle = await start_run(start, b, client, workspace, steps)
        for _ in range(kills):
            # Two steps recorded since the last kill: that recovery is over before the next kill.
            await wait_progress(handle, await recorded_step(handle) + 2)
            await asyncio.sleep(rng.uniform(0, 0.3))
            b.kill_worker(worker)
            kill_times.append(time.time())
            await asyncio.sleep(restart_delay_s)
            worker = b.start_worker()
            restart_times.append(time.time())
        result = await handle.result()
        events = await chain_events(client, RUN_ID)
        ledger = (workspace / "ledger.txt").read_text().split()
    recovered = [min(e.at for e in events if step_began(e) and e.at > k) for k in kill_times]
    from_kill = [r - k for r, k in zip(recovered, kill_times, strict=True)]
    from_restart = [r - k for r, k in zip(recovered, restart_times, strict=True)]
    kinds = [interrupted(events, k, r) for k, r in zip(kill_times, recovered, strict=True)]
    return {
        "start": start,
        "latency_ms": latency_ms,
        "kills": kills,
        "restart_delay_s": restart_delay_s,
        "recovery_s": [round(r, 2) for r in from_kill],
        "median_s": round(statistics.median(from_kill), 2),
        "worst_s": round(max(from_kill), 2),
        "from_restart_s": {"median": round(statistics.median(from_restart), 2), "worst": round(max(from_restart), 2)},
        "by_interruption": {
            kind: [round(t, 2) for t, k in zip(from_kill, kinds, strict=True) if k == kind]
            for kind in sorted(set(kinds))
        },
        "state": result.state,
        "steps": result.steps,
        "model_calls_served": len(b.model.requests),
        "commands_reported_interrupted": len(script.rechecks),
        "side_effects_duplicated": len(ledger) - len(set(ledger)),
        "side_effects_missing": steps - len(set(ledger)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--restart-delay", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--start", choices=START_PATHS, default="start_agent")
    parser.add_argument("--latency-ms", type=int, default=0)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.kills, args.restart_delay, args.seed, args.start, args.latency_ms))
    print(json.dumps(figures, indent=2), flush=True)
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
