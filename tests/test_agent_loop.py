"""The agent loop end to end: real dev server, real worker, real HTTP through the openai SDK."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor, Worker

from durable_agent.model_server import ModelServer
from durable_agent.runs import chain_histories
from tests.helpers import cli_start_agent, run_cli, start
from tests.scripts import Script, answer, tool_results, tools
from tests.test_replay import replayer
from worker import build_worker
from workflows.compaction import run_folder
from workflows.options import RIDING_MAX_CHARS
from workflows.types import AgentInput, AgentResult, AgentStatus, Message, ToolCallInput


async def test_multi_step_run_with_parallel_tools(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # Each command waits for the other to have started: they end only if they overlapped
    # (run one after the other, the first times out).
    meet = "touch {0}.ready; until [ -e {1}.ready ]; do sleep 0.05; done; echo met"
    usage = {"input_tokens": 1_000, "output_tokens": 100}
    model_server.responder = Script(
        [
            tools(
                ("write_file", {"path": "a.txt", "content": "alpha\n"}),
                ("write_file", {"path": "b/c.txt", "content": "gamma\n"}),
                **usage,
            ),
            tools(
                ("run_command", {"command": meet.format("one", "two"), "timeout_s": 30}),
                ("run_command", {"command": meet.format("two", "one"), "timeout_s": 30}),
                **usage,
            ),
            tools(
                ("list_files", {}),
                ("read_file", {"path": "a.txt"}),
                ("run_command", {"command": "cat a.txt b/c.txt | wc -l"}),
                **usage,
            ),
            answer("two files written", **usage),
        ]
    )
    handle = await start(client, task_queue, goal="write two files", workspace=str(workspace))
    result = await handle.result()

    assert result.state == "completed" and result.stop_reason == "final_answer"
    assert result.output == "two files written"
    assert result.steps == 4
    assert result.usage.model_calls == 4 and result.usage.tool_calls == 7
    # The stub's figures, at gpt-4.1-mini's price ($0.40 / $1.60 per million).
    assert (result.usage.input_tokens, result.usage.output_tokens) == (4_000, 400)
    assert result.usage.cost_usd == pytest.approx(4_000 * 0.40e-6 + 400 * 1.60e-6)
    met = tool_results(model_server.requests[2])[-2:]
    assert met == ["exit code: 0\nmet\n"] * 2, met
    assert (workspace / "b" / "c.txt").read_text() == "gamma\n"
    # The third call saw the three results of the second step, in the order asked for.
    third = model_server.requests[-1]
    listing, content, count = tool_results(third)[-3:]
    assert "a.txt" in listing and "b/c.txt" in listing
    assert "alpha" in content
    assert "2" in count
    assert third["tools"] and {t["function"]["name"] for t in third["tools"]} >= {"read_file", "run_command"}
    transcript = await handle.query("transcript", result_type=list[Message])
    results = [m for m in transcript if m.role == "tool"]
    assert {m.kind for m in results} == {"tool_result"}
    assert [m.tool_name for m in results] == [
        *["write_file", "write_file", "run_command", "run_command"],
        *["list_files", "read_file", "run_command"],
    ]


async def test_history_holds_no_transcript_copy(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    big = "x" * 20_000
    model_server.responder = Script(
        [tools(("write_file", {"path": f"f{i}.txt", "content": big})) for i in range(6)] + [answer("ok")]
    )
    handle = await start(client, task_queue, goal="write files", workspace=str(workspace))
    await handle.result()
    history = await handle.fetch_history()
    calls = [e for e in history.events if e.activity_task_scheduled_event_attributes.activity_type.name == "call_model"]
    replies = [e.ByteSize() for e in history.events if e.HasField("activity_task_completed_event_attributes")]
    # Each call_model records a reference to its context, not the context (up to 120 KB,
    # which the model did receive); its reply (one 20 KB tool call) is recorded once.
    assert len(calls) == 7 and max(e.ByteSize() for e in calls) < 1_000
    assert len(model_server.requests) == 7 and len(json.dumps(model_server.requests[-1])) > 6 * 20_000
    assert len([r for r in replies if r > 20_000]) == 6 and max(replies) < 22_000
    # write_file's input (a local activity) never enters history either: its record is the
    # short outcome.
    markers = [e.ByteSize() for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert max(markers) < 2_000
    # So each 20 KB text is in history once, in the model's reply: a transcript re-sent with
    # every call would add 20 + 40 + ... + 120 KB.
    assert sum(e.ByteSize() for e in history.events) < 6 * 20_000 + 30_000


async def test_bad_tool_calls_become_tool_errors_and_the_run_goes_on(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    outside = workspace.parent / "outside.txt"
    outside.write_text("secret")
    (workspace / "link").symlink_to(outside)
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    model_server.responder = Script(
        [
            tools(
                ("read_file", "{not json"),
                ("no_such_tool", {"x": 1}),
                ("read_file", {}),
                ("read_file", {"path": "../outside.txt"}),
                ("read_file", {"path": str(outside)}),
                ("read_file", {"path": "link"}),
                ("read_file", {"path": "missing.txt"}),
                ("read_file", {"path": "blob.bin"}),
                ("run_command", {"command": "sleep 30", "timeout_s": 1}),
                ("run_command", {"command": "head -c 3000000 /dev/zero | tr '\\0' 'y'"}),
            ),
            answer("handled"),
        ]
    )
    handle = await start(client, task_queue, goal="poke at things", workspace=str(workspace))
    result = await handle.result()
    assert result.state == "completed" and result.output == "handled"
    errors = tool_results(model_server.requests[-1])
    assert len(errors) == 10
    bad_json, unknown, missing_arg, dotdot, absolute, symlink, missing, binary, timeout, huge = errors
    assert "not valid JSON" in bad_json
    assert "unknown tool 'no_such_tool'" in unknown
    assert "path" in missing_arg and "required" in missing_arg.lower()
    for escaped in (dotdot, absolute, symlink):
        assert escaped.startswith("ERROR") and "workspace" in escaped and "secret" not in escaped
    assert missing.startswith("ERROR") and "missing.txt" in missing
    assert binary.startswith("ERROR") and "binary" in binary.lower()
    assert timeout.startswith("ERROR") and "timed out" in timeout.lower()
    assert len(huge) < 20_000 and ".durable-agent/outputs/" in huge


async def test_python_client_rejects_bad_input_before_a_run_exists() -> None:
    # A name beyond the built-ins is resolved by the workers at the run's start (tests/test_user_tools.py);
    # one that cannot be a tool's name is refused before the run exists.
    with pytest.raises(ValueError, match="tool name 'tele port'"):
        AgentInput.model_validate({"goal": "x", "workspace": "/tmp", "tools": ["read_file", "tele port"]})
    with pytest.raises(ValueError, match="hard_steps"):
        AgentInput.model_validate({"goal": "x", "workspace": "/tmp", "limits": {"soft_steps": 9, "hard_steps": 3}})


async def test_bad_input_from_the_cli_closes_the_run_with_a_clear_error(
    client: Client, worker: Worker, task_queue: str, temporal_server
) -> None:
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    bad = {"goal": "x", "workspace": "relative/path", "limit": {}}
    started = await cli_start_agent(temporal_server.address, task_queue, run_id, bad)
    assert started.returncode == 0, started.stderr
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=30)
    message = str(failure.value.cause)
    assert "invalid AgentInput" in message and "workspace" in message and "limit" in message


async def test_started_from_the_temporal_cli_exactly_as_documented(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path, temporal_server
) -> None:
    model_server.responder = Script(
        [tools(("write_file", {"path": "hello.txt", "content": "hi"})), answer("wrote hello")]
    )
    run_id = f"cli-{uuid.uuid4().hex[:8]}"
    # Exactly the README's `temporal workflow start` command, plus the test's own task queue and id.
    started = await cli_start_agent(
        temporal_server.address, task_queue, run_id, {"goal": "say hi", "workspace": str(workspace)}
    )
    assert started.returncode == 0, started.stderr
    result = await client.get_workflow_handle(run_id, result_type=AgentResult).result()
    assert result.state == "completed" and (workspace / "hello.txt").read_text() == "hi"
    queried = await run_cli(
        temporal_server.address,
        "workflow",
        "query",
        "--workflow-id",
        run_id,
        "--name",
        "transcript",
        "--input",
        '{"from_step": 1}',
        "-o",
        "json",
    )
    assert queried.returncode == 0, queried.stderr
    assert "wrote hello" in queried.stdout
    # Started with the server's 10 s task timeout, the run went on with 1.5 s before its
    # first step: a worker killed mid-task then costs 1.5 s, however the run was started.
    first, second = await chain_histories(client, run_id)
    assert first.events[0].workflow_execution_started_event_attributes.workflow_task_timeout.seconds == 10
    assert not any(e.HasField("activity_task_scheduled_event_attributes") for e in first.events)
    assert second.events[0].workflow_execution_started_event_attributes.workflow_task_timeout.ToMilliseconds() == 1500
    for history in (first, second):
        assert (await replayer().replay_workflow(history)).replay_failure is None


async def test_status_and_transcript_queries(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("list_files", {})), answer("listed")])
    handle = await start(client, task_queue, goal="list", workspace=str(workspace))
    await handle.result()
    status = await handle.query("status", result_type=AgentStatus)
    assert status.state == "completed" and status.step == 2 and status.result is not None
    messages = await handle.query("transcript", {"from_step": 2}, result_type=list[Message])
    assert [m.role for m in messages] == ["assistant"] and messages[0].content == "listed"


async def test_every_model_call_and_tool_call_is_labelled_for_the_web_ui(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    step = tools(("write_file", {"path": "a.txt", "content": "a"}), ("run_command", {"command": "echo hi"}))
    model_server.responder = Script([step, answer("ok")])
    handle = await start(client, task_queue, goal="label", workspace=str(workspace))
    await handle.result()
    summaries = await event_summaries(client, handle)
    # The run's own summary is its goal; then its opening (the workspace check, step 0's snapshot:
    # the workspace as the run found it, for durable-agent fork; the skills), one line per model
    # call and file tool (local activities: markers) and per command (an activity), a snapshot
    # where no call took it, and the cleanup at the close, as the Web UI lists them.
    assert summaries == [
        "label",
        f"open_run (check, snapshot of step 0, skills): {workspace}"[:120],
        "call_model: gpt-4.1-mini step 1",
        "time cap: max_duration_s",  # the run's one timer (workflows/time_cap.py), started ...
        # write_file ran inside the command's activity, before it; the command took the step's snapshot
        "run_command: echo hi (after write_file: a.txt)",
        "call_model: gpt-4.1-mini step 2",
        "time cap: max_duration_s",  # ... and cancelled as the loop ends
        f"clean_up_run: {run_folder(handle.id, handle.first_execution_run_id or '')}",
    ]


async def test_a_long_command_s_summary_says_it_is_cut_and_its_input_holds_it_whole(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    long = "echo " + "a" * 200 + " && touch tail-ran"
    model_server.responder = Script([tools(("run_command", {"command": long})), answer("ok")])
    handle = await start(client, task_queue, goal="long", workspace=str(workspace))
    await handle.result()
    converter = client.data_converter.payload_converter
    scheduled = [
        e
        for e in (await handle.fetch_history()).events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "run_command"
    ]
    assert len(scheduled) == 1 and (workspace / "tail-ran").exists()
    summary = converter.from_payload(scheduled[0].user_metadata.summary, str)
    left_out = len("run_command: " + long) - len(summary.split("… (+")[0])
    assert summary.endswith(f"… (+{left_out} chars, see details)") and len(summary) == 120, summary
    (call,) = scheduled[0].activity_task_scheduled_event_attributes.input.payloads
    assert json.loads(call.data)["arguments"]["command"] == long  # the details the summary points to


async def test_search_attributes_follow_state_at_once_and_the_step_at_most_every_10_s(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("write_file", {"path": f"{n}.txt", "content": "x"})) for n in range(6)])
    handle = await start(client, task_queue, goal="six quick steps", workspace=str(workspace))
    result = await handle.result()
    events = (await handle.fetch_history()).events
    upserted = [
        (e.event_time.ToDatetime(), e.upsert_workflow_search_attributes_event_attributes.search_attributes)
        for e in events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    ]
    upserts = [{name: json.loads(value.data) for name, value in found.indexed_fields.items()} for _, found in upserted]
    times = [at for (at, _), u in zip(upserted, upserts, strict=True) if "AgentStep" in u]
    agent = [u for u in upserts if "AgentStep" in u]
    # Seven quick model calls: the running state at the start, the final state with the final
    # figures, and between them (a loaded machine can take over 10 s) a step at most every 10 s.
    assert (agent[0]["AgentState"], agent[0]["AgentStep"]) == ("running", 0)
    assert (agent[-1]["AgentState"], agent[-1]["AgentStep"]) == ("completed", result.steps)
    for i in range(1, len(agent) - 1):
        assert agent[i]["AgentState"] == "running" and (times[i] - times[i - 1]).total_seconds() >= 10, agent
    assert agent[-1]["AgentTokens"] == result.usage.input_tokens + result.usage.output_tokens
    assert len(upserts) == len(agent) + 1  # and the one TemporalChangeVersion of the baseline patch
    described = await handle.describe()
    assert described.search_attributes["AgentStep"] == [result.steps]


async def event_summaries(client: Client, handle: WorkflowHandle) -> list[str]:
    """The summaries of the run's events, in order, as the Web UI's event list shows them."""
    converter = client.data_converter.payload_converter
    return [
        converter.from_payload(e.user_metadata.summary, str)
        for e in (await handle.fetch_history()).events
        if e.HasField("user_metadata") and e.user_metadata.HasField("summary")
    ]


class _FailCommandsAfterTheyRan(Interceptor):
    """A command's activity that fails once its file calls and command have run (a fault injected)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        class Failing(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> object:
                result = await super().execute_activity(input)
                request = input.args[0] if input.args else None
                if activity.info().activity_type == "run_command" and isinstance(request, ToolCallInput):
                    raise ApplicationError("injected after the command ran", non_retryable=True)
                return result

        return Failing(next)


