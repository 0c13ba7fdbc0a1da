"""Many agents against a slow model: durable-agent beside a plain Temporal loop, in one run.

`python -m bench fleet [--agents 200] [--steps 4 [M ...]] [--latency-ms 3000] [--rounds 1]
[--in-order] [--fresh-shell] [--task-slots N ...]`: the
benchmark agent (bench/harness.py: per step one model call, `write_file`, `run_command`)
run by `--agents` agents at once, `--steps` steps each, against the stub model answering
every call in `--latency-ms`. Two contenders on one dev server, each with one worker
process of the same options (bench/plain_temporal.py), in rotating order per round:

- durable-agent, started with `start_agent`;
- a plain Temporal loop whose model call is a regular activity, started with the
  client's defaults;
- the same plain loop calling durable-agent's own `write_file` and `run_command`
  activities (journal, sandbox, cgroup, run files) instead of a plain `bash -c` and file
  write: beside the two above, it tells what the orchestration costs from what the tools'
  safety costs.

The plain loops run a reply's two tool calls at once; durable-agent runs them one after the
other (a command may use the file a write of the same reply made). `--in-order` adds a fourth
contender, the bare plain loop running them in order too: the same work in the same order,
so that its ratio tells what durable-agent costs from what running the calls at once saves.
`--fresh-shell` adds durable-agent with `shell: fresh` on the same worker: a sandbox per
command instead of one per run, so that its ratios tell what a run's sandbox costs or saves at
this many steps (`ratio_*_fresh_shell_to_persistent`: fresh ÷ the default) and where a
sandbox per command leaves the issue's ratios (`ratio_*_fresh_shell_to_bare`).

With `--hosts N` (1 or 2), a fourth: durable-agent with its runs pinned in turn to N host
workers (bench/hosts.py: `DURABLE_AGENT_HOST`, each in a mount namespace where the other's
workspaces are hidden; root), on a task queue of their own; its CPU is all its workers'. Its
ratio is against the one durable-agent worker without a host; with `--hosts 2`, also against
a fifth contender, two durable-agent workers without a host (what two processes cost on their own).

Per contender: run time of each run (from its start returning to its result), CPU of the
worker process (with its children: commands, sandboxes; also their share apart) and the
server per model call, model calls
beyond one per step, and from every run's history the workflow-task timeouts
(start-to-close: a task a worker held too long; schedule-to-start: a sticky task that
waited over 1 s and went to the shared queue) and, for durable-agent, history bytes per
step; and the TCP connections the stub model accepted (a worker that keeps its
connections between calls opens one per agent it serves at once). Ratios are
durable-agent ÷ plain loop, per round.

With `--steps N M ...` (two or more step counts), each round measures every contender at each
count, and the CPU of a run (worker, its children, server) is fitted per contender as a cost
per run plus a cost per step (least squares over the counts and rounds): which of the two
makes a contender dearer than another. A run of N steps makes N + 1 model calls (the last
answers), so the cost per run holds that last call's, for every contender alike.

With `--task-slots N ...`, durable-agent alone instead, once per workflow-task slot count
(`DURABLE_AGENT_MAX_CONCURRENT_WORKFLOW_TASKS`), each its own worker and task queue: the
measurement behind the worker's default of 20 (docs/fleet.md, "Worker sizing").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client, WorkflowHandle

from bench.contenders import _children_cpu_s, _cpu_s, history_bytes
from bench.harness import Bench, StepScript, bench, bench_input
from bench.hosts import HOSTS, host_folders, spawn_hosts
from bench.plain_temporal import PLAIN_WORKFLOW, PlainCall, spawn_plain_worker
from bench.report import git_commit, output_file
from bench.run_costs import FIT_TERMS, RUN_CPU_PARTS, fit_per_run_and_per_step
from bench.task import goal_for
from durable_agent.connection import connect
from durable_agent.runs import start_agent

DURABLE = "durable-agent"
PLAIN = "plain Temporal loop"
PLAIN_PRODUCT_TOOLS = "plain Temporal loop with durable-agent's tools"
PLAIN_IN_ORDER = "plain Temporal loop, a reply's tool calls in order"
DURABLE_FRESH_SHELL = "durable-agent, shell: fresh"
ON_HOSTS = "durable-agent on hosts"
SAME_WORKERS = "durable-agent, as many workers without a host"


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Contender:
    name: str
    worker: subprocess.Popen[bytes]
    start: Any
    """async (client, index, steps) -> WorkflowHandle"""
    others: tuple[subprocess.Popen[bytes], ...] = ()
    """More worker processes of the contender: their CPU counts as its worker's."""


