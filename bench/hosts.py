"""Runs pinned to two hosts (workflows/hosts.py), each host a worker in a mount namespace of its own.

`python -m bench hosts [--runs 10] [--steps 4] [--latency-ms 0]`: two workers on one task
queue stand for two machines, `DURABLE_AGENT_HOST=alpha` and `beta`, each with the other's
workspace folder hidden under a tmpfs (`unshare -m`, as root). `--runs` runs per host of the
benchmark agent (bench/harness.py: per step a `write_file` and a `run_command` appending the
step to ledger.txt). A call that ran on the wrong host would write into its empty tmpfs:

- every ledger is exact (1..steps, in the real folder of the run's host);
- every activity but the model call (and the host probe and tool catalog, which read no
  workspace) ran on its run's host: on its queue, started by that host's worker, or locally in
  a workflow task that worker completed (its identity in history);
- model calls are exactly one per step plus the final answer.

It prints the checks, where the workspace calls ran (locally or through the host's queue) and
the run times as JSON, and exits 1 when a check fails. tests/test_hosts.py
runs 2 x 3 of the same (CI's 2 cores); this is the issue's 2 x 10.
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
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench.harness import StepScript, bench, bench_input
from bench.report import git_commit
from bench.task import goal_for
from durable_agent.connection import connect
from durable_agent.processes import WORKER_SCRIPT, stop_gently
from durable_agent.runs import start_agent
from workflows.hosts import ELSEWHERE, host_of_local_activity, host_queue

HOSTS = ("alpha", "beta")


def spawn_host_worker(env: dict[str, str], host: str, hidden: list[Path], log_path: Path) -> subprocess.Popen[bytes]:
    """`python worker.py` with `DURABLE_AGENT_HOST=host`, in a mount namespace where each of
    `hidden` is an empty tmpfs. unshare and sh exec the worker: it keeps the returned pid."""
    mounts = " && ".join(f'mount -t tmpfs tmpfs "{path}"' for path in hidden) or "true"
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" "$1"', sys.executable, str(WORKER_SCRIPT)],
            env={**os.environ, **env, "DURABLE_AGENT_HOST": host},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def host_folders(home: Path, hosts: tuple[str, ...] = HOSTS) -> dict[str, Path]:
    folders = {host: home / "hosts" / host for host in hosts}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def spawn_hosts(env: dict[str, str], home: Path, hosts: tuple[str, ...] = HOSTS) -> dict[str, subprocess.Popen[bytes]]:
    folders = host_folders(home, hosts)
    return {
        host: spawn_host_worker(env, host, [f for h, f in folders.items() if h != host], home / f"host-{host}.log")
        for host in hosts
    }


LOCAL = "local"
"""The queue `activity_places` gives a local try on the run's host that ran (in the run's workflow task)."""
ANYWHERE = "local, any worker"
"""... and a local activity that reads no workspace (the host probe, the tool catalog)."""
WORKSPACE_FREE = ("host_pollers", "tool_catalog")


async def activity_places(handle: WorkflowHandle) -> list[tuple[str, str, int, bytes]]:
    """(type, task queue or LOCAL, pid of the worker that ran it, summary) of every activity of
    the run that ran. A local activity ran in the workflow task before its marker, on the worker
    that completed that task; one refused by a worker not its host (hosts.ELSEWHERE) never ran."""
    scheduled: dict[int, tuple[str, str]] = {}
    ran: list[tuple[str, str, int, bytes]] = []
    task_by = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = (attributes.activity_type.name, attributes.task_queue.name)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attributes = event.activity_task_started_event_attributes
            name, queue = scheduled[attributes.scheduled_event_id]
            ran.append((name, queue, _pid(attributes.identity), b""))
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            task_by = _pid(event.workflow_task_completed_event_attributes.identity)
        elif event.marker_recorded_event_attributes.marker_name == "core_local_activity":
            marker = event.marker_recorded_event_attributes
            failure = marker.failure
            if ELSEWHERE in (failure.application_failure_info.type, failure.cause.application_failure_info.type):
                continue
            data = json.loads(marker.details["data"].payloads[0].data)
            where = LOCAL if host_of_local_activity(data["activity_id"]) else ANYWHERE
            ran.append((data["activity_type"], where, task_by, event.user_metadata.summary.data))
    return ran


def _pid(identity: str) -> int:
    return int(identity.split("@")[0])


async def misplaced_activities(handle: WorkflowHandle, queue: str, host: str, pid: int) -> list[str]:
    """The run's activities that ran anywhere but where they belong: its host (on its queue or
    locally), the model call on the shared queue, what reads no workspace anywhere."""
    wrong: list[str] = []
    for name, on, by, _ in await activity_places(handle):
        if name == "call_model" and on != queue:
            wrong.append(f"{name} on {on}")
        elif on == ANYWHERE and name not in WORKSPACE_FREE:
            wrong.append(f"{name} locally on any worker")
        elif name != "call_model" and on != ANYWHERE and (on not in (LOCAL, host_queue(queue, host)) or by != pid):
            wrong.append(f"{name} on {on} by pid {by}")
    return wrong


async def run(runs: int, steps: int, latency_ms: int) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("bench hosts: mount namespaces need root (unshare -m)")
    load_before = os.getloadavg()
    script = StepScript(steps)
    with bench(script, latency_s=latency_ms / 1000) as b:
        client: Client = await connect(b.server.address)
        workers = spawn_hosts(b.worker_env, b.home)
        folders = host_folders(b.home)
        try:
            started: list[tuple[str, Path, WorkflowHandle]] = []
            began = time.perf_counter()
            for n in range(runs):
                for host in HOSTS:
                    workspace = folders[host] / f"ws-{n}"
                    workspace.mkdir()
                    agent = bench_input(goal_for(len(started), steps), workspace, steps, host=host)
                    handle = await start_agent(client, agent, f"hosts-{uuid.uuid4().hex[:10]}", b.task_queue)
                    started.append((host, workspace, handle))

            async def timed(handle: WorkflowHandle) -> float:
                result = await handle.result()
                assert result.state == "completed", result
                return time.perf_counter() - began

            times = sorted(await asyncio.wait_for(asyncio.gather(*(timed(h) for _, _, h in started)), 600))
            wall = time.perf_counter() - began
            expected = [str(i) for i in range(1, steps + 1)]
            ledgers_wrong = [str(ws) for _, ws, _ in started if (ws / "ledger.txt").read_text().split() != expected]
            misplaced = [
                wrong
                for host, _, handle in started
                for wrong in await misplaced_activities(handle, b.task_queue, host, workers[host].pid)
            ]
            calls = Counter(count for count in Counter(_goal(r) for r in b.model.requests).values())
            places: Counter[str] = Counter()
            for _, _, handle in started:
                for name, on, _, _ in await activity_places(handle):
                    if name not in ("call_model", *WORKSPACE_FREE):
                        places["local" if on == LOCAL else "host queue"] += 1
        finally:
            for worker in workers.values():
                stop_gently(worker)
    checks = {
        "ledgers_exact": not ledgers_wrong,
        "every_activity_on_its_host": not misplaced,
        "model_calls_one_per_step_and_answer": dict(calls) == {steps + 1: len(started)},
    }
    return {
        "commit": git_commit(),
        "runs": f"{runs} per host x {len(HOSTS)} hosts",
        "steps": steps,
        "latency_ms": latency_ms,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "checks": checks,
        "ledgers_wrong": ledgers_wrong[:10],
        "misplaced_activities": misplaced[:10],
        "model_calls_per_run": {str(k): v for k, v in calls.items()},
        "workspace_calls": dict(places),
        "wall_s": round(wall, 2),
        "run_time_s": {"median": round(statistics.median(times), 2), "max": round(times[-1], 2)},
        "passed": all(checks.values()),
    }


def _goal(request: dict[str, Any]) -> str:
    return next((m.get("content") or "" for m in request.get("messages", []) if m.get("role") == "user"), "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs per host (default 10)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--latency-ms", type=int, default=0)
    args = parser.parse_args()
    figures = asyncio.run(run(args.runs, args.steps, args.latency_ms))
    print(json.dumps(figures, indent=2), flush=True)
    os._exit(0 if figures["passed"] else 1)  # skip interpreter teardown (sdk-python#300)


if __name__ == "__main__":
    main()
