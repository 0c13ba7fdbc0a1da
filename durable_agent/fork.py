"""`durable-agent fork`: a new run from a step of another, its context and its files.

The context is the source's state after step N as its history's replay rebuilt it
(durable_agent/step_history.py): no call before N is made again. The workspace is step N's
snapshot restored into a folder of the fork's own. What the source did after N in the world
(writes, commands, delegates) cannot be undone: it is listed before the fork starts, and the
fork's model is told about it in a user message before its first call.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.snapshots import SnapshotError, Store
from durable_agent.launch import LaunchError
from durable_agent.runs import start_agent
from durable_agent.step_history import ChainSteps, StepPoint, chain_steps
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
    workspace = request.workspace or str(Path(point.agent.workspace).parent / new_id)
    if os.path.exists(workspace) and (not os.path.isdir(workspace) or os.listdir(workspace)):
        raise ForkError(f"{workspace} holds files: a fork's workspace must be a new or empty folder (--workspace)")
    effects = [f"step {step}: {describe_call(call)}" for step, call in steps.calls_after(point)]
    return ForkPlan(workflow_id=new_id, workspace=os.path.abspath(workspace), point=point, side_effects=effects), steps


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


async def start_fork(client: Client, request: ForkRequest, plan: ForkPlan) -> WorkflowHandle:
    """Restores the files, then starts the run on the source's task queue."""
    point = plan.point
    queue = (await client.get_workflow_handle(request.source).describe()).task_queue
    Path(plan.workspace).mkdir(parents=True, exist_ok=True)
    try:
        Store().restore(point.digest, plan.workspace)
    except SnapshotError as e:
        raise ForkError(str(e)) from None
    agent = fork_input(request, plan)
    summary = f"fork of {request.source} at step {request.step}: {agent.goal}"
    try:
        return await start_agent(
            client, agent, plan.workflow_id, queue, summary=summary, details=_details(request, plan)
        )
    except WorkflowAlreadyStartedError:
        raise ForkError(f"a run with id {plan.workflow_id} exists already (--id)") from None


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
