"""Traces from real worker subprocesses over OTLP/HTTP: a SIGKILLed worker and its
replacement emit each span of a run once, in one trace."""

from __future__ import annotations

import gzip
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from temporalio.client import Client

from durable_agent.model_server import ModelServer
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import counted, start, tasks_run_again, until
from tests.scripts import Script, tools
from tests.test_crash import SlowTurn, worker_env


class Collector:
    """An OTLP/HTTP trace receiver on loopback: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector()
    yield running
    running.close()


def attribute(span: Span, key: str) -> str | int | None:
    for item in span.attributes:
        if item.key == key:
            value = item.value
            return value.string_value if value.HasField("string_value") else value.int_value
    return None


async def test_a_killed_worker_and_its_replacement_emit_each_span_once(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
    collector: Collector,
) -> None:
    slow = SlowTurn(tools(("write_file", {"path": "b.txt", "content": "b"})), delay_s=120)
    model_server.responder = Script(
        [tools(("write_file", {"path": "a.txt", "content": "a"}), ("list_files", {})), slow], final="done"
    )
    env = {
        **worker_env(temporal_server, model_server, task_queue),
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans leave a worker soon after they end
    }
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(client, task_queue, goal="crash me", workspace=str(workspace))
        await until(slow.asked.is_set)  # step 2's model call is in flight
        # Step 1's spans, and the span of step 2's model call, have reached the collector before the kill.
        await until(lambda: sum(s.name.startswith("execute_tool") for s in collector.spans) == 2, within_s=30)
        await until(lambda: sum(s.name == "StartActivity:call_model" for s in collector.spans) == 2, within_s=30)
        kill_hard(worker)
        slow.release()
        worker = spawn_worker(env, tmp_path / "w1.log")
        result = await handle.result()
    finally:
        stop_gently(worker)  # the replacement flushes its last spans as it stops
    assert result.state == "completed" and result.steps == 3

    await until(lambda: any(s.name == "invoke_agent" for s in collector.spans), within_s=30)
    # Exact, but for what a workflow task the server dropped emitted twice (tests/helpers.py).
    again = await tasks_run_again(handle)
    runs = [s for s in collector.spans if s.name == "invoke_agent"]
    counted("invoke_agent", len(runs), 1, again)
    assert {attribute(s, "gen_ai.agent.id") for s in runs} == {handle.id}
    trace = [s for s in collector.spans if s.trace_id == runs[0].trace_id]
    counts = Counter(s.name for s in trace)
    counted("RunWorkflow:AgentWorkflow", counts["RunWorkflow:AgentWorkflow"], 1, again)  # the replacement replayed
    assert counts["chat gpt-4.1-mini"] == 3  # the killed attempt never ended, so never left
    counted("StartActivity:call_model", counts["StartActivity:call_model"], 3, again)
    tool_spans = [(s.name, attribute(s, "gen_ai.tool.call.id")) for s in trace if s.name.startswith("execute_tool")]
    assert Counter(name for name, _ in set(tool_spans)) == {"execute_tool write_file": 2, "execute_tool list_files": 1}
    assert max(Counter(tool_spans).values()) <= 1 + again
    assert max(Counter(s.span_id for s in trace).values()) <= 1 + again
    assert len(model_server.requests) == 4  # three steps, one of them asked twice