async def timed_run(client: Client, contender: Contender, index: int, steps: int) -> tuple[WorkflowHandle, float]:
    handle = await contender.start(client, index, steps)
    began = time.perf_counter()
    await handle.result()
    return handle, time.perf_counter() - began


async def task_timeouts(handles: list[WorkflowHandle]) -> dict[str, int]:
    counts = {"start_to_close": 0, "schedule_to_start": 0}
    for handle in handles:
        async for event in handle.fetch_history_events():
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                continue
            kind = event.workflow_task_timed_out_event_attributes.timeout_type
            counts["start_to_close" if kind == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE else "schedule_to_start"] += 1
    return counts


async def history_bytes_per_step(client: Client, handles: list[WorkflowHandle], steps: int) -> float:
    """Over the first 20 runs, each summed over its continue-as-new chain."""
    sizes = [(await history_bytes(client, h.id))[0] for h in handles[:20]]
    return round(statistics.mean(sizes) / steps)


async def measure(b: Bench, client: Client, contender: Contender, agents: int, steps: int) -> dict[str, Any]:
    b.model.requests.clear()
    connections_before = b.model.connections
    pids = (contender.worker.pid, b.server.process.pid)
    others = [w.pid for w in contender.others]
    cpu0 = {pid: _cpu_s(pid) for pid in (*pids, *others)}
    children0 = {pid: _children_cpu_s(pid) for pid in (pids[0], *others)}
    wall0 = time.perf_counter()
    runs = await asyncio.gather(*(timed_run(client, contender, i, steps) for i in range(agents)))
    wall = time.perf_counter() - wall0
    cpu_of = {pid: _cpu_s(pid) - before for pid, before in cpu0.items()}
    cpu = sum(cpu_of.values())
    worker_cpu = cpu_of[pids[0]] + sum(cpu_of[pid] for pid in others)
    children_cpu = sum(_children_cpu_s(pid) - before for pid, before in children0.items())
    calls = len(b.model.requests)
    durations = sorted(d for _, d in runs)
    handles = [h for h, _ in runs]
    figures: dict[str, Any] = {
        "wall_s": round(wall, 2),
        "run_time_s": {
            "min": round(durations[0], 2),
            "median": round(statistics.median(durations), 2),
            "max": round(durations[-1], 2),
        },
        "model_calls": calls,
        "model_calls_beyond_steps": calls - agents * (steps + 1),
        "model_connections_opened": b.model.connections - connections_before,
        "cpu_ms_per_model_call": round(1000 * cpu / calls, 1),
        "worker_cpu_ms_per_model_call": round(1000 * worker_cpu / calls, 1),
        "worker_children_cpu_ms_per_model_call": round(1000 * children_cpu / calls, 1),
        "server_cpu_ms_per_model_call": round(1000 * cpu_of[pids[1]] / calls, 1),
        "workflow_task_timeouts": await task_timeouts(handles),
    }
    if contender.name.startswith(DURABLE):  # on hosts too
        figures["history_bytes_per_step"] = await history_bytes_per_step(client, handles, steps)
    return figures


