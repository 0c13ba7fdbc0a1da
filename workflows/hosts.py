"""Runs pinned to a host: their workspace-bound activities on that host's own task queue.

A worker started with `DURABLE_AGENT_HOST=<name>` also polls `<task queue>@<name>` for the
activities that touch a workspace (durable_agent/plugin.py). A run whose input names a
`host` sends every such activity there: the file tools, `run_command`, the skills, the
workspace check, the agent file, the archive and `recall`, the step snapshots and the
cleanup. What reads no workspace (the model call, compaction's summary, the tool catalog,
the workflow itself) stays on the shared queue, served by any worker. A run without a host
calls them as before (local activities in the run's own workflow task, on any worker):
today's shared-storage mode, its commands unchanged.

A host that is gone: its calls wait in its queue. Each is scheduled with a
schedule-to-start timeout (`HOST_FIRST_PROBE`, then `HOST_PROBE`), which Temporal never
retries: when it fires no worker of the host took the call, the run says "waiting for host
X since T" (state still `running`, nothing repeated: the call was never started) and
schedules it again. A host no worker has ever polled (a typo) shows at once: the run's first
call on the host's queue is preceded by one `host_pollers` local activity (DescribeTaskQueue), and an empty
answer starts the wait, "(no worker has polled host X)", without waiting for the first probe.
A call is taken the moment the host's worker polls again, whatever the probe. Past
`limits.host_wait_s` the run needs attention (wait longer, terminate, or move).

Where the run's workflow task runs on its host's own worker, its calls need no round trip: a
call that a run without a host makes as a local activity (the file tools, the snapshots, the
start-up reads, the cleanup) is first tried as a local activity whose id names the host
(`local_activity_id`). Only that host's worker runs it (activities/host_check.py); any other
worker refuses it at once (`ELSEWHERE`, recorded, never run), and the run makes the call on the
host's queue as above, asking the host's worker to release the run's stickiness
(`UNSTICK_SUFFIX`): the run's next workflow task goes to any worker, the host's own included,
which then keeps it (sticky) for as long as it answers. A host that is gone loses its runs'
workflow tasks to the other workers after the sticky timeout, and its calls wait as above.

Moving (`durable-agent move ID --to-host Y`, the `move_host` update): before its next call
on a host, the run restores its last step snapshot into the workspace on Y
(`restore_snapshot`, on Y's queue; the snapshot store must be shared:
`DURABLE_AGENT_SNAPSHOT_STORE`), then goes on there.

Pure and deterministic: a part of `AgentWorkflow` (workflows/agent.py).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled, timed_out
    from workflows.snapshots import SNAPSHOT_TIMEOUT
    from workflows.types import HOST_NAME, Resolution

HOST_SEPARATOR = "@"
HOST_FIRST_PROBE = timedelta(seconds=10)
"""How long a call waits in its host's queue before the run says it waits for the host: a
host that is gone, or a name no worker has (a typo), shows in `status` within this. A live but
loaded host starts a call within ~4 s at worst (`python -m bench fleet`, 200 agents on one
2-core worker); a probe that fires anyway costs one reschedule, never a repeated call."""
HOST_POLLERS_TIMEOUT = timedelta(seconds=5)
"""One DescribeTaskQueue; best effort (the first probe tells anyway), so one attempt."""
HOST_PROBE = timedelta(seconds=60)
"""The probes after the first: a call is taken as soon as the host polls again whatever this
is, so it only sets how many timeouts a long wait writes to history (three events each)."""
ELSEWHERE = "NotThisHost"
"""The error type of a local activity refused by a worker that is not the run's host."""
UNSTICK_SUFFIX = "+unstick"
"""Ends the id of a call on a host's queue made after a refused local activity: the host's
worker resets the run's stickiness before running it (activities/host_check.py)."""
HOST_CALL_ID = "host"
"""The attention report's `call_id` when the host's wait is over."""
RESTORE_ACTIVITY = "restore_snapshot"
MOVE_UPDATE = "move_host"
AGENT_HOST = SearchAttributeKey.for_keyword("AgentHost")
"""The run's host, for `durable-agent hosts` and `list --host`; written only by runs that have one."""


class HostMove(BaseModel):
    """Payload of `move_host`: the host the run goes on at."""

    host: str = Field(pattern=HOST_NAME)


