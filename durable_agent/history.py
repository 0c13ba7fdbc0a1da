"""What a run did, read from its histories alone: no worker, no query.

The chain's histories (`durable_agent.runs.chain_histories`) are replayed here, in this
process, against the workflow code, through the client's data converter (so whatever
codec the client decodes with applies). A recording interceptor watches the replay: each
model and tool call with its input and result, each signal and update people sent, and,
when a run closes, its transcript and result. This is what `durable-agent export` and
`durable-agent trace` read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import opentelemetry.trace as otel
from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.exceptions import FailureError
from temporalio.worker import (
    ExecuteWorkflowInput,
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    Replayer,
    StartActivityInput,
    StartLocalActivityInput,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from durable_agent import genai
from durable_agent.runs import chain_histories
from durable_agent.telemetry import ChainSpan, chain_span, emit_invoke_agent
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult, Message, ModelCallInput, ModelReply, ToolCallInput, ToolOutcome

_RECORDER = "__durable_agent_recorder"


class RecordedCall(BaseModel):
    """One activity the workflow ran: a model call (`call_model`) or a tool call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    activity: str
    request: Any
    start_ns: int
    end_ns: int | None = None
    result: ModelReply | ToolOutcome | None = None
    error: str | None = None


class PersonAction(BaseModel):
    """A signal or an accepted update: pause, resume, a message, an approval, a resolve."""

    name: str
    payload: Any = None
    at_ns: int
    step: int


class RunRecord(BaseModel):
    """One run of the chain as replayed."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    run_id: str
    input: AgentInput | None = None
    chain: ChainSpan
    start_ns: int
    end_ns: int | None = None
    calls: list[RecordedCall] = Field(default_factory=list)
    actions: list[PersonAction] = Field(default_factory=list)
    transcript: list[Message] | None = None
    result: AgentResult | None = None
    error: str | None = None
    error_type: str | None = None
    continued: bool = False


class ChainRecord(BaseModel):
    workflow_id: str
    runs: list[RunRecord]

    @property
    def closed(self) -> bool:
        last = self.runs[-1] if self.runs else None
        return last is not None and (last.result is not None or last.error is not None)

    @property
    def result(self) -> AgentResult | None:
        return self.runs[-1].result if self.runs else None

    @property
    def goal(self) -> str:
        first = self.runs[0].input if self.runs else None
        return first.goal if first else ""

    def transcript(self) -> list[Message]:
        """The chain's messages in order: each run's, less what it carried from the last."""
        messages: list[Message] = []
        seen: set[str] = set()
        for run in self.runs:
            for message in run.transcript or []:
                key = message.model_dump_json()
                if key not in seen:
                    seen.add(key)
                    messages.append(message)
        return messages

    def calls(self) -> list[RecordedCall]:
        return [call for run in self.runs for call in run.calls]

    def actions(self) -> list[PersonAction]:
        return [action for run in self.runs for action in run.actions]


async def replay_chain(client: Client, workflow_id: str) -> ChainRecord:
    """Replay every run of the chain; raises `HistoryError` when it does not replay."""
    histories = await chain_histories(client, workflow_id)
    if not histories:
        raise HistoryError(f"no run with id {workflow_id!r}")
    return await replay_histories(client, workflow_id, histories)


async def replay_histories(client: Client, workflow_id: str, histories: list[WorkflowHistory]) -> ChainRecord:
    recorder = _Recorder()
    replayer = Replayer(
        workflows=[AgentWorkflow],
        interceptors=[recorder],
        data_converter=client.data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    for history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            raise HistoryError(f"the history of {workflow_id} does not replay: {result.replay_failure}")
    return ChainRecord(workflow_id=workflow_id, runs=recorder.runs)


class HistoryError(Exception):
    """A chain that cannot be read: none found, or a history that does not replay."""


class _Recorder(Interceptor):
    def __init__(self) -> None:
        self.runs: list[RunRecord] = []

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        input.unsafe_extern_functions[_RECORDER] = self._new_run
        return _RecordingInbound

    def _new_run(self, record: RunRecord) -> RunRecord:
        self.runs.append(record)
        return record


class _RecordingInbound(WorkflowInboundInterceptor):
    _run: RunRecord | None = None

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_RecordingOutbound(outbound, self))

    @property
    def record(self) -> RunRecord:
        """Made on first use: the workflow's info is not there yet when `init` runs."""
        if self._run is None:
            info = workflow.info()
            new_run: Callable[[RunRecord], RunRecord] = workflow.extern_functions()[_RECORDER]  # type: ignore[assignment]
            self._run = new_run(RunRecord(run_id=info.run_id, chain=chain_span(info), start_ns=workflow.time_ns()))
        return self._run

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        record = self.record
        try:
            record.input = AgentInput.model_validate(input.args[0]) if input.args else None
        except ValueError:
            record.input = None
        try:
            result = await super().execute_workflow(input)
        except workflow.ContinueAsNewError:
            record.continued = True
            raise
        except FailureError as e:
            record.error, record.error_type = str(e), genai.error_type(e)
            raise
        finally:
            record.end_ns = workflow.time_ns()
            record.transcript = workflow.instance().transcript(None)
        record.result = result if isinstance(result, AgentResult) else AgentResult.model_validate(result)
        return result

    async def handle_signal(self, input: HandleSignalInput) -> None:
        self._person(input.signal, input.args)
        await super().handle_signal(input)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        self._person(input.update, input.args)
        return await super().handle_update_handler(input)

    def _person(self, name: str, args: Any) -> None:
        payload = args[0] if args else None
        if isinstance(payload, BaseModel):
            payload = payload.model_dump(exclude_none=True)
        step = workflow.instance().status().step
        self.record.actions.append(PersonAction(name=name, payload=payload, at_ns=workflow.time_ns(), step=step))


