"""The run's snapshot at each step boundary. A part of `AgentWorkflow` (workflows/agent.py).

A local activity, in the workflow task the run has anyway after a step's tools (that task
then schedules the next model call): no round trip through the server is added.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled
    from workflows.snapshots import (
        SNAPSHOT_ACTIVITY,
        SNAPSHOT_RETRY,
        SNAPSHOT_TIMEOUT,
        SnapshotRequest,
        SnapshotTaken,
    )


class SnapshotSteps:
    """`_snapshots_on` is read once, at the run's start: see `AgentWorkflow.run`."""

    _snapshots_on = False

    async def _snapshot(self) -> None:
        if not self._snapshots_on:
            return
        request = SnapshotRequest(
            workspace=self._agent.workspace,
            step=self._carry.step,
            previous=self._carry.snapshot,
            chain=self._run_folder(),
            exclude=self._agent.snapshot_exclude,
        )
        try:
            taken = await self._on_host_or_local(
                SNAPSHOT_ACTIVITY,
                request,
                result_type=SnapshotTaken,
                start_to_close_timeout=SNAPSHOT_TIMEOUT,
                retry_policy=SNAPSHOT_RETRY,
                local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                summary=f"{SNAPSHOT_ACTIVITY}: step {self._carry.step}",
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            workflow.logger.warning("no snapshot of step %s: %s", self._carry.step, failure_message(e))
            return
        self._carry.snapshot = taken.digest