class HostPollers(BaseModel):
    """Output of `host_pollers`: whether the server lists any poller of the host's queue."""

    polled: bool


class RestoreRequest(BaseModel):
    """Input of `restore_snapshot`: make `workspace` (on the host that runs it) hold exactly the
    snapshot's files; the names matching `exclude` are left as the host has them."""

    workspace: str
    digest: str
    exclude: list[str] = Field(default_factory=list)
    """`AgentInput.snapshot_exclude`: what the run's snapshots leave out."""


class RestoreDone(BaseModel):
    files: int


def host_queue(queue: str, host: str) -> str:
    """The task queue of `host`'s workspace-bound activities."""
    return f"{queue}{HOST_SEPARATOR}{host}"


def workspace_queue(host: str | None) -> str | None:
    """Where the run's workspace-bound activities go: its host's queue, or None (any worker of
    the run's own queue). One helper for every such activity, MCP stdio servers included."""
    return None if host is None else host_queue(workflow.info().task_queue, host)


def local_activity_id(n: int, host: str) -> str:
    """The id of a run's `n`-th local try on `host`: only a worker of that host runs it."""
    return f"{n}{HOST_SEPARATOR}{host}"


def host_of_local_activity(activity_id: str) -> str | None:
    """The host a local activity's id names (`local_activity_id`); None: any worker runs it."""
    n, separator, host = activity_id.partition(HOST_SEPARATOR)
    return host if separator and n.isdigit() and re.fullmatch(HOST_NAME, host) else None


def refused_elsewhere(error: BaseException) -> bool:
    """A local try refused by a worker that is not the run's host (it never ran). A local
    activity's error surfaces as itself or wrapped (workflows/failures.py)."""
    cause = error.__cause__ if isinstance(error, ActivityError) else error
    return isinstance(cause, ApplicationError) and cause.type == ELSEWHERE


def is_host_queue(queue: str) -> bool:
    return HOST_SEPARATOR in queue and re.fullmatch(HOST_NAME, queue.rpartition(HOST_SEPARATOR)[2]) is not None


