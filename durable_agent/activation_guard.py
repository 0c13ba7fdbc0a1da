"""A worker refuses an activation that a replay of the run's history would not see the same:
new events without their workflow task's time, or a local activity's result that comes late.

A query can reach a worker as a *legacy query task* that carries the history recorded
since the run's last workflow task: when an activity completes, a timer fires or a signal
arrives just before the worker takes the query, its events ride along, and Temporal Core
applies them to the cached run at once (`managed_run.rs`, `_incoming_wft`). No workflow
task has started for them, so the activation keeps the clock of the run's previous task,
while a replay of the same events runs at the time of the task that records them. Any
decision the run makes there from `workflow.now()` (the time cap, the time budget's soft
tier, when search attributes are due, how long a wait lasted) may differ on replay: a
nondeterminism error, and a run no new worker can take over. It happened under load
(docs/limits.md).

Such an activation is live, brings new events (`history_length` grew) and its timestamp
has not moved past the run's latest: Core moves a run's clock at a workflow task's start
and at a local activity's result (`workflow_machines.rs`), and a new task starts later than
any time the run has seen. The guard answers it with a failed completion, whatever the
workflow: Core evicts the run and fails that query, and the run's next workflow task replays
the history from the server, at the times recorded there. Until that task starts, each such
query is refused again after its replay. Who asked can ask again: the model call's context
query does (`STALE_ACTIVATION` in the failure, activities/model_context.py).

It refuses a second kind the same way: a local activity's result that reaches the run in the
first activation of a new workflow task, beside that task's new events. Core can record a
local activity's marker in the task it completes to answer a query that came with the task,
and hand the result to the workflow only with the next task, whose signal the SDK then applies
first. A replay resolves the local activity in the task that recorded its marker, before the
signal: a run that, live, saw a `pause` before the run-opening's result and waited, replays
as one that saw the result first and called the model (reproduced with a bare workflow in
tests/test_activation_guard.py, `LocalThenBranch`). Evicted there, the run's next task
replays the history, with the result in its recorded place, and goes on from it.

The activation cannot tell that case from a harmless one of the same shape: a local activity
that ends just after Core completed a task without it (to answer a query, or as the task's
heartbeat) has its marker recorded in the next task, and a replay hands it over with that
task's events as the live run saw them. Refused too, that task fails and the local activity
runs again on the retry: at least once, as every activity (the file tools' journal returns
a recorded outcome). A run whose local activity ends that close to each of its tasks, with new
events in each, is refused each time until the events stop (reproduced only with a proxy
that delays the server by 150 ms). Not refused, and so still open to the SDK's fault: a late
result alone in its activation, read against the clock, and two local results of which one
came late.

An eviction is always safe: a false alarm on a workflow task (the server's clock stepped
back) costs failed tasks until that clock passes the run's latest time, never a wrong
decision. What the guard cannot see: when the events that ride along hold a workflow task
that started and then failed or timed out, Core moves the clock to that attempt's start,
and the activation looks like a new task's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from temporalio import workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation, WorkflowActivationJob
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from durable_agent.stale_queries import STALE_ACTIVATION

logger = logging.getLogger(__name__)

_NO_NEW_EVENTS = frozenset({"query_workflow", "remove_from_cache"})
"""Jobs that carry no history event: a query's activation may keep the run's time."""

Stamp = tuple[int, int]
"""A run's activations so far: the latest timestamp (ns) and the longest history."""


def is_stale(act: WorkflowActivation, last: Stamp | None) -> bool:
    """Whether `act`, the activation after the run's activations summed up in `last`,
    applies new events live without the time of the workflow task that records them: its
    history grew, its clock did not move past the latest one seen."""
    if last is None or act.is_replaying or not act.HasField("timestamp"):
        return False
    if act.history_length <= last[1] or act.timestamp.ToNanoseconds() > last[0]:
        return False
    return any(job.WhichOneof("variant") not in _NO_NEW_EVENTS for job in act.jobs)


def brings_a_local_result_late(act: WorkflowActivation, last: Stamp | None) -> bool:
    """Whether `act`, live and the first of a new workflow task (its history grew), hands the run
    a local activity's result together with new events: a replay would resolve that local
    activity in the task that recorded its marker, before those events (module docstring)."""
    if last is None or act.is_replaying or act.history_length <= last[1]:
        return False
    local = any(_is_local_result(job) for job in act.jobs)
    others = any(not _is_local_result(job) and job.WhichOneof("variant") not in _NO_NEW_EVENTS for job in act.jobs)
    return local and others


