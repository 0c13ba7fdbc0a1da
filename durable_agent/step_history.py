"""A run's steps as its history recorded them: rebuilt by replaying the history, not re-run.

The chain's histories go through the SDK's `Replayer` with the workflow's own code, as a new
worker would replay them: no model or tool call is made, each result is read from history.
An interceptor watches the replay and, at each step's snapshot (the workflow calls its
`_on_step_point`), keeps a deep copy of the run's state there (its `Carry`: the model's view,
usage, counters) with the snapshot's digest, and, at each model call, the tool calls the model
asked for. That state is what `fork` and `rewind` start from, so the context is exactly what
the run had after the step, compaction and all, with no second implementation of the loop to
drift from the first.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    StartActivityInput,
    StartLocalActivityInput,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

from durable_agent.runs import chain_histories
from workflows.agent import AgentWorkflow
from workflows.state import Carry
from workflows.types import AgentInput, ModelReply, ToolCall

_AGENT_STEP = re.compile(r" step \d+$")
"""An agent step's model call (`call_model: MODEL step N`), not a compaction's summary."""
CLOSING_ACTIVITY = "clean_up_run"
"""The activity a closing chain runs last (workflows/agent.py `_clean_up_files`)."""
WRITE_TOOLS = frozenset({"write_file", "edit_file", "run_command", "delegate"})
"""Calls that may change things: a fork or rewind lists those it does not undo."""


class StepPoint(BaseModel):
    """The run as it stood after one step, at its snapshot."""

    step: int
    run_id: str
    digest: str
    carry: Carry
    agent: AgentInput
    """The run's input (workspace, tools, limits) at that point; `agent.carry` is not set."""
    elapsed_s: float
    turns_before: int
    """How many model calls of the chain came before this point (`ChainSteps.turns`)."""


class ModelTurn(BaseModel):
    step: int
    run_id: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class ChainSteps(BaseModel):
    workflow_id: str
    points: list[StepPoint] = Field(default_factory=list)
    turns: list[ModelTurn] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    """Runs today's code could not replay (a nondeterminism error): `doctor` reports them."""
    end: StepPoint | None = None
    """The chain's state as it closed (at its closing clean-up): where `continue` goes on from."""

    def point(self, step: int) -> StepPoint | None:
        """The latest run's state after `step` (a rewound chain went through a step twice)."""
        found = [p for p in self.points if p.step == step]
        return found[-1] if found else None

    def calls_after(self, point: StepPoint) -> list[tuple[int, ToolCall]]:
        """The calls that may have changed things, asked for after `point` (in chain order)."""
        return [(t.step, c) for t in self.turns[point.turns_before :] for c in t.tool_calls if c.name in WRITE_TOOLS]


async def chain_steps(client: Client, workflow_id: str) -> ChainSteps:
    """Every step point and model call of the chain, oldest first, from its histories."""
    histories = await chain_histories(client, workflow_id)
    return await replay_steps(client, workflow_id, histories)


async def replay_steps(client: Client, workflow_id: str, histories: list[WorkflowHistory]) -> ChainSteps:
    steps = ChainSteps(workflow_id=workflow_id)
    capture = _Capture(steps)
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=client.data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),  # the copies must leave the replay as they are
        interceptors=[capture],
    )
    for history in histories:
        capture.run_id = history.run_id
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if replayed.replay_failure is not None:
            steps.failures.append(f"run {history.run_id}: {replayed.replay_failure}")
    return steps


class _Capture(Interceptor):
    def __init__(self, steps: ChainSteps) -> None:
        self.steps = steps
        self.run_id = ""

    def step_point(self, run: Any) -> None:
        """The run at a step's snapshot (workflows/snapshot_steps.py), as it stands then."""
        self.steps.points.append(
            StepPoint(
                step=run._carry.step,
                run_id=self.run_id,
                digest=run._carry.snapshot,
                carry=run._carry.model_copy(deep=True),
                agent=run._agent.model_copy(update={"carry": None, "limits": run._limits.model_copy()}),
                elapsed_s=run._usage_now().elapsed_s,
                turns_before=len(self.steps.turns),
            )
        )

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        capture = self

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(_Outbound(outbound, capture))

            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                workflow.instance()._on_step_point = capture.step_point  # type: ignore[attr-defined]
                return await super().execute_workflow(input)

        return Inbound


class _Outbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, capture: _Capture) -> None:
        super().__init__(next)
        self._capture = capture

    def _closing(self, activity_name: str) -> None:
        if activity_name != CLOSING_ACTIVITY:
            return
        run: Any = workflow.instance()
        self._capture.steps.end = StepPoint(
            step=run._carry.step,
            run_id=self._capture.run_id,
            digest=run._carry.snapshot or "",
            carry=run._carry.model_copy(deep=True),
            agent=run._agent.model_copy(update={"carry": None, "limits": run._limits.model_copy()}),
            elapsed_s=run._usage_now().elapsed_s,
            turns_before=len(self._capture.steps.turns),
        )

    def start_local_activity(self, input: StartLocalActivityInput) -> ActivityHandle[Any]:
        self._closing(input.activity)
        return super().start_local_activity(input)

    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        self._closing(input.activity)
        handle = super().start_activity(input)
        if input.activity == "call_model" and _AGENT_STEP.search(input.summary or ""):
            run: Any = workflow.instance()
            turn = ModelTurn(step=run._carry.step, run_id=self._capture.run_id)

            def replied(done: ActivityHandle[Any]) -> None:
                if done.cancelled() or done.exception() is not None:
                    return
                reply: ModelReply = done.result()
                turn.tool_calls = list(reply.tool_calls)
                turn.input_tokens, turn.output_tokens = reply.input_tokens, reply.output_tokens
                turn.cost_usd = reply.cost_usd()
                self._capture.steps.turns.append(turn)

            handle.add_done_callback(replied)
        return handle
