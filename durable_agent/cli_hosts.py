"""`durable-agent hosts` and `durable-agent move ID --to-host Y` (workflows/hosts.py).

`hosts` names the hosts that runs are pinned to (their `AgentHost` search attribute), this
machine's own (`DURABLE_AGENT_HOST`) and any given, and asks the server who polls each
host's queue (DescribeTaskQueue): its workers and when each last polled, and its running
runs, marking those that wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from datetime import UTC, datetime

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from activities.snapshots import STORE_ENV
from durable_agent.connection import task_queue
from durable_agent.console import Console
from durable_agent.launch import connect_client
from durable_agent.render import table
from durable_agent.worker_settings import configured_host
from workflows.hosts import AGENT_HOST, MOVE_UPDATE, host_queue
from workflows.types import HOST_NAME, WORKFLOW_TYPE, AgentStatus

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
RUNS_READ = 1_000
"""The newest runs pinned to a host that `hosts` reads (the running ones are asked for their status)."""


def host_name(text: str) -> str:
    """An argparse type: a host name, as `DURABLE_AGENT_HOST` takes it (it also goes into a query)."""
    if re.fullmatch(HOST_NAME, text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name (letters, digits, '.', '_', '-')")
    return text


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    about = "list the hosts runs are pinned to: who polls each, when last, and their runs"
    hosts = commands.add_parser("hosts", help=about, description=about)
    hosts.set_defaults(handler=list_hosts)
    hosts.add_argument(
        "names", nargs="*", type=host_name, metavar="HOST", help="hosts to show even if no run names them"
    )
    about = "move a run to another host: its last step snapshot is restored there and it goes on there"
    move = commands.add_parser("move", help=about, description=about)
    move.set_defaults(handler=move_run)
    move.add_argument("id", help="the run's workflow id")
    move.add_argument("--to-host", required=True, type=host_name, metavar="HOST", help="the host to go on at")


async def move_run(args: argparse.Namespace, console: Console) -> int:
    if not os.environ.get(STORE_ENV, "").strip():
        console.line(
            f"move: {STORE_ENV} is not set: the run's step snapshots are on its host's own disk, which "
            f"{args.to_host} cannot read; set it on every host's worker (and here) to a path on shared storage"
        )
        return EXIT_USAGE
    client = await connect_client()
    handle = client.get_workflow_handle(args.id)
    try:
        said = await handle.execute_update(MOVE_UPDATE, {"host": args.to_host}, result_type=str)
    except WorkflowUpdateFailedError as e:
        console.line(f"move: {args.id}: {e.cause.message if e.cause else e}")
        return EXIT_USAGE
    except RPCError as e:
        console.line(f"move: {args.id}: {e.message}")
        return EXIT_FAILED
    console.line(f"{args.id}: {said}")
    return EXIT_OK


async def list_hosts(args: argparse.Namespace, console: Console) -> int:
    client = await connect_client()
    queue = task_queue()
    runs = await _pinned_runs(client)
    names = sorted({*runs, *args.names, *([h] if (h := configured_host()) else [])})
    if not names:
        console.line(f"no hosts: no run is pinned to one, and DURABLE_AGENT_HOST is not set here (queue {queue})")
        return EXIT_OK
    rows: list[tuple[str, ...]] = [("HOST", "WORKERS", "LAST POLL", "RUNS", "WAITING FOR IT")]
    for name in names:
        pollers = await _pollers(client, host_queue(queue, name))
        last = max((seen for _, seen in pollers), default=None)
        shown = [run for run, _ in runs.get(name, [])]
        waiting = [run for run, status in runs.get(name, []) if status is not None and status.host_wait]
        rows.append(
            (
                name,
                ", ".join(identity for identity, _ in pollers) or "none polling",
                _ago(last) if last else "never (or over 5 min ago)",
                " ".join(shown) or "-",
                " ".join(waiting) or "-",
            )
        )
    console.lines(table(rows))
    return EXIT_OK


async def _pinned_runs(client: Client) -> dict[str, list[tuple[str, AgentStatus | None]]]:
    """Every host a recent run was pinned to, with its running runs and their live status
    (None: no worker answered)."""
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND AgentHost IS NOT NULL"
    found: list[tuple[str, str]] = []
    by_host: dict[str, list[tuple[str, AgentStatus | None]]] = {}
    async for run in client.list_workflows(query, limit=RUNS_READ):
        host = run.typed_search_attributes.get(AGENT_HOST)
        if host and run.status == WorkflowExecutionStatus.RUNNING:
            found.append((host, run.id))
        elif host:
            by_host.setdefault(host, [])
    statuses = await asyncio.gather(*(_status(client, run) for _, run in found))
    for (host, run), status in zip(found, statuses, strict=True):
        by_host.setdefault(status.host if status and status.host else host, []).append((run, status))
    return by_host


async def waiting_runs(client: Client) -> set[str]:
    """The ids of the running runs that wait for their host now (each asked for its status)."""
    by_host = await _pinned_runs(client)
    return {run for runs in by_host.values() for run, status in runs if status is not None and status.host_wait}


async def _status(client: Client, run_id: str) -> AgentStatus | None:
    try:
        handle = client.get_workflow_handle(run_id)
        return await asyncio.wait_for(handle.query("status", result_type=AgentStatus), 5)
    except (RPCError, WorkflowQueryFailedError, TimeoutError):
        return None


async def _pollers(client: Client, queue: str) -> list[tuple[str, datetime]]:
    """Who polled `queue` for activities, and when last (the server keeps ~5 minutes)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    answer = await client.workflow_service.describe_task_queue(request)
    return [(p.identity, p.last_access_time.ToDatetime(tzinfo=UTC)) for p in answer.pollers]


def _ago(when: datetime) -> str:
    seconds = max(0.0, (datetime.now(UTC) - when).total_seconds())
    return f"{when.isoformat(timespec='seconds')} ({seconds:.0f} s ago)"
