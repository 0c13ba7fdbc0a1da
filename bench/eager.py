"""Eager activity execution on and off, paired: `python -m bench eager [--steps 60] [--rounds 3]`.

Two dev servers side by side, the same but for `system.enableActivityEagerExecution`
(durable_agent/server.py's DYNAMIC_CONFIG turns it on), each with its own stub and one
durable-agent worker; rounds alternate between them, one agent of `--steps` steps at 0 ms
model latency per run. With it on, a workflow task that schedules an activity on its own
task queue gets the activity task back in the same response, and the worker starts it at
once, instead of the activity going through matching to the next poll. Prints ms and CPU ms
(worker + its children + the server, and the server's part) per step, medians over the
rounds, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics

from bench.contenders import DurableContender
from bench.harness import StepScript, bench
from durable_agent import server
from durable_agent.connection import connect

EAGER = "system.enableActivityEagerExecution"


@contextlib.contextmanager
def eager_setting(on: bool):
    """The servers started inside use this setting (and restore the module's after)."""
    before = dict(server.DYNAMIC_CONFIG)
    server.DYNAMIC_CONFIG[EAGER] = on
    try:
        yield
    finally:
        server.DYNAMIC_CONFIG.clear()
        server.DYNAMIC_CONFIG.update(before)


async def measure(steps: int, rounds: int) -> None:
    contenders = {}
    with contextlib.ExitStack() as stack:
        for on in (False, True):
            with eager_setting(on):
                b = stack.enter_context(bench(StepScript(steps)))
            contenders[on] = (b, DurableContender(b, await connect(b.server.address)))
            await contenders[on][1].prepare()  # its worker now, while the environment names this bench's roots
        figures: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        load = os.getloadavg()[0]
        for r in range(rounds):
            for on in (False, True) if r % 2 == 0 else (True, False):
                b, contender = contenders[on]
                b.model.responder = StepScript(steps)
                f = await contender.run(steps, 1)
                server_cpu = 1000 * f.extra["server_cpu_s"] / steps
                figures[on].append((1000 * f.wall_s / steps, 1000 * f.cpu_s / steps, server_cpu))
                print(f"round {r + 1}, eager {'on ' if on else 'off'}: {figures[on][-1][0]:.0f} ms/step", flush=True)
    print(f"{rounds} rounds of 1 agent x {steps} steps, 0 ms model; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")  # fmt: skip
    for on, runs in figures.items():
        wall, cpu, server_cpu = (statistics.median(run[i] for run in runs) for i in range(3))
        print(
            f"eager {'on ' if on else 'off'}: {wall:6.1f} ms per step, {cpu:6.1f} CPU ms per step, "
            f"of which the server {server_cpu:5.1f} (medians)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(measure(options.steps, options.rounds))


if __name__ == "__main__":
    main()
