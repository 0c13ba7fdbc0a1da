"""`durable-agent export` and `trace` read a closed run's histories: no worker, no query."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import Client

from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer
from tests.helpers import start, wait_for
from tests.scripts import Script, tools
from tests.test_cli import cli_env, durable_agent
from tests.test_command_line import listed_until
from worker import build_worker
from workflows.types import Message, TranscriptRequest


async def test_export_of_a_closed_continued_as_new_run_needs_no_worker(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    writes = [tools(("write_file", {"path": f"{n}.txt", "content": f"{n}\n"})) for n in range(1, 12)]
    gated = tools(("run_command", {"command": "cat 11.txt"}))
    model_server.responder = Script([*writes, gated], final="eleven files written and checked")
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="write eleven files",
            workspace=str(workspace),
            continue_as_new_every=10,
            approval={"tools": ["run_command"]},
        )
        status = await wait_for(handle, lambda s: bool(s.pending_approvals))
        await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
        result = await handle.result()
        live = await handle.query("transcript", TranscriptRequest(), result_type=list[Message])
    assert result.state == "completed" and result.steps == 13
    runs = [run async for run in client.list_workflows(f'WorkflowId="{handle.id}"')]
    assert len(runs) == 2  # continued as new once

    # No worker polls the queue now: a query would time out; export reads history.
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    # `list` shows the chain once, as its latest run.
    row = await listed_until(lambda line: line.split()[:2] == [handle.id, "completed"], env)
    assert row.split()[2] == "13", row
    listed = (await durable_agent("list", env=env)).stdout.splitlines()
    assert [line.split()[0] for line in listed].count(handle.id) == 1, listed
    exported = await durable_agent("export", handle.id, env=env)
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    messages = [Message.model_validate_json(line) for line in exported.stdout.splitlines()]
    assert messages == live

    report_file = workspace / "report.md"
    report = await durable_agent("export", handle.id, "--format", "markdown", "-o", str(report_file), env=env)
    assert report.returncode == 0, report
    text = report_file.read_text()
    assert text.startswith(f"# Run {handle.id}\n")
    assert "**Goal:** write eleven files" in text
    assert "**State:** completed (final_answer) after 13 steps" in text
    assert f"| {result.usage.input_tokens:,} | {result.usage.output_tokens:,} | 13 | 12 |" in text
    assert "### Step 1\n" in text and "### Step 12\n" in text
    assert "- `write_file: 11.txt` → wrote" in text
    assert "- `run_command: cat 11.txt` →\n  ```\n  exit code: 0\n  11\n  ```\n" in text  # its lines kept
    assert f"- step 12: approved tool call {status.pending_approvals[0].call_id}" in text
    assert "eleven files written and checked" in text.split("## Result", 1)[1]


async def test_trace_re_emits_a_closed_runs_spans_from_history(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("write_file", {"path": "a.txt", "content": "a"}), ("list_files", {}))])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="write a", workspace=str(workspace))
        await handle.result()
    env = cli_env(OTEL_TRACES_EXPORTER="console")
    traced = await durable_agent("trace", handle.id, env=env)
    assert traced.returncode == 0, traced
    assert f"emitted 5 spans of {handle.id}" in traced.stderr
    spans = console_spans(traced.stdout)
    assert sorted(s["name"] for s in spans) == [
        "chat gpt-4.1-mini",
        "chat gpt-4.1-mini",
        "execute_tool list_files",
        "execute_tool write_file",
        "invoke_agent",
    ]
    run = next(s for s in spans if s["name"] == "invoke_agent")
    assert run["parent_id"] is None and run["attributes"]["gen_ai.agent.id"] == handle.id
    assert all(s["parent_id"] == run["context"]["span_id"] for s in spans if s is not run)
    assert {s["context"]["trace_id"] for s in spans} == {run["context"]["trace_id"]}

    missing = await durable_agent(
        "trace", handle.id, env=cli_env(OTEL_TRACES_EXPORTER=None, OTEL_EXPORTER_OTLP_ENDPOINT=None)
    )
    assert missing.returncode == 2 and "no trace exporter" in missing.stderr


def console_spans(text: str) -> list[dict]:
    """The JSON objects the console exporter printed, one after another."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, at)
        spans.append(span)
    return spans


async def test_export_of_a_running_run_reads_its_queries(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": "echo hi"}))], final="said hi")
    async with build_worker(client, task_queue):
        handle = await start(
            client, task_queue, goal="say hi", workspace=str(workspace), approval={"tools": ["run_command"]}
        )
        await wait_for(handle, lambda s: bool(s.pending_approvals))
        report = await durable_agent("export", handle.id, "--format", "markdown", env=cli_env())
        await handle.cancel()
    assert report.returncode == 0, report
    assert "**Goal:** say hi" in report.stdout
    assert "**State:** awaiting_approval" in report.stdout
    assert "- `run_command: echo hi` → (no result recorded)" in report.stdout
    assert "(the run is still running: its decisions are listed once it has closed)" in report.stdout
