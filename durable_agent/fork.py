"""`durable-agent fork` and `rewind`: a new run from a step of another, or the same run taken
back to a step, context and files both.

The context is the source's state after step N as its history's replay rebuilt it
(durable_agent/step_history.py): no call before N is made again. The workspace is step N's
snapshot restored into a folder of the fork's own. What the source did after N in the world
(writes, commands, delegates) cannot be undone: it is listed before the fork starts, and the
fork's model is told about it in a user message before its first call.

Rewind is a new run of the same workflow id, not Temporal's reset: a reset replays the kept
part of history and runs the step's last workflow task again, which would re-run that task's
local activities (file tools whose journal the closed run removed) and cannot start from a
step in an earlier run of a continue-as-new chain. A new run from the replayed state has
neither problem and is the fork's own path. The files are reset in place once the open run is
terminated; what they were just before is stored first (its digest is printed), and the
earlier run's steps stay in the chain, so rewinding to a later step of it undoes the rewind.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.snapshots import SnapshotError, Store
from durable_agent.launch import LaunchError
from durable_agent.runs import start_agent
from durable_agent.step_history import ChainSteps, StepPoint, chain_steps
from workflows.compaction import run_folder
from workflows.state import Carry
from workflows.tool_specs import call_summary
from workflows.types import AgentInput, ToolCall, Usage


class ForkError(LaunchError):
    """Why the fork cannot be made, in one line (exit code 2)."""


class ForkRequest(BaseModel):
    source: str
    step: int
    message: str | None = None
    model: str | None = None
    workspace: str | None = None
    new_id: str | None = None
    fresh_budget: bool = False


class ForkPlan(BaseModel):
    workflow_id: str
    workspace: str
    point: StepPoint
    side_effects: list[str]
    """The source's calls after the step that may have changed things, one line each."""


async def plan_fork(client: Client, request: ForkRequest) -> tuple[ForkPlan, ChainSteps]:
    steps = await chain_steps(client, request.source)
    point = find_point(steps, request.source, request.step)
    new_id = request.new_id or f"{request.source}-fork{request.step}-{uuid.uuid4().hex[:6]}"
    source = _source_folder(point)
    workspace = _fork_folder(source, request.workspace, new_id)
    if os.path.commonpath([workspace, source]) == source:
        raise ForkError(
            f"{workspace} lies in the source's workspace {source}: its snapshots would hold the fork's files "
            "(and a rewind of it delete them); give a --workspace beside it"
        )
    try:
        if os.path.exists(workspace) and (not os.path.isdir(workspace) or os.listdir(workspace)):
            raise ForkError(f"{workspace} holds files: a fork's workspace must be a new or empty folder (--workspace)")
    except OSError as e:
        raise ForkError(f"{workspace} cannot be looked into: {e.strerror}") from None
    effects = [f"step {step}: {describe_call(call)}" for step, call in steps.calls_after(point)]
    return ForkPlan(workflow_id=new_id, workspace=workspace, point=point, side_effects=effects), steps


def _source_folder(point: StepPoint) -> str:
    """The folder the source's snapshots were taken of, as its worker resolved it (its
    workspace resolved now, for snapshots stored before manifests named it)."""
    try:
        return Store().taken_from(point.digest) or os.path.realpath(point.agent.workspace)
    except SnapshotError as e:
        raise ForkError(str(e)) from None


def _fork_folder(source: str, given: str | None, name: str) -> str:
    """The fork's folder, resolved: where its files are restored and its run works. By default
    beside the source's folder (`_source_folder`): a folder on that path swapped for a link
    since (a command of a run whose workspace holds the source's can swap one) is refused when
    the files are restored, never followed. A `--workspace` given is resolved now."""
    if given is None:
        return os.path.join(os.path.dirname(source), name)
    return os.path.realpath(given)  # a link named is followed, once


def find_point(steps: ChainSteps, source: str, step: int) -> StepPoint:
    if not steps.points:
        raise ForkError(f"{source} has no workspace snapshots (no step finished, or it started before they existed)")
    point = steps.point(step)
    if point is None:
        have = sorted({p.step for p in steps.points})
        raise ForkError(f"{source} has no snapshot of step {step}: its steps with one are {_ranges(have)}")
    return point


