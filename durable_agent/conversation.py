"""`durable-agent continue`: a completed or stopped run goes on, as the next run of its own id.

The run's state as it closed (its context, usage, skills, catalog, the chain's archive) is
rebuilt by replaying its histories (durable_agent/step_history.py), as `fork` rebuilds a
step's; nothing is called again. The new run has the same workflow id: `status`, `watch`,
`export` and the Web UI's list keep naming one conversation, and Temporal keeps the earlier
runs' histories under that id (a closed id takes a new run). Its workspace is the run's
own, as it is now: nothing is restored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle

from durable_agent.fork import ForkError
from durable_agent.runs import start_agent
from durable_agent.step_history import chain_steps
from workflows.state import Carry
from workflows.types import AgentResult, LimitsPatch

GOES_ON = ("completed", "stopped")


class Continuation(BaseModel):
    workflow_id: str
    message: str | None = None
    limits: LimitsPatch = LimitsPatch()


async def continue_run(
    client: Client, request: Continuation, start_signal: str | None = None, start_signal_args: Sequence[Any] = ()
) -> tuple[WorkflowHandle[Any, AgentResult], int]:
    """Start the next run of `request.workflow_id`'s conversation: its handle, and the step it
    goes on after. ForkError says why it cannot."""
    handle = client.get_workflow_handle(request.workflow_id, result_type=AgentResult)
    description = await handle.describe()
    if description.status == WorkflowExecutionStatus.RUNNING:
        raise ForkError(
            f"{request.workflow_id} is still running: `durable-agent message {request.workflow_id} TEXT` "
            "reaches it before its next model call"
        )
    result = await _result(handle)
    if result.state not in GOES_ON:
        raise ForkError(f"{request.workflow_id} ended {result.state}: only a completed or stopped run goes on")
    given = request.limits.model_dump(exclude_none=True)
    if result.state == "stopped" and not given:
        raise ForkError(
            f"{request.workflow_id} stopped at a limit ({result.stop_reason}): give it more room to go on, "
            "e.g. --hard-steps N or --max-tokens N"
        )
    if result.state == "completed" and not request.message:
        raise ForkError(f"{request.workflow_id} completed: say what comes next with --message TEXT")
    steps = await chain_steps(client, request.workflow_id)
    if steps.end is None:
        raise ForkError(f"{request.workflow_id}'s history holds no close to go on from")
    end = steps.end
    carry: Carry = end.carry.model_copy(deep=True)
    carry.elapsed_before_s = end.elapsed_s
    carry.paused, carry.paused_reason = False, None
    carry.pending_user_messages += [request.message or "You have more room now: go on with the task."]
    limits = end.agent.limits.model_copy(update=given)
    agent = end.agent.model_copy(update={"carry": carry, "limits": limits})
    started = await start_agent(
        client,
        agent,
        request.workflow_id,
        description.task_queue,
        start_signal=start_signal,
        start_signal_args=start_signal_args,
        summary=f"continued after step {end.step}: {request.message or agent.goal}",
    )
    return started, end.step


async def _result(handle: WorkflowHandle[Any, AgentResult]) -> AgentResult:
    try:
        return await handle.result()
    except WorkflowFailureError as e:
        raise ForkError(f"{handle.id} failed ({e.cause}): it has no state to go on from") from None