def on_hosts(b: Bench, count: int) -> Contender:
    """`count` host workers on a queue of their own; run i is pinned to host i % count."""
    queue = f"{b.task_queue}-hosts"
    hosts = HOSTS[:count]
    workers = spawn_hosts({**b.worker_env, "DURABLE_AGENT_TASK_QUEUE": queue}, b.home, hosts)
    folders = host_folders(b.home, hosts)

    async def start(client: Client, index: int, steps: int) -> WorkflowHandle:
        host = hosts[index % count]
        workspace = folders[host] / f"ws-{uuid.uuid4().hex[:8]}"
        workspace.mkdir()
        agent = bench_input(goal_for(index, steps), workspace, steps, host=host)
        return await start_agent(client, agent, f"fleet-hosts-{uuid.uuid4().hex[:10]}", queue)

    b.workers.extend(workers.values())  # stopped with the bench's own
    first, *rest = workers.values()
    return Contender(ON_HOSTS, first, start, others=tuple(rest))


def same_workers(b: Bench, count: int) -> Contender:
    """`count` workers without a host on a queue of their own: what the hosts' routing costs
    apart from running `count` worker processes."""
    queue = f"{b.task_queue}-workers"
    first, *rest = [b.start_worker(DURABLE_AGENT_TASK_QUEUE=queue) for _ in range(count)]
    return Contender(SAME_WORKERS, first, durable_start(b, queue), others=tuple(rest))


def durable_start(b: Bench, queue: str, **overrides: Any) -> Any:
    """Runs of the benchmark agent on `queue`; `overrides`: fields of its input (`shell`)."""

    async def durable(client: Client, index: int, steps: int) -> WorkflowHandle:
        agent = bench_input(goal_for(index, steps), b.workspace(), steps, **overrides)
        return await start_agent(client, agent, f"fleet-{uuid.uuid4().hex[:10]}", queue)

    return durable


def slot_contenders(b: Bench, slots: list[int]) -> list[Contender]:
    """durable-agent alone, one worker per workflow-task slot count, each on its own queue."""
    every = []
    for n in slots:
        queue = f"{b.task_queue}-slots-{n}"
        worker = b.start_worker(DURABLE_AGENT_TASK_QUEUE=queue, DURABLE_AGENT_MAX_CONCURRENT_WORKFLOW_TASKS=str(n))
        every.append(Contender(f"{DURABLE}, {n} workflow-task slots", worker, durable_start(b, queue)))
    return every


def contenders(b: Bench, in_order: bool = False, fresh_shell: bool = False) -> list[Contender]:
    """durable-agent, the bare plain loop and the loop with durable-agent's tools; `in_order`:
    also the bare loop running a reply's tool calls in order; `fresh_shell`: also durable-agent's
    runs with `shell: fresh`, on its worker."""
    plain_queue = f"{b.task_queue}-plain"

    def plain(product_tools: bool, tools_in_order: bool = False) -> Any:
        async def start(client: Client, index: int, steps: int) -> WorkflowHandle:
            call = PlainCall.start(goal_for(index, steps), str(b.workspace()), product_tools, tools_in_order)
            return await client.start_workflow(
                PLAIN_WORKFLOW, call, id=f"plain-{uuid.uuid4().hex[:10]}", task_queue=plain_queue
            )

        return start

    plain_worker = spawn_plain_worker(b, plain_queue)
    durable_worker = b.start_worker()
    every = [
        Contender(DURABLE, durable_worker, durable_start(b, b.task_queue)),
        Contender(PLAIN, plain_worker, plain(product_tools=False)),
        Contender(PLAIN_PRODUCT_TOOLS, plain_worker, plain(product_tools=True)),
    ]
    if in_order:
        every.append(Contender(PLAIN_IN_ORDER, plain_worker, plain(product_tools=False, tools_in_order=True)))
    if fresh_shell:
        every.append(Contender(DURABLE_FRESH_SHELL, durable_worker, durable_start(b, b.task_queue, shell="fresh")))
    return every


