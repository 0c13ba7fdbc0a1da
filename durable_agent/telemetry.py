"""Traces: Temporal's OpenTelemetry integration plus GenAI spans, set up from `OTEL_*`.

What a run looks like in a trace:

    StartWorkflow:AgentWorkflow        (the client that started it, when traced)
      invoke_agent                     the run, all of its continue-as-new chain
        RunWorkflow:AgentWorkflow      Temporal's spans, once per run of the chain
        StartActivity:call_model
          RunActivity:call_model
            chat gpt-4.1-mini          one per model call, with tokens and error.type
        StartActivity:read_file
          RunActivity:read_file
            execute_tool read_file     one per tool call, with its call id and outcome

Temporal's `TracingInterceptor` emits its workflow spans only when the workflow is not
replaying, so a replay (a new worker, an evicted cache) adds none. Here it is subclassed
so that every workflow span hangs from the run's `invoke_agent` span, whose ids are
derived from the workflow id and the chain's first run id: every worker, and `durable-agent
trace` reading history later, names the same span. The span itself is emitted once, when
the chain closes, with the chain's start as its start. A continue-as-new passes it on in
a header of its own. Child workflows inherit the trace through Temporal's headers.

`chat` and `execute_tool` spans are made around the activities (an activity interceptor),
so they time the real call, wherever and however it runs (local or regular activity).

Exporters: `OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`, comma-separated); with it
unset, `otlp` when `OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT` is set, else
nothing is set up. OTLP goes over HTTP/protobuf (`OTEL_EXPORTER_OTLP_*` as the exporter
reads them). `OTEL_SDK_DISABLED=true` turns it all off.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import opentelemetry.trace as otel
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from temporalio import activity, workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.converter import PayloadConverter
from temporalio.exceptions import FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ContinueAsNewInput,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from durable_agent import genai
from workflows.types import WORKFLOW_TYPE, ModelCallInput, ModelReply, ToolCallInput, ToolOutcome

TRACER_NAME = "durable_agent"
CHAIN_HEADER = "_durable-agent-trace"
"""The header a continue-as-new carries: the `invoke_agent` span, its parent and start."""
TRACE_HEADER = "_tracer-data"
"""Temporal's `TracingInterceptor` header (its `header_key`)."""


class TelemetryError(Exception):
    """The `OTEL_*` variables ask for something this build cannot do."""


# --- setup from the environment ---------------------------------------------------------


def span_exporters_from_env() -> list[SpanExporter]:
    """The exporters the standard variables ask for; empty when they ask for none."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = os.environ.get("OTEL_TRACES_EXPORTER")
    if names is None:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        names = "otlp" if endpoint else "none"
    exporters: list[SpanExporter] = []
    for name in (n.strip().lower() for n in names.split(",")):
        if name in ("", "none"):
            continue
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp_exporter())
        else:
            raise TelemetryError(f"OTEL_TRACES_EXPORTER={name!r} is not supported; use otlp, console or none")
    return exporters


def _otlp_exporter() -> SpanExporter:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/protobuf":
        raise TelemetryError(f"OTLP protocol {protocol!r} is not supported; use http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def tracer_provider(exporters: Sequence[SpanExporter], batch: bool = True) -> TracerProvider:
    """A provider whose ids can be chosen (see `chosen_ids`); service name from the env."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or genai.AGENT_NAME})
    provider = TracerProvider(resource=resource, id_generator=_ChosenIdGenerator())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return provider


_configured: AgentTracing | None | bool = False


def configured() -> AgentTracing | None:
    """The process's tracing, made once from the environment; None when it asks for none."""
    global _configured
    if _configured is False:
        exporters = span_exporters_from_env()
        _configured = AgentTracing(tracer_provider(exporters)) if exporters else None
    return _configured or None


def shutdown() -> None:
    """Flush and stop the exporters: call before a process that traced exits."""
    if isinstance(_configured, AgentTracing):
        _configured.provider.shutdown()


# --- deterministic ids --------------------------------------------------------------------

_chosen: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "durable_agent_chosen_ids", default=None
)


