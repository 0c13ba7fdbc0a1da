"""The run's snapshot at each step boundary. A part of `AgentWorkflow` (workflows/agent.py).

Where a step's tools are built-in ones with an activity, none waiting for approval, in a run
without a host, and the step has one call or exactly one command, the step's last call takes
the snapshot in its own activity, after its effects, and its outcome carries the digest: the
others run first, then that one. Otherwise (and when that call brought none back) a
`snapshot_workspace` local activity takes it, in the workflow task the run has anyway after a
step's tools, at the price of one more activation of the workflow and a local activity's round
in the worker (docs/fork.md lists the cases; docs/fleet.md measures both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    from workflows.tool_specs import ToolArgumentError
    from workflows.types import ToolCall

SNAPSHOT_CARRIERS = (options.LOCAL_TOOLS - {"load_skill"}) | {"run_command"}
"""The built-in tools whose activity can take the step's snapshot after its call: the file
tools and the command (activities/tools/__init__.py; `load_skill` is the skills' own)."""


class SnapshotSteps:
    """`_snapshots_on` and `_snapshot_with_tools` are read once, at the run's start: see `AgentWorkflow.run`."""

    _snapshots_on = False
    _snapshot_with_tools = False
    _taken_in_a_call: SnapshotTaken | None = None
    """The current step's snapshot, taken by its last call (`ToolOutcome.snapshot`) or, at step 0,
    by the run's opening (`open_run`, workflows/run_opening.py)."""
    _on_step_point: Callable[[Any], None] | None = None
    """Called at each step's snapshot with the workflow: the replay that reads a run's steps
    back (durable_agent/step_history.py) keeps its state there."""

    def _snapshot_request(self) -> SnapshotRequest:
        return SnapshotRequest(
            workspace=self._agent.workspace,
            step=self._carry.step,
            previous=self._carry.snapshot,
            chain=self._run_folder(),
            exclude=self._agent.snapshot_exclude,
        )

    def _snapshot_carrier(self, calls: list[ToolCall]) -> int | None:
        """The position of the call whose activity takes the step's snapshot, run after the
        others; None: the step takes it in an activity of its own. Only where every call is a
        built-in tool with an activity, at most one of them a command (the one that goes last),
        and none waits for a person (it would end after the snapshot)."""
        if not self._snapshot_with_tools or not calls or self._agent.host is not None:
            return None  # on a host, the file tools may be regular activities: in series, a round trip more
        ours = lambda call: call.name in SNAPSHOT_CARRIERS and call.name not in self._catalog_specs()  # noqa: E731
        if not all(ours(call) and not self._gated(call) for call in calls):
            return None
        commands = [place for place, call in enumerate(calls) if call.name == "run_command"]
        if len(commands) == 1:
            return commands[0]
        return 0 if len(calls) == 1 else None

    def _gated(self, call: ToolCall) -> bool:
        """Whether the call waits for a person's approval (one whose arguments do not parse never runs)."""
        try:
            return self._approval_reason(call, self._arguments(call)) is not None
        except ToolArgumentError:
            return False

    async def _snapshot(self) -> None:
        if not self._snapshots_on:
            return
        request = self._snapshot_request()
        taken, self._taken_in_a_call = self._taken_in_a_call, None
        if taken is None or taken.step != request.step:
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
        if self._on_step_point is not None:
            self._on_step_point(self)
