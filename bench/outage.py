"""Many runs waiting out a model endpoint outage: the probes it costs, and the runs' exact end.

`python -m bench outage [--runs 200] [--steps 3] [--workers 1] [--down-s 180]`: `--runs`
runs of the benchmark agent (bench/harness.py: per step a `write_file` and a `run_command`
appending the step to ledger.txt) on `--workers` worker processes, each given a base URL of
its own (`/w<i>/v1`) so the stub tells their requests apart. When the first run asks for its
second step the stub goes down (HTTP 503 to everything, counted with the time and path of
each request: durable_agent/model_server.py); the runs started after that find it down at
once. Once every run says `waiting for the model endpoint`, the stub stays down for
`--down-s` more seconds, then answers again. Figures:

- the probes (`GET /models`) each worker sent, per minute of the outage (the first minute
  holds the backoff's quick start: 1, 2, 4, 8, 16, 32 s apart; then one a minute);
- the calls that reached the endpoint while it was down (at most one per run: the call that
  found it down; after that the worker's gate fails calls without sending them);
- checks: every run completed; the stub answered exactly steps + 1 calls per run (none
  repeated); every ledger is exact (1..steps, each once).

It prints the figures as JSON and exits 1 when a check fails. tests/test_outages.py runs 20
runs through a 40 s outage (CI's 2 cores); this is the issue's 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections import Counter
from typing import Any

from temporalio.client import Client, WorkflowHandle

from bench.harness import StepScript, bench, bench_input
from bench.report import git_commit
from bench.task import agent_of, goal_for
from durable_agent.connection import connect
from durable_agent.runs import start_agent
from workflows.types import AgentResult, AgentStatus

WAITING = "waiting for the model endpoint"


async def all_waiting(handles: list[WorkflowHandle], within_s: float) -> None:
    """Until every run says it waits for the endpoint (a query may fail under load: asked again)."""
    deadline = time.monotonic() + within_s
    pending = list(handles)
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench outage: {len(pending)} runs not waiting after {within_s:g} s")
        statuses = await asyncio.gather(
            *(h.query("status", result_type=AgentStatus) for h in pending), return_exceptions=True
        )
        pending = [h for h, s in zip(pending, statuses, strict=True) if not _waits(s)]
        await asyncio.sleep(2)


def _waits(status: AgentStatus | BaseException) -> bool:
    return isinstance(status, AgentStatus) and status.activity.startswith(WAITING)


def per_minute(log: list[tuple[float, str, str]], method: str, since: float, until: float) -> dict[str, list[int]]:
    """`method` requests the stub refused, by worker (its path's `/w<i>/` prefix), per minute since `since`."""
    minutes = max(1, int((until - since) // 60) + (1 if (until - since) % 60 else 0))
    counts: dict[str, list[int]] = {}
    for at, command, path in log:
        if command == method and since <= at < until:
            worker = path.strip("/").split("/")[0]
            counts.setdefault(worker, [0] * minutes)[min(int((at - since) // 60), minutes - 1)] += 1
    return counts


async def run(runs: int, steps: int, workers: int, down_s: float) -> dict[str, Any]:
    load_before = os.getloadavg()
    script = StepScript(steps)
    with bench(script) as b:
        root = b.model.base_url.removesuffix("/v1")
        for i in range(workers):
            b.start_worker(OPENAI_BASE_URL=f"{root}/w{i}/v1")
        script.hooks[1] = lambda: setattr(b.model, "down", True)  # mid-run, as the first run asks for step 2
        client: Client = await connect(b.server.address)
        handles: list[WorkflowHandle] = []
        workspaces = []
        for n in range(runs):
            workspaces.append(b.workspace())
            agent = bench_input(goal_for(n, steps), workspaces[-1], steps)
            handles.append(await start_agent(client, agent, f"outage-{uuid.uuid4().hex[:10]}", b.task_queue))
        await all_waiting(handles, within_s=600)
        waiting_at = time.monotonic()
        await asyncio.sleep(down_s)
        up_at = time.monotonic()
        b.model.down = False
        results: list[AgentResult] = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 1800)
        all_done_s = time.monotonic() - up_at
        log = list(b.model.refused_log)
        down_at = min((at for at, _, _ in log), default=waiting_at)
        answered = Counter(agent_of(r) for r in b.model.requests)
        expected = [str(i) for i in range(1, steps + 1)]
        ledgers_wrong = [str(ws) for ws in workspaces if (ws / "ledger.txt").read_text().split() != expected]
    probes = per_minute(log, "GET", down_at, up_at)
    calls_while_down = sum(1 for _, command, _ in log if command == "POST")
    later_minutes = [n for counts in probes.values() for n in counts[1:-1]]  # whole minutes after the first
    checks = {
        "all_completed": all(r.state == "completed" for r in results),
        "answered_steps_plus_one_per_run": set(answered.values()) == {steps + 1} and len(answered) == runs,
        "ledgers_exact": not ledgers_wrong,
        "calls_while_down_at_most_one_per_run": calls_while_down <= runs,
        "probes_a_few_a_minute_per_worker": bool(later_minutes) and max(later_minutes) <= 2,
    }
    return {
        "commit": git_commit(),
        "runs": runs,
        "steps": steps,
        "workers": workers,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "outage_s": round(up_at - down_at, 1),
        "all_waiting_for_s": round(up_at - waiting_at, 1),
        "probes_per_minute_by_worker": probes,
        "calls_that_reached_the_down_endpoint": calls_while_down,
        "answered_calls_per_run": dict(Counter(answered.values())),
        "all_completed_s_after_it_was_back": round(all_done_s, 1),
        "ledgers_wrong": ledgers_wrong[:10],
        "checks": checks,
        "passed": all(checks.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--down-s", type=float, default=180.0, help="how long the outage lasts once all runs wait")
    args = parser.parse_args()
    figures = asyncio.run(run(args.runs, args.steps, args.workers, args.down_s))
    print(json.dumps(figures, indent=2), flush=True)
    os._exit(0 if figures["passed"] else 1)  # skip interpreter teardown (sdk-python#300)


if __name__ == "__main__":
    main()