class _ChosenIdGenerator(IdGenerator):
    """Random ids, except inside `chosen_ids`, which names the next span's ids."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        chosen = _chosen.get()
        return chosen[1] if chosen else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen = _chosen.get()
        return chosen[0] if chosen else self._random.generate_trace_id()


@contextmanager
def chosen_ids(trace_id: int, span_id: int) -> Iterator[None]:
    token = _chosen.set((trace_id, span_id))
    try:
        yield
    finally:
        _chosen.reset(token)


def _derived_id(bits: int, *parts: str) -> int:
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return int.from_bytes(digest[: bits // 8], "big") or 1


# --- the chain's invoke_agent span ----------------------------------------------------------


@dataclass(frozen=True)
class ChainSpan:
    """The `invoke_agent` span of a continue-as-new chain, known before it is emitted."""

    trace_id: int
    span_id: int
    parent: dict[str, str] | None  # W3C carrier of the span that started the chain, if any
    start_ns: int

    @staticmethod
    def first(workflow_id: str, first_run_id: str, parent: dict[str, str] | None, start_ns: int) -> ChainSpan:
        parent_span = otel.get_current_span(_propagator().extract(parent or {})).get_span_context()
        trace_id = parent_span.trace_id if parent_span.is_valid else _derived_id(128, workflow_id, first_run_id)
        return ChainSpan(trace_id, _derived_id(64, genai.INVOKE_AGENT, workflow_id, first_run_id), parent, start_ns)

    def context_carrier(self) -> dict[str, str]:
        """The span as a W3C carrier: what workflow code runs under."""
        span_context = otel.SpanContext(
            self.trace_id, self.span_id, is_remote=True, trace_flags=otel.TraceFlags(otel.TraceFlags.SAMPLED)
        )
        carrier: dict[str, str] = {}
        _propagator().inject(carrier, otel.set_span_in_context(otel.NonRecordingSpan(span_context)))
        return carrier

    def to_header(self) -> dict[str, Any]:
        return {"trace_id": f"{self.trace_id:032x}", "span_id": f"{self.span_id:016x}", "parent": self.parent,
                "start_ns": self.start_ns}  # fmt: skip

    @staticmethod
    def from_header(value: dict[str, Any]) -> ChainSpan:
        return ChainSpan(int(value["trace_id"], 16), int(value["span_id"], 16), value.get("parent"), value["start_ns"])


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def chain_span(info: workflow.Info) -> ChainSpan:
    """The run's chain span, from its headers: as the live worker and a replay both see it."""
    converter = PayloadConverter.default
    header = info.headers.get(CHAIN_HEADER)
    if header is not None:
        return ChainSpan.from_header(converter.from_payloads([header])[0])
    traced = info.headers.get(TRACE_HEADER)
    parent = converter.from_payloads([traced])[0] if traced is not None else None
    first_run = info.first_execution_run_id or info.run_id
    # When the run was started, as its history says: not its first task's start, which a task
    # the server dropped and ran again would move after the Temporal spans the run holds.
    # Integer arithmetic: a float of the nanoseconds lands a few ns off, after the run's own span.
    start_ns = (info.workflow_start_time - EPOCH) // timedelta(microseconds=1) * 1000
    return ChainSpan.first(info.workflow_id, first_run, parent or None, start_ns)


def emit_invoke_agent(
    tracer: otel.Tracer, chain: ChainSpan, end_ns: int, attributes: genai.Attributes, failed: bool
) -> None:
    """Emit the chain's span with its derived ids: live when the chain closes, or from history."""
    parent: Context = _propagator().extract(chain.parent or {})
    with chosen_ids(chain.trace_id, chain.span_id):
        span = tracer.start_span(
            genai.INVOKE_AGENT, parent, kind=otel.SpanKind.INTERNAL, attributes=attributes, start_time=chain.start_ns
        )
    if failed:
        span.set_status(otel.Status(otel.StatusCode.ERROR))
    span.end(end_time=end_ns)


def _propagator() -> Any:
    from temporalio.contrib.opentelemetry._interceptor import default_text_map_propagator

    return default_text_map_propagator


# --- interceptors --------------------------------------------------------------------------


class AgentTracing(TracingInterceptor):
    """Temporal's tracing with the run's `invoke_agent` span, plus GenAI activity spans.

    Register on the client (`Client.connect(interceptors=[...])`): the client's workers
    then use it too.
    """

    def __init__(self, provider: TracerProvider) -> None:
        super().__init__(provider.get_tracer(TRACER_NAME))
        self.provider = provider

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)
        input.unsafe_extern_functions["__durable_agent_invoke_agent"] = self._emit_invoke_agent
        return _AgentWorkflowInbound

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return super().intercept_activity(_GenAiActivityInbound(next, self.tracer))

    def _emit_invoke_agent(self, chain: ChainSpan, end_ns: int, attributes: genai.Attributes, failed: bool) -> None:
        emit_invoke_agent(self.tracer, chain, end_ns, attributes, failed)


