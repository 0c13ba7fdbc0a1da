"""A new worker takes over, at once, the tool calls that a dead worker on this machine held.

The server learns that a worker died only from timeouts: a tool call the worker was running
is retried once its heartbeat is 5 s overdue (workflows/options.py). A replacement worker
on the same machine knows better and sooner. A worker's identity names its process (`pid@host`,
plus a tag for this boot and pid namespace, so that a pid is only ever judged where it means
something), and the dead worker's process is gone. At start, the worker looks at the running
agents on its task queue and fails the attempt of every tool call whose worker is such a dead
process, so that the server retries it now instead of after the timeout. The retry finds the
dead attempt in the tool journal: a command is not run twice, its leftover process group is
killed, and the model is told (activities/tools.py).

Only "gone" is acted on: a pid that was reused by another process reads as alive, and then
the timeout takes over as before. Everything here is best effort and never stops a worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowExecution
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.host import machine_tag, process_gone
from workflows.options import HEARTBEAT_TIMEOUT

log = logging.getLogger(__name__)

TIMEOUT_MARGIN = timedelta(seconds=1)
"""Left to the heartbeat timeout (the shortest, a tool call's): an attempt it ends this soon."""

WORKER_GONE = "WorkerGone"
"""The error type of an attempt failed here: retryable, so the server retries the call."""


@dataclass(frozen=True)
class Holder:
    """The process a worker identity names."""

    pid: int
    host: str
    tag: str


def worker_identity() -> str:
    """`pid@host`, as the SDK's default, with the machine tag where there is one."""
    base = f"{os.getpid()}@{socket.gethostname()}"
    tag = machine_tag()
    return f"{base}#{tag}" if tag else base


def parse_identity(identity: str) -> Holder | None:
    address, _, tag = identity.rpartition("#")
    pid, at, host = address.partition("@")
    if not (tag and at and pid.isdigit()):
        return None
    return Holder(int(pid), host, tag)


def held_by_dead_neighbour(identity: str, me: Holder) -> bool:
    """Whether `identity` is another process of this machine (same boot, same pid namespace)
    that no longer runs."""
    holder = parse_identity(identity)
    if holder is None or (holder.host, holder.tag) != (me.host, me.tag) or holder.pid == me.pid:
        return False
    return process_gone(holder.pid)


def abandoned(activity: PendingActivityInfo, me: Holder, now: datetime) -> bool:
    """An attempt in progress whose worker is gone, and whose heartbeat timeout is not due
    within TIMEOUT_MARGIN of `now`.

    Failing an activity by its id fails whichever attempt is current when the request
    arrives. Should the heartbeat timeout start a new attempt on a live worker in the
    moment since the description was read, that attempt is failed instead: its retry goes
    through the call's journal like any other (activities/journal.py), so the race costs an
    attempt of the call's few (a read tool has 3) and at worst an "interrupted" answer, never
    a second run. An attempt so close to its timeout is left to the timeout."""
    return (
        activity.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        and held_by_dead_neighbour(activity.last_worker_identity, me)
        and now - last_sign_of_life(activity) < HEARTBEAT_TIMEOUT - TIMEOUT_MARGIN
    )


def last_sign_of_life(activity: PendingActivityInfo) -> datetime:
    """The attempt's last heartbeat, or its start before it has one (the server's clock)."""
    times = [activity.last_started_time, activity.last_heartbeat_time]
    return max(t.ToDatetime(tzinfo=UTC) for t in times)


async def take_over(client: Client, task_queue: str, identity: str) -> int:
    """Fail every abandoned tool-call attempt of the running agents on `task_queue`, so that
    the server retries them now; returns how many. A failed request is logged, not raised:
    the heartbeat timeouts still apply."""
    me = parse_identity(identity)
    if me is None:
        return 0
    try:
        query = f'TaskQueue="{task_queue}" AND ExecutionStatus="Running"'
        runs = [run async for run in client.list_workflows(query)]
        taken = await asyncio.gather(*(_take_over_run(client, run, me) for run in runs))
    except RPCError as e:
        log.warning("could not look for calls held by dead workers: %s", e)
        return 0
    return sum(taken)


async def _take_over_run(client: Client, run: WorkflowExecution, me: Holder) -> int:
    handle = client.get_workflow_handle(run.id, run_id=run.run_id)
    try:
        description = await handle.describe()
    except RPCError:
        return 0  # closed since it was listed, or the server is busy: the timeout still applies
    taken, now = 0, datetime.now(UTC)
    for activity in description.raw_description.pending_activities:
        if not abandoned(activity, me, now):
            continue
        message = (
            f"the worker running this call ({activity.last_worker_identity}) is gone; "
            f"worker {me.pid}@{me.host} retried the call without waiting for its heartbeat timeout"
        )
        try:
            await client.get_async_activity_handle(
                workflow_id=run.id, run_id=run.run_id, activity_id=activity.activity_id
            ).fail(ApplicationError(message, type=WORKER_GONE))
        except RPCError as e:  # finished or timed out meanwhile: nothing left to take over
            log.info("call %s of %s was not taken over: %s", activity.activity_id, run.id, e)
            continue
        log.info("took over call %s of %s from %s", activity.activity_id, run.id, activity.last_worker_identity)
        taken += 1
    return taken