async def run(
    agents: int,
    steps: int,
    latency_ms: int,
    rounds: int,
    slots: list[int] | None = None,
    hosts: int = 0,
    in_order: bool = False,
    fresh_shell: bool = False,
) -> dict[str, Any]:
    load_before = os.getloadavg()
    with bench(StepScript(steps)) as b:
        client = await connect(b.server.address)
        every = slot_contenders(b, slots) if slots else contenders(b, in_order, fresh_shell) + host_contenders(b, hosts)
        results = {
            name: by_steps[steps]
            for name, by_steps in (await measure_rounds(b, client, every, agents, [steps], latency_ms, rounds)).items()
        }
    measured = {
        **what_was_run(agents, steps, latency_ms, load_before),
        "hosts": hosts,
        "results": results,
    }
    if slots:
        return measured
    durable = results[DURABLE]
    return {
        **measured,
        "ratio_run_time_median": ratios(durable, results[PLAIN], "run_time_s"),
        "ratio_cpu_per_model_call": ratios(durable, results[PLAIN], "cpu_ms_per_model_call"),
        "ratio_run_time_median_same_tools": ratios(durable, results[PLAIN_PRODUCT_TOOLS], "run_time_s"),
        "ratio_cpu_per_model_call_same_tools": ratios(durable, results[PLAIN_PRODUCT_TOOLS], "cpu_ms_per_model_call"),
        **(
            {
                "ratio_run_time_median_in_order": ratios(durable, results[PLAIN_IN_ORDER], "run_time_s"),
                "ratio_cpu_per_model_call_in_order": ratios(durable, results[PLAIN_IN_ORDER], "cpu_ms_per_model_call"),
            }
            if in_order
            else {}
        ),
        **(fresh_shell_ratios(results, durable) if fresh_shell else {}),
        **(
            {
                "ratio_run_time_median_hosts_to_1_worker": ratios(results[ON_HOSTS], durable, "run_time_s"),
                "ratio_cpu_per_model_call_hosts_to_1_worker": ratios(
                    results[ON_HOSTS], durable, "cpu_ms_per_model_call"
                ),
                **(
                    {
                        "ratio_run_time_median_hosts_to_same_workers": ratios(
                            results[ON_HOSTS], results[SAME_WORKERS], "run_time_s"
                        ),
                    }
                    if hosts > 1
                    else {}
                ),
            }
            if hosts
            else {}
        ),
    }


async def run_per_run_and_per_step(
    agents: int, step_counts: list[int], latency_ms: int, rounds: int, in_order: bool = False, fresh_shell: bool = False
) -> dict[str, Any]:
    """The contenders at each step count, and each one's run CPU fitted per run and per step."""
    load_before = os.getloadavg()
    with bench(StepScript(step_counts[0])) as b:
        client = await connect(b.server.address)
        results = await measure_rounds(
            b, client, contenders(b, in_order, fresh_shell), agents, step_counts, latency_ms, rounds
        )
    fits = {name: fit_per_run_and_per_step(agents, by_steps) for name, by_steps in results.items()}
    return {
        **what_was_run(agents, step_counts, latency_ms, load_before),
        "results": {name: {str(n): rows for n, rows in by_steps.items()} for name, by_steps in results.items()},
        "cpu_ms_fitted": fits,
        "ratio_cpu_ms_fitted": {
            other: {
                part: {term: _ratio(fits[DURABLE][part][term], fits[other][part][term]) for term in FIT_TERMS}
                for part in RUN_CPU_PARTS
            }
            for other in results
            if other != DURABLE
        },
    }