class _AgentWorkflowInbound(TracingWorkflowInboundInterceptor):
    """Runs an agent's workflow code under the chain's `invoke_agent` span and emits it at
    the close. Other workflow types on the worker are traced as Temporal traces them."""

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_ChainOutbound(outbound, self))

    @staticmethod
    def is_agent() -> bool:
        return workflow.info().workflow_type == WORKFLOW_TYPE

    def chain(self) -> ChainSpan:
        return chain_span(workflow.info())

    def _load_workflow_context_carrier(self) -> dict[str, Any] | None:
        if not self.is_agent():
            return super()._load_workflow_context_carrier()
        if not self._workflow_context_carrier:
            self._workflow_context_carrier = self.chain().context_carrier()
        return self._workflow_context_carrier

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        if not self.is_agent():
            return await super().execute_workflow(input)
        try:
            result = await super().execute_workflow(input)
        except workflow.ContinueAsNewError:
            raise
        except FailureError as e:  # the run closes as failed (e.g. an invalid input)
            self._close_chain(None, genai.error_type(e))
            raise
        self._close_chain(result, None)
        return result

    def _close_chain(self, result: Any, error: str | None) -> None:
        if workflow.unsafe.is_replaying():
            return
        info = workflow.info()
        emit = workflow.extern_functions()["__durable_agent_invoke_agent"]
        emit(
            self.chain(),
            workflow.time_ns(),
            genai.invoke_agent_attributes(info.workflow_id, result, error),
            error is not None,
        )


class _ChainOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, root: _AgentWorkflowInbound) -> None:
        super().__init__(next)
        self._root = root

    def continue_as_new(self, input: ContinueAsNewInput) -> NoReturn:
        if self._root.is_agent():
            header = PayloadConverter.default.to_payloads([self._root.chain().to_header()])[0]
            input.headers = {**input.headers, CHAIN_HEADER: header}
        super().continue_as_new(input)


class _GenAiActivityInbound(ActivityInboundInterceptor):
    """`chat` and `execute_tool` spans around the activities, inside Temporal's RunActivity."""

    def __init__(self, next: ActivityInboundInterceptor, tracer: otel.Tracer) -> None:
        super().__init__(next)
        self._tracer = tracer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        name = activity.info().activity_type
        request = input.args[0] if input.args else None
        if name == "call_model" and isinstance(request, ModelCallInput):
            return await self._chat(input, request)
        if isinstance(request, ToolCallInput):
            return await self._tool(input, name, request)
        return await super().execute_activity(input)

    async def _chat(self, input: ExecuteActivityInput, request: ModelCallInput) -> Any:
        with self._tracer.start_as_current_span(
            genai.chat_span_name(request.model), kind=otel.SpanKind.CLIENT, record_exception=False
        ) as span:
            try:
                reply = await super().execute_activity(input)
            except BaseException as e:
                span.set_attributes(genai.chat_attributes(request, None, genai.error_type(e)))
                span.set_status(otel.Status(otel.StatusCode.ERROR, str(e)[:200]))
                raise
            span.set_attributes(genai.chat_attributes(request, reply if isinstance(reply, ModelReply) else None, None))
            return reply

    async def _tool(self, input: ExecuteActivityInput, name: str, request: ToolCallInput) -> Any:
        with self._tracer.start_as_current_span(genai.tool_span_name(name), record_exception=False) as span:
            try:
                outcome = await super().execute_activity(input)
            except BaseException as e:
                span.set_attributes(genai.tool_attributes(name, request, None, genai.error_type(e)))
                span.set_status(otel.Status(otel.StatusCode.ERROR, str(e)[:200]))
                raise
            done = outcome if isinstance(outcome, ToolOutcome) else None
            span.set_attributes(genai.tool_attributes(name, request, done, None))
        self._riders(span, request, done)
        return outcome

    def _riders(self, command: ReadableSpan, request: ToolCallInput, outcome: ToolOutcome | None) -> None:
        """A span per file call that ran inside the command's activity, beside the command's
        span and timed as it (the activity reports no time of its own for each)."""
        for tool, call, done in genai.riders(request, outcome):
            self._tracer.start_span(
                genai.tool_span_name(tool),
                kind=otel.SpanKind.INTERNAL,
                attributes=genai.tool_attributes(tool, call, done, None),
                start_time=command.start_time,
            ).end(end_time=command.end_time)


def client_interceptors() -> list[Interceptor | Any]:
    """What `connect` registers: Temporal's tracing when the environment configures it."""
    tracing = configured()
    return [tracing] if tracing is not None else []