def describe_call(call: ToolCall) -> str:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {}
    return call_summary(call.name, args if isinstance(args, dict) else {})


async def start_fork(client: Client, request: ForkRequest, plan: ForkPlan) -> tuple[WorkflowHandle, str | None]:
    """Restores the files, then starts the run on the source's task queue; the handle, and a
    warning line (`stands_on`)."""
    point = plan.point
    queue = (await client.get_workflow_handle(request.source).describe()).task_queue
    try:
        os.makedirs(os.path.dirname(plan.workspace), exist_ok=True)  # by path: `restore` checks it is that folder
        Store().restore(point.digest, plan.workspace)
    except (SnapshotError, OSError) as e:
        raise ForkError(f"the fork's files could not be restored: {e}") from None
    agent = fork_input(request, plan)
    summary = f"fork of {request.source} at step {request.step}: {agent.goal}"
    try:
        started = await start_agent(
            client, agent, plan.workflow_id, queue, summary=summary, details=_details(request, plan)
        )
    except WorkflowAlreadyStartedError:
        raise ForkError(f"a run with id {plan.workflow_id} exists already (--id)") from None
    return started, stands_on(started, point.digest)


def stands_on(started: WorkflowHandle, digest: str) -> str | None:
    """The new chain's ref, pointing at the snapshot it starts from, unless it has one: until
    its first step it stands on another chain's snapshots, which `durable-agent gc` may remove
    once that chain has closed long enough (a fork of an old run, a rewind of a rewind). The
    run has started whatever happens here: a ref that cannot be written is a warning line."""
    chain = run_folder(started.id, started.result_run_id or "")
    try:
        Store().ref_unless_there(chain, digest, owner=started.id)
    except (SnapshotError, OSError) as e:
        return f"warning: the run's snapshot {digest[:12]} has no ref of its own until its first step ({e})"
    return None


def fork_input(request: ForkRequest, plan: ForkPlan) -> AgentInput:
    point = plan.point
    carry: Carry = point.carry.model_copy(deep=True)
    # The fork is a chain of its own: its run ids, archive and run files (workflows/agent.py).
    carry.first_run_id, carry.archive_dir = "", ""
    carry.paused, carry.paused_reason = False, None
    carry.elapsed_before_s = point.elapsed_s
    if request.fresh_budget:
        carry.usage, carry.elapsed_before_s = Usage(), 0.0
        carry.ladder, carry.warned, carry.early_soft_tier, carry.tokens_per_step = [], [], False, []
    if request.model:
        carry.model = request.model
    carry.pending_user_messages += [fork_note(request, plan), *([request.message] if request.message else [])]
    update = {"workspace": plan.workspace, "carry": carry, "parent": None}
    if request.model:
        update["model"] = request.model
    return point.agent.model_copy(update=update)


def fork_note(request: ForkRequest, plan: ForkPlan) -> str:
    head = (
        f"This run is a fork of run {request.source} at step {request.step}: the conversation and the "
        f"workspace's files are as they were after step {request.step}."
    )
    if not plan.side_effects:
        return f"{head} After it, the source run made no call that writes files or runs commands."
    listed = "\n".join(f"- {line}" for line in plan.side_effects)
    return (
        f"{head} After it, the source run made these calls; their files are undone here, but anything "
        f"they changed outside the workspace (services, networks, other folders) was not:\n{listed}"
    )


def _details(request: ForkRequest, plan: ForkPlan) -> str:
    lines = "\n".join(f"- {line}" for line in plan.side_effects) or "- none"
    return (
        f"\n\n**Forked from:** {request.source} at step {request.step}\n\n"
        f"**Calls of the source after step {request.step}, not taken here:**\n{lines}"
    )