class _RecordingOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, inbound: _RecordingInbound) -> None:
        super().__init__(next)
        self._inbound = inbound

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        return self._track(input.activity, input.args, super().start_activity(input))

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        return self._track(input.activity, input.args, super().start_local_activity(input))

    def _track(self, activity: str, args: Any, handle: workflow.ActivityHandle[Any]) -> workflow.ActivityHandle[Any]:
        call = RecordedCall(activity=activity, request=args[0] if args else None, start_ns=workflow.time_ns())
        self._inbound.record.calls.append(call)

        def finished(task: Any) -> None:
            call.end_ns = workflow.time_ns()
            if task.cancelled():
                call.error = "cancelled"
            elif task.exception() is not None:
                call.error = genai.error_type(task.exception())
            elif isinstance(task.result(), ModelReply | ToolOutcome):
                call.result = task.result()
                if isinstance(call.request, ToolCallInput):  # the file calls that ran in a command's activity
                    self._inbound.record.calls += [
                        RecordedCall(
                            activity=tool, request=request, start_ns=call.start_ns, end_ns=call.end_ns, result=done
                        )
                        for tool, request, done in genai.riders(call.request, call.result)
                    ]

        handle.add_done_callback(finished)
        return handle


def emit_spans(chain: ChainRecord, tracer: otel.Tracer) -> int:
    """Emit the chain's GenAI spans as the live run did: the same `invoke_agent` span (same
    ids and parent), and under it a `chat` and an `execute_tool` span per finished call,
    timed by the workflow's clock (when the call was scheduled and when its result came
    back). Temporal's own spans are not re-emitted. Returns how many spans were emitted."""
    root = chain.runs[0].chain
    sampled = otel.TraceFlags(otel.TraceFlags.SAMPLED)
    parent = otel.set_span_in_context(
        otel.NonRecordingSpan(otel.SpanContext(root.trace_id, root.span_id, False, sampled))
    )
    emitted = 0
    for call in chain.calls():
        if call.end_ns is None:
            continue
        if isinstance(call.request, ModelCallInput):
            reply = call.result if isinstance(call.result, ModelReply) else None
            name, kind = genai.chat_span_name(call.request.model), otel.SpanKind.CLIENT
            attributes = genai.chat_attributes(call.request, reply, call.error)
        elif isinstance(call.request, ToolCallInput):
            outcome = call.result if isinstance(call.result, ToolOutcome) else None
            name, kind = genai.tool_span_name(call.activity), otel.SpanKind.INTERNAL
            attributes = genai.tool_attributes(call.activity, call.request, outcome, call.error)
        else:
            continue
        span = tracer.start_span(name, parent, kind=kind, attributes=attributes, start_time=call.start_ns)
        if call.error is not None:
            span.set_status(otel.Status(otel.StatusCode.ERROR))
        span.end(end_time=call.end_ns)
        emitted += 1
    last = chain.runs[-1]
    if chain.closed and last.end_ns is not None:
        attributes = genai.invoke_agent_attributes(chain.workflow_id, last.result, last.error_type)
        emit_invoke_agent(tracer, root, last.end_ns, attributes, last.error_type is not None)
        emitted += 1
    return emitted
