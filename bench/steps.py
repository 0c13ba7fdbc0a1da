"""Where a step's time goes, read from history: `python -m bench steps [--steps 30] [--rounds 1]`.

The benchmark agent (bench/harness.py) at 0 ms model latency, one run of `--steps` steps per
contender of `bench fleet` (durable-agent, the bare plain Temporal loop, the loop with
durable-agent's tools) per round, on one dev server. From each run's history: events per
step by type, and the time between consecutive events by pair (e.g. `ACTIVITY_TASK_STARTED
run_command -> ACTIVITY_TASK_COMPLETED run_command`: the command's activity as the server saw
it), in ms per step and as a median, largest first. The server's event times: a gap is what
the worker and the server did between two events, not one process's share.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle

from bench.fleet import contenders, timed_run
from bench.harness import StepScript, bench
from durable_agent.connection import connect

SHOWN = 8
"""Event pairs printed per run, the largest total first."""


def label(event: HistoryEvent, activities: dict[int, str]) -> str:
    """The event's type, with the activity's name or the marker's."""
    name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
    attributes = event.WhichOneof("attributes")
    if attributes == "activity_task_scheduled_event_attributes":
        activities[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        return f"{name} {activities[event.event_id]}"
    if attributes in ("activity_task_started_event_attributes", "activity_task_completed_event_attributes"):
        return f"{name} {activities.get(getattr(event, attributes).scheduled_event_id, '?')}"
    if attributes == "marker_recorded_event_attributes":
        return f"{name} {event.marker_recorded_event_attributes.marker_name}"
    return name


async def analyse(handle: WorkflowHandle, steps: int) -> dict[str, Any]:
    events = [event async for event in handle.fetch_history_events()]
    activities: dict[int, str] = {}
    labels = [label(event, activities) for event in events]
    times = [event.event_time.ToMicroseconds() / 1000 for event in events]
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    for i in range(1, len(events)):
        gaps[f"{labels[i - 1]} -> {labels[i]}"].append(times[i] - times[i - 1])
    counts = collections.Counter(label.split()[0] for label in labels)
    return {"events_per_step": {k: round(v / steps, 2) for k, v in counts.most_common()}, "gaps": gaps}


def report(name: str, ms_per_step: float, figures: dict[str, Any], steps: int) -> None:
    per_step = figures["events_per_step"]
    print(f"== {name}: {ms_per_step:.1f} ms per step, {sum(per_step.values()):.1f} events per step")
    print("   " + ", ".join(f"{k} {v:g}" for k, v in per_step.items()))
    gaps = sorted(figures["gaps"].items(), key=lambda item: -sum(item[1]))
    for pair, values in gaps[:SHOWN]:
        total, median = sum(values) / steps, statistics.median(values)
        print(f"   {total:6.1f} ms/step  median {median:6.1f} ms  x{len(values)}  {pair}")


async def measure(steps: int, rounds: int) -> None:
    load = os.getloadavg()[0]
    with bench(StepScript(steps)) as b:
        client = await connect(b.server.address)
        every = contenders(b)
        for contender in every:  # warm up: worker start-up and first-run costs are in no figure
            await timed_run(client, contender, 0, 2)
        for r in range(rounds):
            for contender in every[r % len(every) :] + every[: r % len(every)]:
                handle, seconds = await timed_run(client, contender, 1, steps)
                report(contender.name, 1000 * seconds / steps, await analyse(handle, steps), steps)
    print(f"{rounds} round(s) of 1 agent x {steps} steps, 0 ms model; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    asyncio.run(measure(options.steps, options.rounds))
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