def what_was_run(
    agents: int, steps: int | list[int], latency_ms: int, load_before: tuple[float, ...]
) -> dict[str, Any]:
    """The figures' heading: the commit measured, the options, the load average before and after."""
    return {
        "commit": git_commit(),
        "agents": agents,
        "steps": steps,
        "latency_ms": latency_ms,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


async def measure_rounds(
    b: Bench, client: Client, every: list[Contender], agents: int, step_counts: list[int], latency_ms: int, rounds: int
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Each round: every step count, every contender at it in rotating order (after a warm-up
    whose worker start-up and first-run costs are in no figure)."""
    script: StepScript = b.model.responder
    script.steps = step_counts[0]
    for c in every:
        await asyncio.gather(*(timed_run(client, c, i, step_counts[0]) for i in range(2)))
    b.model.latency_s = latency_ms / 1000
    results: dict[str, dict[int, list[dict[str, Any]]]] = {c.name: {n: [] for n in step_counts} for c in every}
    for r in range(rounds):
        order = every[r % len(every) :] + every[: r % len(every)]
        for steps in step_counts:
            script.steps = steps
            for c in order:
                log(f"round {r + 1}: {c.name}, {agents} agents x {steps} steps at {latency_ms} ms")
                figures = await measure(b, client, c, agents, steps)
                log(json.dumps(figures))
                results[c.name][steps].append(figures)
    return results


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b > 0 else None


def fresh_shell_ratios(
    results: dict[str, list[dict[str, Any]]], durable: list[dict[str, Any]]
) -> dict[str, list[float]]:
    """durable-agent with `shell: fresh` ÷ the default (a run's sandbox), and ÷ the bare loop."""
    fresh = results[DURABLE_FRESH_SHELL]
    return {
        f"ratio_{key}_fresh_shell_to_{name}": ratios(fresh, other, figure)
        for name, other in (("persistent", durable), ("bare", results[PLAIN]))
        for key, figure in (("run_time_median", "run_time_s"), ("cpu_per_model_call", "cpu_ms_per_model_call"))
    }


def host_contenders(b: Bench, hosts: int) -> list[Contender]:
    """With hosts: the runs pinned to them, and with two or more, as many workers without a host."""
    if not hosts:
        return []
    return [on_hosts(b, hosts), *([same_workers(b, hosts)] if hosts > 1 else [])]


def ratios(durable: list[dict[str, Any]], other: list[dict[str, Any]], figure: str) -> list[float]:
    """durable-agent ÷ `other` per round; run time by the median run."""

    def value(figures: dict[str, Any]) -> float:
        return figures[figure]["median"] if figure == "run_time_s" else figures[figure]

    return [round(value(d) / value(o), 2) for d, o in zip(durable, other, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[4], help="two or more: CPU fitted per run and per step"
    )
    parser.add_argument("--latency-ms", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=output_file, help="also write the JSON here")
    parser.add_argument(
        "--in-order", action="store_true", help="also the bare loop running a reply's tool calls in order"
    )
    parser.add_argument(
        "--fresh-shell", action="store_true", help="also durable-agent with shell: fresh (a sandbox per command)"
    )
    parser.add_argument("--task-slots", type=int, nargs="+", help="durable-agent alone, once per slot count")
    parser.add_argument(
        "--hosts", type=int, choices=(1, 2), default=0, help="also durable-agent on N host workers (root)"
    )
    args = parser.parse_args()
    if min(args.steps) < 1:
        parser.error("--steps counts are 1 or more")
    if len(set(args.steps)) > 1:
        if args.task_slots or args.hosts:
            parser.error("several --steps counts measure durable-agent and the plain loops: no --task-slots or --hosts")
        figures = asyncio.run(
            run_per_run_and_per_step(
                args.agents, sorted(set(args.steps)), args.latency_ms, args.rounds, args.in_order, args.fresh_shell
            )
        )
    else:
        if (args.in_order or args.fresh_shell) and args.task_slots:
            parser.error("--task-slots measures durable-agent alone: no --in-order or --fresh-shell")
        figures = asyncio.run(
            run(
                args.agents,
                args.steps[0],
                args.latency_ms,
                args.rounds,
                args.task_slots,
                args.hosts,
                args.in_order,
                args.fresh_shell,
            )
        )
    text = json.dumps(figures, indent=2)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n")
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
