"""Agent files: `agents/<name>.md` under the input, recorded once, listed by the CLI."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from durable_agent import cli
from durable_agent.model_server import ModelServer, Reply
from durable_agent.runs import chain_histories
from durable_agent.server import EmbeddedServer
from tests.helpers import cli_start_agent, start, wait_for
from tests.scripts import ByGoal, Script, answer, goal_of, tools
from tests.test_cli import cli_env, durable_agent
from tests.test_replay import replay_failure
from tests.test_skills import system_messages, until_recorded
from worker import build_worker
from workflows.types import AgentResult, AgentStatus


def agent_text(body: str, **front: str) -> str:
    header = "\n".join(f"{key}: {value}" for key, value in front.items())
    return f"---\n{header}\n---\n{body}\n"


def write_agent(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


REVIEWER = agent_text(
    "You are REVIEWER-PROMPT.",
    description="Reviews a change",
    model="reviewer-model",
    tools="[read_file, list_files]",
    limits="{max_tool_calls: 7, max_tokens: 90000}",
)


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", [])}


async def test_the_file_reaches_the_model_and_the_input_overrides_it(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = tmp_path / "shared-agents"
    write_agent(workspace / "agents", "reviewer", REVIEWER)
    write_agent(shared, "reviewer", agent_text("SHADOWED-PROMPT", description="shadowed", model="shadowed-model"))
    writer = agent_text("WRITER-PROMPT", description="Writes", preset="simple_qa", tools="write_file, read_file")
    write_agent(shared, "writer", writer)
    monkeypatch.setenv("DURABLE_AGENT_AGENTS_DIR", str(shared))
    model_server.responder = ByGoal(
        {
            "as filed": Script([tools(("list_files", {}))], final="filed"),
            "overridden": Script([], final="overridden"),
            "shared": Script([], final="shared"),
        }
    )
    async with build_worker(client, task_queue):
        filed = await start(client, task_queue, goal="as filed", workspace=str(workspace), agent="reviewer")
        assert (await filed.result()).output == "filed"
        status = await filed.query("status", result_type=AgentStatus)
        overridden = await start(
            client,
            task_queue,
            goal="overridden",
            workspace=str(workspace),
            agent="reviewer",
            model="given-model",
            tools=["read_file"],
            limits={"max_model_calls": 9, "max_tool_calls": 8},
        )
        assert (await overridden.result()).output == "overridden"
        over_status = await overridden.query("status", result_type=AgentStatus)
        shared_run = await start(client, task_queue, goal="shared", workspace=str(workspace), agent="writer")
        assert (await shared_run.result()).output == "shared"
        shared_status = await shared_run.query("status", result_type=AgentStatus)

    by_goal = {goal_of(r): r for r in model_server.requests}
    first = by_goal["as filed"]
    assert first["model"] == "reviewer-model"
    assert system_messages(first)[0] == "You are REVIEWER-PROMPT."
    assert tool_names(first) == {"read_file", "list_files"}
    assert status.agent == "reviewer (agents/reviewer.md)" and status.limits.max_tool_calls == 7
    assert "SHADOWED" not in str(model_server.requests)  # the workspace's file wins
    # Given fields win; what the input does not give still comes from the file.
    second = by_goal["overridden"]
    assert second["model"] == "given-model" and tool_names(second) == {"read_file"}
    assert system_messages(second)[0] == "You are REVIEWER-PROMPT."
    assert (over_status.limits.max_model_calls, over_status.limits.max_tool_calls) == (9, 8)
    assert over_status.limits.max_tokens == 90_000  # limits merge field by field
    # Found in DURABLE_AGENT_AGENTS_DIR; its preset sets the limits.
    assert system_messages(by_goal["shared"])[0] == "WRITER-PROMPT"
    assert tool_names(by_goal["shared"]) == {"write_file", "read_file"}  # a comma-separated list, too
    assert shared_status.agent == f"writer ({shared / 'writer.md'})"
    assert shared_status.limits.max_model_calls == 3 and shared_status.limits.max_duration_s == 10


async def test_an_edit_after_the_start_changes_nothing_and_the_history_replays(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    path = write_agent(workspace / "agents", "reviewer", REVIEWER)
    reached, go_on = threading.Event(), threading.Event()

    def gate(request: dict[str, Any]) -> Reply:
        reached.set()
        go_on.wait(30)
        return tools(("list_files", {}))

    model_server.responder = Script([gate, *[tools(("list_files", {}))] * 10], final="kept")
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="review",
            workspace=str(workspace),
            agent="reviewer",
            continue_as_new_every=10,
            limits={"max_tool_calls": 50},  # over the file's 7
        )
        await asyncio.to_thread(reached.wait, 30)
        path.write_text(agent_text("EDITED-PROMPT", description="edited", model="edited-model"))
        await handle.signal("pause", {"reason": "restart the worker"})
        go_on.set()
        await wait_for(handle, lambda s: s.state == "paused")
        await until_recorded(handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    # A new worker replays the run from history, with the file edited again while none ran.
    path.write_text(agent_text("EDITED-AGAIN", description="edited", model="edited-model"))
    async with build_worker(client, task_queue):
        await handle.signal("resume")
        result = await handle.result()
        status = await handle.query("status", result_type=AgentStatus)

    assert result.state == "completed" and result.output == "kept" and result.steps == 12
    histories = await chain_histories(client, handle.id)
    assert len(histories) == 2  # it continued as new, carrying the definition
    assert len(model_server.requests) == 12
    for request in model_server.requests:
        assert request["model"] == "reviewer-model"
        assert system_messages(request)[0] == "You are REVIEWER-PROMPT."
        assert tool_names(request) == {"read_file", "list_files"}
    assert "EDITED" not in str(model_server.requests)
    assert status.agent == "reviewer (agents/reviewer.md)"
    markers = [e for e in histories[0].events if e.HasField("marker_recorded_event_attributes")]
    assert any(b"REVIEWER-PROMPT" in e.SerializeToString() for e in markers)  # the definition, in history
    assert not any(b"REVIEWER-PROMPT" in e.SerializeToString() for e in histories[1].events[1:])  # read once
    for history in histories:
        assert await replay_failure(history) is None


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("ghost", None, "unknown agent 'ghost': no agents/ghost.md in agents/ in the workspace"),
        ("typo", agent_text("x", description="d", tols="[read_file]"), "agents/typo.md: tols: unknown field"),
        # A tool name no worker offers is the tool catalog's to refuse, at the same start.
        ("tooly", agent_text("x", description="d", tools="[fly]"), "unknown tool(s) ['fly']: no worker offers them"),
        ("nodesc", agent_text("x", model="m"), "agents/nodesc.md: description: required"),
        ("yamly", agent_text("x", description="d", limits="{max_tokens: [}"), "agents/yamly.md: malformed front"),
        ("nofront", "just a prompt\n", "agents/nofront.md: malformed front matter: the file must start with"),
        ("preset", agent_text("x", description="d", preset="huge"), "agents/preset.md: limits.preset: input should"),
        # Each is valid alone; the input's soft limit over the file's hard one is not.
        ("clash", agent_text("x", description="d", limits="{hard_steps: 5}"), "agents/clash.md with the run's input"),
    ],
)
async def test_a_bad_or_unknown_agent_closes_the_run_at_its_start(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    name: str,
    text: str | None,
    expected: str,
) -> None:
    if text is not None:
        write_agent(workspace / "agents", name, text)
    model_server.responder = Script([], final="must not be asked")
    given = {"limits": {"soft_steps": 10}} if name == "clash" else {}
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), agent=name, **given)
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert expected in str(failure.value.cause), failure.value.cause
    assert model_server.requests == []


async def test_agents_lists_each_file_where_it_was_found_and_what_shadows_it(workspace: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared-agents"
    write_agent(workspace / "agents", "reviewer", REVIEWER)
    write_agent(shared, "reviewer", agent_text("x", description="the shared reviewer"))
    write_agent(shared, "writer", agent_text("x", description="Writes the notes"))
    env = cli_env(DURABLE_AGENT_AGENTS_DIR=str(shared))
    listed = await durable_agent("agents", "--workspace", str(workspace), env=env)
    assert listed.returncode == 0, listed
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["NAME", "DESCRIPTION", "FOUND", "IN"]
    lines = listed.stdout.splitlines()[1:]
    assert lines[0].split()[0] == "reviewer" and "Reviews a change" in lines[0] and "agents/reviewer.md" in lines[0]
    assert "the shared reviewer" in lines[1]
    assert f"{shared / 'reviewer.md'} (shadowed by agents/reviewer.md)" in lines[1]
    assert "Writes the notes" in lines[2] and str(shared / "writer.md") in lines[2] and "shadowed" not in lines[2]

    write_agent(workspace / "agents", "broken", agent_text("x", description="d", tols="[read_file]"))
    broken = await durable_agent("agents", "--workspace", str(workspace), env=env)
    assert broken.returncode == 1, broken
    assert "agents/broken.md: cannot be used: " in broken.stdout and "tols" in broken.stdout, broken.stdout

    empty = await durable_agent("agents", "--workspace", str(tmp_path), env=cli_env(DURABLE_AGENT_AGENTS_DIR=None))
    assert empty.returncode == 0 and "no agent files in" in empty.stdout and "is not set" in empty.stdout


def test_run_sends_only_the_options_given(workspace: Path) -> None:
    # What is sent is what the agent file gives way to: an option not given must not be sent,
    # not even as an empty list (an empty `approval.commands` would drop the file's gates).
    args = ("run", "g", "--workspace", str(workspace), "--agent", "reviewer", "--approve-tools", "read_file")
    given = cli._agent_input(cli.build_parser().parse_args(args), demo=False).model_dump(exclude_unset=True)
    assert given == {
        "goal": "g",
        "workspace": str(workspace),
        "agent": "reviewer",
        "approval": {"tools": ["read_file"]},
    }


async def test_run_with_agent_runs_the_file_and_status_names_it(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    write_agent(workspace / "agents", "reviewer", REVIEWER)
    reached, go_on = threading.Event(), threading.Event()

    def gate(request: dict[str, Any]) -> Reply:
        reached.set()
        go_on.wait(30)
        return answer("reviewed")

    model_server.responder = Script([gate])
    run_id = f"cli-agent-{task_queue}"
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    run = await durable_agent(
        *("run", "review it", "--workspace", str(workspace), "--agent", "reviewer", "--max-tool-calls", "5"),
        *("--no-worker", "--detach", "--id", run_id),
        env=env,
    )
    assert run.returncode == 0, run
    await asyncio.to_thread(reached.wait, 30)
    status = await durable_agent("status", run_id, env=env)
    handle = client.get_workflow_handle(run_id, result_type=AgentResult)
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    described = await handle.describe()
    go_on.set()
    # The Web UI: the run page's Current Details and its fixed Details.
    assert "step 1 · reviewer-model · agent reviewer (agents/reviewer.md)" in metadata.current_details
    assert (await described.static_details()).startswith("**Agent:** reviewer")
    assert status.returncode == 0, status
    assert f"{run_id}: running · step 1 · model reviewer-model · agent reviewer (agents/reviewer.md)" in status.stdout
    assert "tool calls 5" in status.stdout  # the option given beats the file's 7
    assert (await handle.result()).output == "reviewed"
    request = model_server.requests[0]
    assert request["model"] == "reviewer-model" and system_messages(request)[0] == "You are REVIEWER-PROMPT."


async def test_a_delegate_runs_its_agent_within_its_parents_bounds(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    write_agent(
        workspace / "agents",
        "helper",
        agent_text(
            "You are HELPER-PROMPT.",
            description="Helps",
            model="helper-model",
            tools="[read_file, run_command, list_files]",
            limits="{max_tokens: 400000}",
            approval="{tools: [list_files]}",
        ),
    )
    model_server.responder = ByGoal(
        {
            "plan": Script([tools(("delegate", {"goal": "help", "agent": "helper"}))], final="planned"),
            "help": Script([tools(("list_files", {}))], final="helped"),
        }
    )
    handle = await start(
        client,
        task_queue,
        goal="plan",
        workspace=str(workspace),
        model="parent-model",
        tools=["read_file", "list_files", "delegate"],
        limits={"max_tokens": 100_000},
    )
    # The file's approval gate is added to the parent's (none): its list_files waits for a person.
    # Waited for through the parent's view: a query to the child could come before it exists.
    waiting = await wait_for(handle, lambda s: any(c.state == "awaiting_approval" for c in s.children), 60)
    child = client.get_workflow_handle(waiting.children[0].workflow_id, result_type=AgentResult)
    gated = await wait_for(child, lambda s: bool(s.pending_approvals))
    await child.execute_update("approve", {"call_id": gated.pending_approvals[0].call_id, "approved": True})
    assert (await handle.result()).output == "planned"
    child_status = await child.query("status", result_type=AgentStatus)

    requests = [r for r in model_server.requests if goal_of(r) == "help"]
    assert requests and all(r["model"] == "helper-model" for r in requests)
    assert system_messages(requests[0])[0] == "You are HELPER-PROMPT."
    # Its tools: the file's that the parent has too (no run_command); its limits: the parent's share.
    assert tool_names(requests[0]) == {"read_file", "list_files"}
    assert child_status.agent == "helper (agents/helper.md)"
    assert child_status.limits.max_tokens <= 50_000


async def test_a_run_started_from_the_temporal_cli_reads_its_file_once_across_its_restart(
    temporal_server: EmbeddedServer,
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
) -> None:
    # `temporal workflow start` gives the server's 10 s task timeout: the run continues as new
    # at once with the short one (workflows/agent.py), carrying what it read from the file.
    write_agent(workspace / "agents", "reviewer", REVIEWER)
    model_server.responder = Script([], final="from the cli")
    run_id = f"temporal-cli-{task_queue}"
    given = {"goal": "review", "workspace": str(workspace), "agent": "reviewer", "context": {"keep_recent_steps": 3}}
    started = await cli_start_agent(temporal_server.address, task_queue, run_id, given)
    assert started.returncode == 0, started
    handle = client.get_workflow_handle(run_id, result_type=AgentResult)
    assert (await handle.result()).output == "from the cli"
    histories = await chain_histories(client, run_id)
    assert len(histories) == 2
    first, second = ([b"REVIEWER-PROMPT" in e.SerializeToString() for e in h.events] for h in histories)
    assert not first[0] and any(first[1:])  # not in the first run's input; read and recorded by it
    assert second[0] and not any(second[1:])  # carried in the second run's input; not read again
    request = model_server.requests[0]
    assert request["model"] == "reviewer-model" and system_messages(request)[0] == "You are REVIEWER-PROMPT."
    assert tool_names(request) == {"read_file", "list_files"}