async def test_a_commands_file_calls_keep_their_outcome_when_its_activity_fails_after_they_ran(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """The step's edit runs inside its command's activity, which then fails: the edit is asked
    for alone and its journal gives back what it did. Made twice, it would fail (`x` occurs
    twice in `xx`); the model sees the edit's own outcome and the command's failure."""
    (workspace / "a.txt").write_text("x")
    edit = ("edit_file", {"path": "a.txt", "old_text": "x", "new_text": "xx"})
    model_server.responder = Script([tools(edit, ("run_command", {"command": "cat a.txt"})), answer("ok")])
    async with build_worker(client, task_queue, interceptors=[_FailCommandsAfterTheyRan()]):
        handle = await start(client, task_queue, goal="ride", workspace=str(workspace))
        assert (await handle.result()).state == "completed"

    edited, command = tool_results(model_server.requests[1])
    assert edited == "replaced 1 occurrence of old_text in a.txt", edited
    assert command == "ERROR: run_command failed: injected after the command ran", command
    assert (workspace / "a.txt").read_text() == "xx"
    summaries = await event_summaries(client, handle)
    assert summaries.count("run_command: cat a.txt (after edit_file: a.txt)") == 1
    assert summaries.count("edit_file: a.txt") == 1  # asked for alone once, after the command's activity failed


async def test_a_large_file_call_beside_a_command_runs_alone(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """File calls ride in the command's activity only while its input stays small: a large write
    runs as its own local activity (a payload of its own), a small one still rides."""
    big = "x" * (RIDING_MAX_CHARS + 1)
    step = tools(
        ("write_file", {"path": "big.txt", "content": big}),
        ("write_file", {"path": "small.txt", "content": "s"}),
        ("run_command", {"command": "wc -c < big.txt; cat small.txt"}),
    )
    model_server.responder = Script([step, answer("ok")])
    handle = await start(client, task_queue, goal="big", workspace=str(workspace))
    assert (await handle.result()).state == "completed"
    summaries = await event_summaries(client, handle)
    assert "write_file: big.txt" in summaries
    assert "run_command: wc -c < big.txt; cat small.txt (after write_file: small.txt)" in summaries
    assert tool_results(model_server.requests[1])[2].splitlines()[-2:] == [str(len(big)), "s"]