def _ranges(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else ", ".join(map(str, steps))


class Rewound(BaseModel):
    workflow_id: str
    run_id: str | None
    step: int
    before: str
    """The digest of the workspace as it was before the rewind: what undoing it restores."""
    side_effects: list[str]
    warning: str | None = None


async def rewind(
    client: Client, workflow_id: str, step: int, message: str | None, announce: Callable[[list[str]], None]
) -> Rewound:
    """The same workflow id goes back to `step`: the open run (if any) is terminated, the files
    are reset in place, and a new run of the id starts paused from the step's state. `announce`
    gets the calls after the step that are not undone, before anything is changed."""
    handle = client.get_workflow_handle(workflow_id)
    description = await handle.describe()
    open_run = description.status == WorkflowExecutionStatus.RUNNING
    pending = [a.activity_type.name for a in description.raw_description.pending_activities] if open_run else []
    running = [name for name in pending if name != "call_model"]  # a model call has no effect to tear
    if running:
        raise ForkError(f"{workflow_id} is running {', '.join(running)}: wait for it (or `pause`), then rewind")
    steps = await chain_steps(client, workflow_id)
    point = find_point(steps, workflow_id, step)
    effects = [f"step {s}: {describe_call(call)}" for s, call in steps.calls_after(point)]
    store = Store()
    since = next(i for i, p in enumerate(steps.points) if p is point)
    workspace = checked_workspace(store, point, workflow_id, [p.digest for p in steps.points[since:]])
    announce(effects)
    if open_run:
        await handle.terminate(reason=f"rewound to step {step} by a person")
    exclude = point.agent.snapshot_exclude  # left as they are, like every snapshot of the run
    try:
        before, _ = store.take(
            workspace,
            next((p.digest for p in reversed(steps.points) if store.has(p.digest)), None),
            chain=run_folder(workflow_id, f"before-rewind-{uuid.uuid4().hex[:6]}"),  # a file name, whatever the id
            exclude=exclude,
        )
        store.reset(point.digest, workspace, exclude)
    except (SnapshotError, OSError) as e:
        raise ForkError(f"{e}; the run was ended and its files may be partly reset: rewind again") from None
    agent = _rewound_input(point, workflow_id, step, effects, message)
    started = await start_agent(
        client, agent, workflow_id, description.task_queue, summary=f"rewound to step {step}: {agent.goal}"
    )
    return Rewound(
        workflow_id=workflow_id,
        run_id=started.result_run_id,
        step=step,
        before=before,
        side_effects=effects,
        warning=stands_on(started, point.digest),
    )


def checked_workspace(store: Store, point: StepPoint, workflow_id: str, digests: list[str]) -> str:
    """The workspace resolved, if it is the folder the run's worker checked and took each
    snapshot of, from the step rewound to on (`digests`). Another means a folder on its path
    is now a link (a command of a run whose workspace holds this one can swap one), or the
    workspace moved: resetting where the path leads could empty any folder."""
    real = os.path.realpath(point.agent.workspace)
    if not store.has(point.digest):
        raise ForkError(
            f"step {point.step}'s snapshot {point.digest[:12]} is not in the store {store.root} (`durable-agent gc` "
            "removes those of chains closed long enough); nothing was changed"
        )
    try:
        stored = [digest for digest in dict.fromkeys(digests) if store.has(digest)]  # a line rewound away: gc'd
        taken_from = {store.taken_from(digest) for digest in stored} - {None, real}
    except SnapshotError as e:
        raise ForkError(str(e)) from None
    if taken_from:
        raise ForkError(
            f"{point.agent.workspace} now resolves to {real}, but the run's snapshots since step {point.step} "
            f"are of {min(taken_from)}: a folder on its path was replaced by a link, or the workspace moved; "
            f"nothing was changed (`durable-agent fork {workflow_id} --at-step {point.step} --workspace DIR` "
            "restores the step into a new folder)"
        )
    return real


def _rewound_input(
    point: StepPoint, workflow_id: str, step: int, effects: list[str], message: str | None
) -> AgentInput:
    carry: Carry = point.carry.model_copy(deep=True)
    carry.first_run_id, carry.elapsed_before_s = "", point.elapsed_s
    carry.paused, carry.paused_reason = True, f"rewound to step {step}: `durable-agent resume {workflow_id}` goes on"
    listed = "\n".join(f"- {line}" for line in effects) or "- none"
    note = (
        f"A person rewound this run to step {step}: the conversation and the workspace's files are as they "
        f"were after step {step}. After it, the run had made these calls; their files are undone, anything "
        f"they changed outside the workspace is not:\n{listed}"
    )
    carry.pending_user_messages += [note, *([message] if message else [])]
    return point.agent.model_copy(update={"carry": carry})