def _is_local_result(job: WorkflowActivationJob) -> bool:
    return job.HasField("resolve_activity") and job.resolve_activity.is_local


def refused(act: WorkflowActivation, last: Stamp | None) -> bool:
    """The guard's judge: an activation a replay would not see the same (module docstring)."""
    return is_stale(act, last) or brings_a_local_result_late(act, last)


def stamp(act: WorkflowActivation, last: Stamp | None) -> Stamp:
    """The latest clock and the longest history seen, with `act`'s (an eviction's activation has no clock)."""
    seen = act.timestamp.ToNanoseconds() if act.HasField("timestamp") else 0
    return (max(seen, last[0]), max(act.history_length, last[1])) if last else (seen, act.history_length)


Judge = Callable[[WorkflowActivation, Stamp | None], bool]


class FreshClockRunner(WorkflowRunner):
    """Any runner's instances, each behind the guard (`judge` says which activation to refuse)."""

    def __init__(self, inner: WorkflowRunner, judge: Judge = refused):
        self.inner = inner
        self._judge = judge

    def prepare_workflow(self, defn: workflow._Definition) -> None:
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _GuardedInstance(self.inner.create_instance(det), self._judge)

    def set_worker_level_failure_exception_types(self, types: Sequence[type[BaseException]]) -> None:
        self.inner.set_worker_level_failure_exception_types(types)


class _Guarding(WorkflowRunner):
    """An SDK runner of its own type, its instances behind the guard: the SDK's and its
    plugins' `isinstance(runner, SandboxedWorkflowRunner)` and `dataclasses.replace` (the
    OpenTelemetry plugin's passthrough, debug mode's) see the runner they know, and keep the guard."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _GuardedInstance(super().create_instance(det), refused)


@dataclass(frozen=True)
class GuardedSandboxedRunner(_Guarding, SandboxedWorkflowRunner):
    pass


class GuardedUnsandboxedRunner(_Guarding, UnsandboxedWorkflowRunner):
    pass


def guarded(runner: WorkflowRunner | None, default: type[WorkflowRunner] = SandboxedWorkflowRunner) -> WorkflowRunner:
    """`runner` (`default()` when none) behind the guard, once. `DurableAgentPlugin` guards
    both of a worker's runners, so users' own workers get it too."""
    runner = runner or default()
    if isinstance(runner, (_Guarding, FreshClockRunner)):
        return runner
    if type(runner) is SandboxedWorkflowRunner:
        return GuardedSandboxedRunner(restrictions=runner.restrictions, runner_class=runner.runner_class)
    if type(runner) is UnsandboxedWorkflowRunner:
        return GuardedUnsandboxedRunner()
    return FreshClockRunner(runner)


class _GuardedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, judge: Judge) -> None:
        self._inner = inner
        self._judge = judge
        self._last: Stamp | None = None

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        last, self._last = self._last, stamp(act, self._last)
        if not self._judge(act, last):
            completion = self._inner.activate(act)
            if _rejects_an_update(completion):
                # Core drops a rejected update's speculative task (its two events) and counts the
                # history from before it, the task's time kept: events that follow may reach this length.
                self._last = (self._last[0], self._last[1] - 2)
            return completion
        info = self._inner.get_info()
        why = (
            "a local activity's result came with the next task's events"
            if brings_a_local_result_late(act, last)
            else "new events reached the cached run without their workflow task's time"
        )
        logger.warning(
            "%s of workflow %s run %s: %s (%d new event(s)); evicted, to replay from history",
            STALE_ACTIVATION,
            info.workflow_id,
            act.run_id,
            why,
            act.history_length - (last[1] if last else 0),
        )
        completion = WorkflowActivationCompletion(run_id=act.run_id)
        completion.failed.failure.message = (
            f"{STALE_ACTIVATION}: {why}; the run was evicted and replays from history; ask again"
        )
        return completion

    def get_serialization_context(self, command_info):  # type: ignore[no-untyped-def]
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info):  # type: ignore[no-untyped-def]
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


def _rejects_an_update(completion: WorkflowActivationCompletion) -> bool:
    return any(
        command.HasField("update_response") and command.update_response.HasField("rejected")
        for command in completion.successful.commands
    )
