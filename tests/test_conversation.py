"""`durable-agent continue`: a completed run takes a next turn, a stopped run more room; one id throughout."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer
from tests.helpers import start
from tests.scripts import Script, answer, tools
from tests.test_cli import cli_env, durable_agent, one_line_error
from workflows.types import AgentResult


def user_texts(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m.get("role") == "user"]


async def test_a_completed_run_takes_a_next_turn_with_its_whole_context(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script(
        [tools(("write_file", {"path": "notes.txt", "content": "one\n"})), answer("wrote notes.txt")],
        final="added a second line",
    )
    handle = await start(client, task_queue, goal="write notes", workspace=str(workspace))
    first = await handle.result()
    assert (first.state, first.steps, first.usage.model_calls) == ("completed", 2, 2)
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)

    one_line_error(await durable_agent("continue", handle.id, env=env), 2, "say what comes next with --message")
    went_on = await durable_agent("continue", handle.id, "--message", "now add a second line", "--no-worker", env=env)
    assert went_on.returncode == 0, went_on
    assert f"{handle.id} goes on after step 2" in went_on.stdout
    assert "step 3 · final answer" in went_on.stdout and "step 1 ·" not in went_on.stdout  # only the new turn
    assert len(model_server.requests) == 3  # nothing before the close was asked again
    last = model_server.requests[-1]
    assert user_texts(last)[-1] == "now add a second line"
    assert any(m.get("content") == "wrote notes.txt" for m in last["messages"] if m["role"] == "assistant")
    result = await client.get_workflow_handle(handle.id, result_type=AgentResult).result()
    assert (result.state, result.steps, result.output) == ("completed", 3, "added a second line")
    assert result.usage.model_calls == 3  # the conversation's usage, not the turn's
    assert (workspace / "notes.txt").read_text() == "one\n"  # the workspace as it was: nothing restored

    listed = (await durable_agent("list", env=env)).stdout.splitlines()
    assert [line.split()[0] for line in listed].count(handle.id) == 1, listed


async def test_a_stopped_run_goes_on_with_more_room(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script(
        [tools(("run_command", {"command": f"echo {n} >> ledger.txt"})) for n in (1, 2, 3)], final="three lines"
    )
    handle = await start(
        client, task_queue, goal="three lines", workspace=str(workspace), limits={"soft_steps": 1, "hard_steps": 1}
    )
    assert (await handle.result()).state == "stopped"
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    one_line_error(await durable_agent("continue", handle.id, env=env), 2, "give it more room to go on")
    went_on = await durable_agent("continue", handle.id, "--hard-steps", "10", "--no-worker", env=env)
    assert went_on.returncode == 0, went_on
    result = await client.get_workflow_handle(handle.id, result_type=AgentResult).result()
    assert (result.state, result.output) == ("completed", "three lines")
    assert (workspace / "ledger.txt").read_text() == "1\n2\n3\n"  # each command once
    assert result.usage.model_calls == len(model_server.requests) == 4
    one_line_error(await durable_agent("continue", "no-such-run", env=env), 2, "no run with id 'no-such-run'")
