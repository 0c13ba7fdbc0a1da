"""Traces: one trace per run, GenAI spans with the right parents and attributes, no span
emitted twice when workflows replay, one trace across continue-as-new."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from temporalio import workflow
from temporalio.client import Client

from durable_agent.connection import connect
from durable_agent.genai import CAPTURE_CONTENT_ENV, chat_attributes, tool_attributes
from durable_agent.history import emit_spans, replay_chain
from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer
from durable_agent.telemetry import AgentTracing, tracer_provider
from tests.helpers import chain_tasks_run_again, counted, start, tasks_run_again
from tests.scripts import Script, tools
from tests.test_metrics import fails_once
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import (
    WORKFLOW_TYPE,
    AgentInput,
    AgentResult,
    ModelCallInput,
    ModelReply,
    ToolCallInput,
    ToolOutcome,
)

GENAI_KINDS = ("invoke_agent", "chat", "execute_tool")


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def traced_client(temporal_server: EmbeddedServer, exporter: InMemorySpanExporter) -> AsyncIterator[Client]:
    tracing = AgentTracing(tracer_provider([exporter], batch=False))
    yield await connect(temporal_server.address, interceptors=[tracing])
    tracing.provider.shutdown()


def spans_of(exporter: InMemorySpanExporter, workflow_id: str, again: int = 0) -> list[ReadableSpan]:
    """Every span of the trace whose invoke_agent span names this run. The closing workflow
    task emits invoke_agent; one the server dropped (`again`, tests/helpers.py) emits the
    same span again: same ids, derived from the run."""
    finished = exporter.get_finished_spans()
    runs = [s for s in finished if s.name == "invoke_agent" and s.attributes["gen_ai.agent.id"] == workflow_id]
    counted("invoke_agent", len(runs), 1, again)
    assert len({s.context.span_id for s in runs}) == 1, [s.context for s in runs]
    return [s for s in finished if s.context.trace_id == runs[0].context.trace_id]


def one_per_call(spans: list[ReadableSpan], again: int) -> list[ReadableSpan]:
    """The spans with one execute_tool span per call: a workflow task the server dropped ran
    its local activities (the file tools), and its next attempt runs them again under the
    same call id. Exact when no task was dropped."""
    if not again:
        return spans
    return list({s.attributes.get("gen_ai.tool.call.id") or s.context.span_id: s for s in spans}.values())


def genai_parent(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> ReadableSpan | None:
    """The nearest ancestor that is a GenAI span (Temporal's own spans lie in between)."""
    parent = by_id.get(span.parent.span_id) if span.parent else None
    while parent is not None and not parent.name.startswith(GENAI_KINDS):
        parent = by_id.get(parent.parent.span_id) if parent.parent else None
    return parent


def two_tool_steps() -> Script:
    return Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "hi\n"}), ("list_files", {}), input_tokens=100),
            # b.txt is written inside the command's activity, before it: a span of its own all the same
            tools(
                ("write_file", {"path": "b.txt", "content": "b"}),
                ("run_command", {"command": "cat a.txt b.txt"}),
                input_tokens=200,
            ),
        ],
        final="all done",
    )


async def test_a_run_is_one_trace_of_genai_spans_under_its_invoke_agent_span(
    traced_client: Client, exporter: InMemorySpanExporter, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = two_tool_steps()
    async with build_worker(traced_client, task_queue):
        handle = await start(traced_client, task_queue, goal="write and read", workspace=str(workspace))
        result = await handle.result()
    assert result.state == "completed"
    again = await tasks_run_again(handle)
    spans = spans_of(exporter, handle.id, again)
    by_id = {s.context.span_id: s for s in spans}
    run = by_id[next(s for s in spans if s.name == "invoke_agent").context.span_id]  # one of copies alike
    # The client's StartWorkflow span is the run's parent: the trace began where it was started.
    assert by_id[run.parent.span_id].name == "StartWorkflow:AgentWorkflow"
    assert run.attributes["durable_agent.state"] == "completed"
    assert run.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens
    assert run.end_time > run.start_time

    chats = [s for s in spans if s.name.startswith("chat ")]
    assert [s.name for s in chats] == ["chat gpt-4.1-mini"] * 3
    assert all(genai_parent(s, by_id) is run for s in chats)
    assert by_id[chats[0].parent.span_id].name == "RunActivity:call_model"
    first = min(chats, key=lambda s: s.start_time)
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.provider.name"] == "openai"
    assert first.attributes["gen_ai.request.model"] == "gpt-4.1-mini"
    assert first.attributes["gen_ai.usage.input_tokens"] == 100
    assert "error.type" not in first.attributes
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in chats) == result.usage.output_tokens

    tool_spans = sorted(
        one_per_call([s for s in spans if s.name.startswith("execute_tool ")], again), key=lambda s: s.start_time
    )
    assert sorted(s.name for s in tool_spans) == [
        "execute_tool list_files",
        "execute_tool run_command",
        "execute_tool write_file",
        "execute_tool write_file",
    ]
    assert all(genai_parent(s, by_id) is run for s in tool_spans)
    assert all(s.attributes["durable_agent.tool.outcome"] == "ok" for s in tool_spans)
    assert len({s.attributes["gen_ai.tool.call.id"] for s in tool_spans}) == 4
    # No message content unless opted in.
    assert not any("gen_ai.input.messages" in s.attributes for s in chats)


