"""This checkout's durable-agent against another's, paired: `python -m bench pair --base PATH
[--steps 40] [--rounds 8] [--agents 1] [--latency-ms 0] [--same-workspaces]`.

PATH is another checkout of the project (`git worktree add /tmp/base <commit>`). One dev
server and stub; one durable-agent worker per checkout (`python worker.py` of each, with
that checkout first on its path), each on a task queue of its own; rounds alternate which
goes first. Per run: `--agents` agents of `--steps` steps against the stub answering in
`--latency-ms` (0), started together, each in a new folder, or with `--same-workspaces` agent
i in the same folder in every run (a repository its agents work in again). Prints per round
the run's wall ms per step and each worker's CPU ms per step (with its children: commands,
sandboxes), then their medians and this ÷ base per round.
Alternating in one process on one server is what makes a change of a few percent visible
on a shared machine, where two invocations minutes apart differ by more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.contenders import _cpu_s
from bench.harness import Bench, StepScript, bench, bench_input
from durable_agent.connection import connect
from durable_agent.runs import start_agent

HERE = Path(__file__).resolve().parents[1]


def spawn(b: Bench, root: Path, queue: str) -> subprocess.Popen[bytes]:
    """`root`'s worker.py with `root` first on its path, stopped with the bench."""
    env = {**os.environ, **b.worker_env, "DURABLE_AGENT_TASK_QUEUE": queue, "PYTHONPATH": str(root)}
    with open(b.home / f"worker-{queue}.log", "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, str(root / "worker.py")],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    b.workers.append(worker)
    return worker


async def run(b: Bench, queue: str, agents: int, steps: int, workspaces: list[Path] | None) -> float:
    """Seconds for `agents` runs of `steps` steps started together, to their last result;
    agent i in `workspaces[i]`, or each in a new folder."""
    client = await connect(b.server.address)
    started = time.perf_counter()
    handles = [
        await start_agent(
            client,
            bench_input(f"pair {i}", workspaces[i] if workspaces else b.workspace(), steps),
            f"pair-{uuid.uuid4().hex[:10]}",
            queue,
        )
        for i in range(agents)
    ]
    await asyncio.gather(*(h.result() for h in handles))
    return time.perf_counter() - started


async def measure(base: Path, agents: int, steps: int, rounds: int, latency_ms: float, same: bool) -> None:
    load = os.getloadavg()[0]
    with bench(StepScript(steps), latency_s=latency_ms / 1000) as b:
        workspaces = [b.workspace() for _ in range(agents)] if same else None
        checkouts = {"this": HERE, "base": base.resolve()}
        workers = {name: spawn(b, root, f"{b.task_queue}-{name}") for name, root in checkouts.items()}
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
        for r in range(rounds + 1):  # round 0 warms both workers up and counts for nothing
            for name in list(checkouts) if r % 2 else list(checkouts)[::-1]:
                cpu = _cpu_s(workers[name].pid)
                seconds = await run(b, f"{b.task_queue}-{name}", agents, steps, workspaces)
                per_step = agents * steps
                if r:
                    figures[name].append((1000 * seconds / steps, 1000 * (_cpu_s(workers[name].pid) - cpu) / per_step))
            if r:
                shown = ", ".join(
                    f"{n} {figures[n][-1][0]:.1f} ms/step, CPU {figures[n][-1][1]:.1f} ms" for n in figures
                )
                print(f"round {r}: {shown}", flush=True)
    for name, values in figures.items():
        wall, cpu = (statistics.median(v[i] for v in values) for i in (0, 1))
        print(f"{name} ({checkouts[name]}): {wall:.1f} ms per step, worker CPU {cpu:.1f} ms per step (medians)")
    for i, what in ((0, "ms per step"), (1, "worker CPU per step")):
        ratios = [t[i] / b_[i] for t, b_ in zip(figures["this"], figures["base"], strict=True)]
        print(f"this ÷ base, {what}: {statistics.median(ratios):.3f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"{rounds} rounds of {agents} agent(s) x {steps} steps, {latency_ms:g} ms model; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="another checkout of the project")
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the stub model's latency per call")
    parser.add_argument("--same-workspaces", action="store_true", help="agent i works in one folder in every run")
    options = parser.parse_args()
    if not (options.base / "worker.py").is_file():
        parser.error(f"--base {options.base}: not a checkout of the project (no worker.py)")
    same = options.same_workspaces
    asyncio.run(measure(options.base, options.agents, options.steps, options.rounds, options.latency_ms, same))
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