class HostSteps:
    """Calls on the run's host, its waits, and moves. `AgentWorkflow` provides `_agent`,
    `_carry`, `_limits`, `_needs_attention`, `_publish`, `_attention` and `_resolutions`."""

    _host_since: datetime | None = None
    """Since when the run's calls wait for its host; None while the host takes them."""
    _host_unseen = False
    """The host's queue had no poller at all when the run first called there (a typo?)."""
    _host_probed = False
    _here_tries = 0
    """Calls on the host so far in this run (local tries and calls on its queue): each id is unique."""
    _host_elsewhere = False
    """The last local try was refused: the run's workflow task ran on another worker."""
    _move_to: str | None = None
    _moves: list[str] = []

    def _publish_host(self) -> None:
        if self._input is not None and self._agent.host is not None:
            workflow.upsert_search_attributes([AGENT_HOST.value_set(self._agent.host)])

    def _host_wait_text(self) -> str | None:
        if self._host_since is None or self._agent.host is None:
            return None
        host = self._agent.host
        text = f"waiting for host {host} since {self._host_since.isoformat(timespec='seconds')}"
        return f"{text} (no worker has polled host {host})" if self._host_unseen else text

    async def _on_host_or_local(
        self,
        name: str,
        arg: Any,
        *,
        result_type: type | None,
        start_to_close_timeout: timedelta,
        retry_policy: RetryPolicy,
        local_retry_threshold: timedelta,
        summary: str,
        bound: bool = True,
    ) -> Any:
        """A workspace-bound local activity: on the run's host if it has one, else local as
        before (in the workflow task, on whichever worker runs it). Not `bound` this time: local."""
        if bound and self._agent.host is not None:
            return await self._here_or_on_host(name, arg, result_type, start_to_close_timeout, summary, retry_policy)
        return await short_local_activity(
            name, arg, result_type, start_to_close_timeout, retry_policy, summary, threshold=local_retry_threshold
        )

    async def _here_or_on_host(
        self,
        name: str,
        arg: Any,
        result_type: type | None,
        timeout: timedelta,
        summary: str,
        retry: RetryPolicy = options.TOOL_RETRY,
        **on_host: Any,
    ) -> Any:
        """A short workspace-bound call of a run with a host: a local activity when this workflow
        task runs on the host's worker, else on the host's queue (see the module docstring).
        `on_host`: `_on_host`'s options for the call on the queue."""
        if not self._patched(options.HOSTS_LOCAL_PATCH):
            return await self._on_host(name, arg, result_type, timeout, summary, retry, **on_host)
        await self._move_if_asked()
        self._here_tries += 1
        try:
            here = local_activity_id(self._here_tries, self._agent.host or "")
            result = await short_local_activity(name, arg, result_type, timeout, retry, summary, activity_id=here)
        except ACTIVITY_FAILED as e:
            if not refused_elsewhere(e):
                raise
            self._host_elsewhere = True
            return await self._on_host(name, arg, result_type, timeout, summary, retry, **on_host)
        self._host_elsewhere = False
        return result

    async def _on_host(
        self,
        name: str,
        arg: Any,
        result_type: type | None,
        timeout: timedelta,
        summary: str,
        retry: RetryPolicy = options.TOOL_RETRY,
        heartbeat: timedelta | None = None,
        cancellation: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
        patient: bool = True,
        base_queue: str | None = None,
    ) -> Any:
        """`name` on the run's host, waiting for the host as long as it takes (see the module
        docstring). Any failure but the host's absence is raised, as the activity's own; not
        `patient`: the host's absence too, after the first probe. `base_queue`: the queue whose
        host queue it goes to (a user tool's own); default the run's."""
        probe = HOST_FIRST_PROBE
        await self._probe_host_once()
        while True:
            await self._move_if_asked()
            scheduled = workflow.now()
            self._here_tries += 1
            call = workflow.start_activity(
                name,
                arg,
                result_type=result_type,
                task_queue=host_queue(base_queue or workflow.info().task_queue, self._agent.host or ""),
                schedule_to_start_timeout=probe,
                start_to_close_timeout=timeout,
                heartbeat_timeout=heartbeat,
                retry_policy=retry,
                cancellation_type=cancellation,
                summary=summary,
                activity_id=f"{self._here_tries}{UNSTICK_SUFFIX}" if self._host_elsewhere else None,
            )
            moved_off = not await self._done_or_moving(call)
            if moved_off:
                call.cancel()  # never started: the server cancels it at once
            try:
                result = await call
            except ACTIVITY_FAILED as e:
                if moved_off and is_cancelled_exception(e):
                    continue
                raise_if_cancelled(e)
                if not patient or not timed_out(e, "SCHEDULE_TO_START"):
                    raise
                await self._host_absent(scheduled)
                probe = self._next_probe()
                continue
            if self._host_since is not None:
                self._host_since, self._host_unseen = None, False
                self._publish()
            return result

    async def _probe_host_once(self) -> None:
        """Before the run's first call on its host's queue: a host whose queue no worker has polled
        starts the wait now (see the module docstring). A failed probe changes nothing."""
        if self._host_probed or not self._patched(options.HOSTS_PROBE_PATCH):
            return
        self._host_probed = True
        queue = workspace_queue(self._agent.host) or ""
        try:
            seen = await workflow.execute_local_activity(
                "host_pollers",
                queue,
                result_type=HostPollers,
                start_to_close_timeout=HOST_POLLERS_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=f"host_pollers: {queue}"[:120],
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return
        if not seen.polled and self._host_since is None:
            self._host_since, self._host_unseen = workflow.now(), True
            self._publish()

    async def _done_or_moving(self, call: workflow.ActivityHandle[Any]) -> bool:
        """Whether the call is done; False when a move asked for while the host is gone comes
        first (the call is then taken off the gone host's queue at once, not at its probe)."""
        await workflow.wait_condition(
            lambda: call.done() or (self._move_to is not None and self._host_since is not None)
        )
        return call.done()

    def _next_probe(self) -> timedelta:
        """`HOST_PROBE`, or less when the host's wait ends sooner (the report is then on time)."""
        if self._host_since is None:
            return HOST_FIRST_PROBE
        left = self._limits.host_wait_s - (workflow.now() - self._host_since).total_seconds()
        return max(timedelta(seconds=1), min(HOST_PROBE, timedelta(seconds=left)))

    async def _host_absent(self, scheduled: datetime) -> None:
        """A call was not taken: the run waits for its host, up to `limits.host_wait_s`; then a
        person decides (one report for every call that waits)."""
        if self._host_since is None:
            self._host_since = scheduled
            self._publish()
        waited = (workflow.now() - self._host_since).total_seconds()
        if waited < self._limits.host_wait_s or self._move_to is not None:
            return
        if HOST_CALL_ID in self._attention:
            await workflow.wait_condition(lambda: HOST_CALL_ID not in self._attention)
            return
        host = self._agent.host
        resolution: Resolution = await self._needs_attention(
            HOST_CALL_ID,
            what=f"host {host} took no call for {waited:.0f} s (limits.host_wait_s {self._limits.host_wait_s:g})",
            error=f"no worker with DURABLE_AGENT_HOST={host} polls {workspace_queue(host)}",
            attempts=1,
            actions=[
                f"retry: wait for host {host} another limits.host_wait_s",
                "terminate: finish the run now with a partial result",
                f"move: `durable-agent move {workflow.info().workflow_id} --to-host OTHER` restores the last "
                "step's snapshot there (needs DURABLE_AGENT_SNAPSHOT_STORE on shared storage)",
            ],
        )
        if self._move_to is None:
            self._host_since = workflow.now()  # wait longer (retry, or skip: a host call cannot be skipped)
            self._publish()
            workflow.logger.info("waiting longer for host %s: %s", host, resolution.action)

    async def _move_if_asked(self) -> None:
        """A `move_host` asked for: the last step snapshot restored on the new host, which the
        run's calls go to from now on (carried across continue-as-new in the input)."""
        target = self._move_to
        if target is None or self._input is None:
            return
        digest = self._carry.snapshot  # None: no snapshot yet (the host never took a call)
        if digest is not None:
            request = RestoreRequest(
                workspace=self._agent.workspace, digest=digest, exclude=self._agent.snapshot_exclude
            )
            try:
                await workflow.execute_activity(
                    RESTORE_ACTIVITY,
                    request,
                    result_type=RestoreDone,
                    task_queue=workspace_queue(target),
                    schedule_to_start_timeout=timedelta(seconds=self._limits.host_wait_s),
                    start_to_close_timeout=SNAPSHOT_TIMEOUT,
                    retry_policy=options.TOOL_RETRY,
                    summary=f"{RESTORE_ACTIVITY}: step {self._carry.step} on {target}",
                )
            except ACTIVITY_FAILED as e:
                raise_if_cancelled(e)
                self._move_to = None
                self._moves = [*self._moves, f"move to {target} failed: {failure_message(e)}"]
                self._publish()
                return
        self._input = self._agent.model_copy(update={"host": target})
        self._publish_host()
        self._move_to = None
        self._host_since, self._host_unseen = None, False
        self._moves = [*self._moves, f"moved to {target} at step {self._carry.step}"]
        self._publish()

    @workflow.update(name=MOVE_UPDATE)
    def move_host(self, raw: Any) -> str:
        move = HostMove.model_validate(raw)
        self._move_to = move.host
        if HOST_CALL_ID in self._attention and HOST_CALL_ID not in self._resolutions:
            self._resolutions[HOST_CALL_ID] = Resolution(action="retry", note=f"moved to host {move.host}")
        return f"moving to host {move.host} at the run's next call on a host"

    @move_host.validator
    def _validate_move_host(self, raw: Any) -> None:
        move = HostMove.model_validate(raw)
        if self._input is None or self._result is not None:
            raise ValueError("the run is not running")
        if self._agent.host is None:
            raise ValueError("the run is not pinned to a host: its workspace is on storage every worker sees")
        if move.host == self._agent.host:
            raise ValueError(f"the run is on host {move.host} already")


async def short_local_activity(
    name: str,
    arg: Any,
    result_type: type | None,
    timeout: timedelta,
    retry: RetryPolicy,
    summary: str,
    threshold: timedelta = options.LOCAL_RETRY_THRESHOLD,
    activity_id: str | None = None,
) -> Any:
    """A short local activity of the run (a read, a cleanup, a file tool), retried in its own
    workflow task below `threshold`. `activity_id`: None for the SDK's own, as before."""
    return await workflow.execute_local_activity(
        name,
        arg,
        result_type=result_type,
        start_to_close_timeout=timeout,
        retry_policy=retry,
        local_retry_threshold=threshold,
        summary=summary,
        activity_id=activity_id,
    )