async def test_no_span_is_emitted_twice_when_every_workflow_task_is_a_replay(
    traced_client: Client, exporter: InMemorySpanExporter, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = two_tool_steps()
    async with build_worker(traced_client, task_queue, max_cached_workflows=0):
        handle = await start(traced_client, task_queue, goal="write and read", workspace=str(workspace))
        assert (await handle.result()).state == "completed"
    again = await tasks_run_again(handle)  # each emits its workflow spans again
    spans = spans_of(exporter, handle.id, again)
    counts = Counter(s.name for s in spans)
    for name, expected in (
        ("RunWorkflow:AgentWorkflow", 1),
        ("CompleteWorkflow:AgentWorkflow", 1),
        ("StartActivity:call_model", 3),
    ):
        counted(name, counts[name], expected, again)
    assert counts["chat gpt-4.1-mini"] == 3
    assert counts["execute_tool run_command"] == 1 and counts["execute_tool write_file"] == 2
    ids = Counter(s.context.span_id for s in spans)
    assert max(ids.values()) <= 1 + again


async def test_a_run_that_continues_as_new_stays_one_trace_under_one_invoke_agent_span(
    traced_client: Client, exporter: InMemorySpanExporter, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    steps = 12
    model_server.responder = Script(
        [tools(("write_file", {"path": f"{n}.txt", "content": "x"})) for n in range(steps)], final="done"
    )
    async with build_worker(traced_client, task_queue):
        handle = await start(
            traced_client, task_queue, goal="many steps", workspace=str(workspace), continue_as_new_every=10
        )
        result = await handle.result()
    assert result.steps == steps + 1
    again = await chain_tasks_run_again(traced_client, handle.id)
    spans = spans_of(exporter, handle.id, again)
    by_id = {s.context.span_id: s for s in spans}
    run = by_id[next(s for s in spans if s.name == "invoke_agent").context.span_id]
    counts = Counter(s.name for s in spans)
    counted("RunWorkflow:AgentWorkflow", counts["RunWorkflow:AgentWorkflow"], 2, again)  # two runs, one trace
    assert counts["chat gpt-4.1-mini"] == steps + 1
    assert all(genai_parent(s, by_id) is run for s in spans if s.name.startswith(("chat", "execute_tool")))
    assert run.attributes["durable_agent.steps"] == steps + 1
    first_run_start = min(s.start_time for s in spans if s.name == "RunWorkflow:AgentWorkflow")
    assert run.start_time <= first_run_start


def test_nothing_is_set_up_without_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_agent import telemetry

    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert telemetry.span_exporters_from_env() == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert [type(e).__name__ for e in telemetry.span_exporters_from_env()] == ["OTLPSpanExporter"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,none")
    assert [type(e).__name__ for e in telemetry.span_exporters_from_env()] == ["ConsoleSpanExporter"]
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry.span_exporters_from_env() == []
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(telemetry.TelemetryError, match="not supported"):
        telemetry.span_exporters_from_env()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(telemetry.TelemetryError, match="use http/protobuf"):
        telemetry.span_exporters_from_env()


def test_message_content_only_on_opt_in_and_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cret-value-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    request = ModelCallInput(messages=[{"role": "user", "content": f"key {secret}"}], tools=[], model="m")
    reply = ModelReply(content=f"the key is {secret}", model="m", input_tokens=3, output_tokens=4)
    call = ToolCallInput(call_id="c1", idempotency_key="k", workspace="/w", arguments={"command": f"echo {secret}"})
    outcome = ToolOutcome(ok=True, output=f"{secret}\n")
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    assert "gen_ai.input.messages" not in chat_attributes(request, reply, None)
    assert "gen_ai.tool.call.arguments" not in tool_attributes("run_command", call, outcome, None)
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    captured = {**chat_attributes(request, reply, None), **tool_attributes("run_command", call, outcome, None)}
    for key in (
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    ):
        assert "[REDACTED:OPENAI_API_KEY]" in captured[key] and secret not in captured[key]


async def test_trace_from_history_yields_the_live_runs_span_tree(
    traced_client: Client, exporter: InMemorySpanExporter, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = two_tool_steps()
    async with build_worker(traced_client, task_queue):
        handle = await start(traced_client, task_queue, goal="write and read", workspace=str(workspace))
        await handle.result()
    dropped = await tasks_run_again(handle)
    live = spans_of(exporter, handle.id, dropped)

    replayed = InMemorySpanExporter()
    provider = tracer_provider([replayed], batch=False)
    chain = await replay_chain(traced_client, handle.id)  # the worker is gone: history only
    assert emit_spans(chain, provider.get_tracer("test")) == 8  # 3 chat, 4 execute_tool, invoke_agent
    provider.shutdown()
    again = replayed.get_finished_spans()

    def tree(spans: list[ReadableSpan]) -> list[tuple[object, ...]]:
        by_id = {s.context.span_id: s for s in spans}
        shown = [s for s in spans if s.name.startswith(GENAI_KINDS)]
        keys = ("gen_ai.request.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
        keys += ("gen_ai.tool.name", "gen_ai.tool.call.id", "durable_agent.tool.outcome", "durable_agent.state")
        return sorted(
            (
                s.name,
                s.context.trace_id,
                getattr(genai_parent(s, by_id), "name", None),
                tuple(s.attributes.get(k) for k in keys),
            )
            for s in shown
        )

    if dropped:  # the live run emitted a dropped task's spans twice; history holds them once
        assert tree(again) == sorted(set(tree(live)))
    else:
        assert tree(again) == tree(live)
    # The copy the recorded closing task emitted: a dropped one's copy ended earlier.
    live_run = max((s for s in live if s.name == "invoke_agent"), key=lambda s: s.end_time)
    run = next(s for s in again if s.name == "invoke_agent")
    # The same span: same ids, same parent (the client's StartWorkflow span), same start and end.
    assert (run.context, run.parent, run.start_time, run.end_time) == (
        live_run.context,
        live_run.parent,
        live_run.start_time,
        live_run.end_time,
    )


async def test_each_attempt_of_a_model_call_is_a_chat_span_and_a_failed_one_says_why(
    traced_client: Client, exporter: InMemorySpanExporter, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([fails_once(tools(("list_files", {})))], final="listed")
    async with build_worker(traced_client, task_queue):
        handle = await start(traced_client, task_queue, goal="list", workspace=str(workspace))
        assert (await handle.result()).state == "completed"
    chats = sorted((s for s in spans_of(exporter, handle.id) if s.name.startswith("chat ")), key=lambda s: s.start_time)
    assert [s.attributes.get("error.type") for s in chats] == ["ModelHttp500", None, None]
    assert chats[0].status.status_code is StatusCode.ERROR


@workflow.defn(name="ParentOfAgent")
class ParentOfAgent:
    """Starts an agent as a child workflow, as a parent agent's `delegate` does."""

    @workflow.run
    async def run(self, agent: AgentInput) -> str:
        result = await workflow.execute_child_workflow(WORKFLOW_TYPE, agent, result_type=AgentResult)
        return result.output


async def test_a_child_run_is_in_its_parents_trace(
    traced_client: Client, exporter: InMemorySpanExporter, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("list_files", {}))], final="child done")
    child_input = AgentInput(goal="the child's goal", workspace=str(workspace))
    async with build_worker(traced_client, task_queue, workflows=[AgentWorkflow, ParentOfAgent]):
        parent = await traced_client.start_workflow(
            ParentOfAgent.run, child_input, id=f"parent-{task_queue}", task_queue=task_queue
        )
        assert await parent.result() == "child done"
    finished = exporter.get_finished_spans()
    parent_run = next(
        s for s in finished if s.name == "RunWorkflow:ParentOfAgent" and s.attributes["temporalWorkflowID"] == parent.id
    )
    child_run = next(
        s for s in finished if s.name == "invoke_agent" and s.context.trace_id == parent_run.context.trace_id
    )
    by_id = {s.context.span_id: s for s in finished}
    child_run = by_id[child_run.context.span_id]  # one of a dropped task's copies, all alike
    assert by_id[child_run.parent.span_id].name == "StartChildWorkflow:AgentWorkflow"
    again = await tasks_run_again(traced_client.get_workflow_handle(child_run.attributes["gen_ai.agent.id"]))
    child_spans = [s for s in finished if s.context.trace_id == child_run.context.trace_id]
    genai = [s for s in child_spans if s.name.startswith(GENAI_KINDS) and genai_parent(s, by_id) is child_run]
    under_child = [s.name for s in one_per_call(genai, again)]
    assert sorted(under_child) == [
        "chat gpt-4.1-mini",
        "chat gpt-4.1-mini",
        "execute_tool list_files",
    ]
