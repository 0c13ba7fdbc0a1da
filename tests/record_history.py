"""Record a real run's history for the replay test: `python -m tests.record_history`
(`--compaction`: a run with compactions; `--delegate`: a parent's and a delegate's histories;
`--agent-file`: a run of an agent file, read at its start; `--done`: the plan tool, a quota
shrunk by a spike, the skip rung and a check command that fails once; `--mcp`: a run with an
MCP server's tools, tests/mcp_fixture_server.py; `--snapshots`: the default scenario on
baseline-6, whose steps' last calls take the steps' snapshots where they can; `--riding`:
steps whose file calls run inside their command's activity, on baseline-7; `--opening`: a run
that opens with one `open_run` (the workspace check, step 0's snapshot and a skill), on baseline-8).

The scenario touches every kind of command the workflow emits: parallel tool activities,
an approval (update), a pause and a user message (signals), raised limits, a model
failure that needs attention and is resolved, search-attribute upserts and a final answer.
`python -m tests.record_history --compaction` records the context's scenario instead:
compactions (a summarising model call and an archive write each), `recall`, and the
archive written at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory

from durable_agent.connection import connect
from durable_agent.model_server import Failure, ModelServer, Reply
from durable_agent.runs import start_agent
from durable_agent.server import free_port, start_server
from tests.helpers import wait_for
from tests.scripts import ByGoal, Script, answer, tools
from workflows.types import AgentInput

HISTORY_FILE = Path(__file__).parent / "histories" / "agent_run.json"
COMPACTION_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_compaction.json")
AGENT_FILE_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_agent_file.json")
DONE_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_done.json")
MCP_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_mcp.json")
SNAPSHOTS_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_snapshot_with_tools.json")
RIDING_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_file_calls_with_command.json")
OPENING_HISTORY_FILE = HISTORY_FILE.with_name("agent_run_open_run.json")
"""The default scenario on baseline-6: a step's last call takes the step's snapshot where it can."""
DELEGATE_FILES = (
    Path(__file__).parent / "histories" / "delegate" / "parent.json",
    Path(__file__).parent / "histories" / "delegate" / "child.json",
)
WORKFLOW_IDS = Path(__file__).parent / "histories" / "delegate" / "workflow_ids.json"
"""File name → the recorded run's workflow id, which a replay needs (a delegate's derives from it)."""


def scenario(healed: threading.Event) -> Script:
    def flaky(request: dict[str, Any]) -> Reply | Failure:
        if healed.is_set():
            return Reply(tool_calls=[("read_file", {"path": "a.txt"})])
        return Failure(500, "down", headers={"retry-after-ms": "10"})

    return Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "a\n"}), ("run_command", {"command": "echo hi"})),
            flaky,
            tools(("edit_file", {"path": "a.txt", "old_text": "a", "new_text": "b"}), ("list_files", {})),
            answer("recorded"),
        ]
    )


async def record(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    """Run the scenario against a running worker on `task_queue`; returns its history."""
    healed = threading.Event()
    model.responder = scenario(healed)
    agent = AgentInput(goal="record a history", workspace=str(workspace), approval={"commands": ["^echo"]})
    handle = await start_agent(client, agent, f"replay-{uuid.uuid4().hex[:8]}", task_queue)
    status = await wait_for(handle, lambda s: bool(s.pending_approvals))
    await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
    await wait_for(handle, lambda s: s.state == "needs_attention")
    await handle.signal("pause", {"reason": "recording"})
    await handle.execute_update("raise_limits", {"max_tool_calls": 50})
    healed.set()
    await handle.execute_update("resolve", {"action": "retry"})
    await wait_for(handle, lambda s: s.state == "paused")
    await handle.signal("add_message", {"text": "carry on"})
    await handle.signal("resume")
    await handle.result()
    return await handle.fetch_history()


async def record_riding(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    """File calls riding with their step's command (one refused for its arguments, which runs
    alone), a step of file calls only, an approved command with a file call (gated: its own
    local activity), and a final answer."""
    model.responder = Script(
        [
            tools(
                ("write_file", {"path": "a.txt", "content": "a\n"}),
                ("read_file", {"path": "a.txt"}),
                ("write_file", {"content": "no path"}),
                ("run_command", {"command": "cat a.txt"}),
            ),
            tools(("edit_file", {"path": "a.txt", "old_text": "a", "new_text": "b"}), ("list_files", {})),
            tools(("write_file", {"path": "b.txt", "content": "b"}), ("run_command", {"command": "echo gated"})),
        ],
        final="recorded",
    )
    agent = AgentInput(goal="record riding calls", workspace=str(workspace), approval={"commands": ["^echo"]})
    handle = await start_agent(client, agent, f"replay-{uuid.uuid4().hex[:8]}", task_queue)
    status = await wait_for(handle, lambda s: bool(s.pending_approvals))
    await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
    await handle.result()
    return await handle.fetch_history()


async def record_opening(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    """A run whose opening checks the workspace, takes step 0's snapshot and lists its one skill
    in `open_run`; a step that loads the skill and runs a command; a final answer."""
    skill = workspace / "skills" / "greet" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\nname: greet\ndescription: says hello\n---\nSay hello.\n")
    model.responder = Script(
        [tools(("load_skill", {"name": "greet"}), ("run_command", {"command": "echo hello > hello.txt"}))],
        final="recorded",
    )
    agent = AgentInput(goal="record the opening", workspace=str(workspace))
    handle = await start_agent(client, agent, f"replay-{uuid.uuid4().hex[:8]}", task_queue)
    await handle.result()
    return await handle.fetch_history()


async def record_compaction(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    padding = "a" * 400
    model.responder = Script(
        [tools(("run_command", {"command": f"echo 'step {n} {padding}'"})) for n in range(1, 9)]
        + [tools(("recall", {"query": "step 2"}))],
        final="recorded",
    )
    agent = AgentInput(
        goal="record compactions",
        workspace=str(workspace),
        context={"max_context_tokens": 1_000, "keep_recent_steps": 2},
    )
    handle = await start_agent(client, agent, f"replay-{uuid.uuid4().hex[:8]}", task_queue)
    await handle.result()
    return await handle.fetch_history()


async def record_agent_file(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    """A run of `agents/recorder.md` (model, tools, a preset, a prompt), with one field given."""
    (workspace / "agents").mkdir()
    (workspace / "agents" / "recorder.md").write_text(
        "---\ndescription: Records a history\nmodel: recorder-model\ntools: [write_file, read_file]\n"
        "preset: report\n---\nYou record histories.\n"
    )
    model.responder = Script([tools(("write_file", {"path": "a.txt", "content": "a"}))], final="recorded")
    agent = AgentInput(
        goal="record an agent file", workspace=str(workspace), agent="recorder", limits={"hard_steps": 9}
    )
    handle = await start_agent(client, agent, f"replay-{uuid.uuid4().hex[:8]}", task_queue)
    await handle.result()
    return await handle.fetch_history()


async def record_done(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    """A plan with an optional item, a spike that shrinks the quota (and starts the ladder), a
    first answer whose check command fails, a fix, the skip rung, and a checked answer."""
    items = [{"text": "write fixed.txt"}, {"text": "tidy up", "required": False}]
    model.responder = Script(
        [
            tools(("plan", {"items": items}), input_tokens=100, output_tokens=10),
            tools(("list_files", {}), input_tokens=100, output_tokens=10),
            tools(("list_files", {}), input_tokens=100, output_tokens=10),
            tools(("list_files", {}), input_tokens=2_000, output_tokens=200),
            answer("done", input_tokens=100, output_tokens=10),
            tools(("write_file", {"path": "fixed.txt", "content": "yes"}), input_tokens=100, output_tokens=10),
        ],
        final="checked",
    )
    agent = AgentInput(
        goal="record a definition of done",
        workspace=str(workspace),
        check_command="test -e fixed.txt",
        success_criteria=["fixed.txt exists"],
        limits={"soft_steps": 5, "hard_steps": 8},
    )
    handle = await start_agent(client, agent, f"replay-{uuid.uuid4().hex[:8]}", task_queue)
    await handle.result()
    return await handle.fetch_history()


async def record_mcp(client: Client, task_queue: str, workspace: Path, model: ModelServer) -> WorkflowHistory:
    """A run with an MCP server: its catalog, a read and a write call side by side, a destructive
    call approved, and the sessions' close."""
    (workspace / "doomed.txt").write_text("x")
    model.responder = Script(
        [
            tools(("mcp__fx__echo", {"text": "hi"}), ("mcp__fx__append_line", {"path": "a.txt", "line": "a"})),
            tools(("mcp__fx__delete_file", {"path": "doomed.txt"})),
        ],
        final="recorded",
    )
    agent = AgentInput(goal="record an MCP run", workspace=str(workspace), mcp_servers=["fx"])
    handle = await start_agent(client, agent, f"replay-mcp-{uuid.uuid4().hex[:8]}", task_queue)
    status = await wait_for(handle, lambda s: s.state == "awaiting_approval")
    await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
    await handle.result()
    return await handle.fetch_history()


def delegate_scenario() -> ByGoal:
    return ByGoal(
        {
            "split the work": Script(
                [tools(("delegate", {"goal": "write a"}), ("delegate", {"goal": "check b", "budget_share": 0.2}))],
                final="split",
            ),
            "write a": Script([tools(("write_file", {"path": "a.txt", "content": "a"}))], final="a written"),
            "check b": Script([tools(("run_command", {"command": "echo b"}))], final="b checked"),
        }
    )


async def record_delegate(
    client: Client, task_queue: str, workspace: Path, model: ModelServer
) -> tuple[WorkflowHistory, WorkflowHistory]:
    """Two parallel delegates, one of which waits for an approval while its parent is paused
    and resumed (forwarded) and its reports reach the parent; returns the parent's and that
    delegate's histories."""
    model.responder = delegate_scenario()
    agent = AgentInput(goal="split the work", workspace=str(workspace), approval={"commands": ["^echo"]})
    handle = await start_agent(client, agent, f"replay-delegate-{uuid.uuid4().hex[:8]}", task_queue)
    status = await wait_for(handle, lambda s: bool(s.wait_chains))
    waiting = status.wait_chains[0][1].workflow_id
    await handle.signal("pause", {"reason": "recording"})
    child = client.get_workflow_handle(waiting)
    await wait_for(child, lambda s: s.state == "paused")
    await handle.signal("resume")
    await wait_for(child, lambda s: s.state == "awaiting_approval")
    await child.execute_update("approve", {"call_id": status.wait_chains[0][1].command.split()[-1], "approved": True})
    await handle.result()
    return await handle.fetch_history(), await child.fetch_history()


async def main(kind: str) -> None:
    from worker import build_worker

    home = Path(tempfile.mkdtemp())
    os.environ["DURABLE_AGENT_WORKSPACE_ROOTS"] = str(home)  # the worker's check accepts the workspace
    if kind == "mcp":
        server_file = Path(__file__).with_name("mcp_fixture_server.py")
        config = {"mcpServers": {"fx": {"command": sys.executable, "args": [str(server_file)]}}}
        (home / "mcp.json").write_text(json.dumps(config))
        os.environ["DURABLE_AGENT_MCP_CONFIG"] = str(home / "mcp.json")
    server = start_server(home, port=free_port(), ui_port=None, persistent=False)
    try:
        with ModelServer(Script([])) as model:
            os.environ.update(OPENAI_BASE_URL=model.base_url, OPENAI_API_KEY="record")
            client = await connect(server.address)
            workspace = home / "ws"
            workspace.mkdir()
            async with build_worker(client, "record"):
                recorders = {
                    "compaction": record_compaction,
                    "delegate": record_delegate,
                    "agent-file": record_agent_file,
                    "done": record_done,
                    "mcp": record_mcp,
                    "agent": record,
                    "snapshots": record,
                    "riding": record_riding,
                    "opening": record_opening,
                }
                histories = await recorders[kind](client, "record", workspace, model)
    finally:
        server.stop()  # a failed recording must not leave a dev server behind
    files = {
        "compaction": (COMPACTION_HISTORY_FILE,),
        "delegate": DELEGATE_FILES,
        "agent-file": (AGENT_FILE_HISTORY_FILE,),
        "done": (DONE_HISTORY_FILE,),
        "mcp": (MCP_HISTORY_FILE,),
        "agent": (HISTORY_FILE,),
        "snapshots": (SNAPSHOTS_HISTORY_FILE,),
        "riding": (RIDING_HISTORY_FILE,),
        "opening": (OPENING_HISTORY_FILE,),
    }[kind]
    if not isinstance(histories, tuple):
        histories = (histories,)
    for path, history in zip(files, histories, strict=True):
        path.write_text(history.to_json())
        print(f"wrote {path} ({len(history.events)} events)")
    if kind == "delegate":
        ids = {path.name: history.workflow_id for path, history in zip(files, histories, strict=True)}
        WORKFLOW_IDS.write_text(json.dumps(ids, indent=1) + "\n")


if __name__ == "__main__":
    known = ("--compaction", "--delegate", "--agent-file", "--done", "--mcp", "--snapshots", "--riding", "--opening")
    kinds = [a.removeprefix("--") for a in sys.argv[1:] if a in known]
    asyncio.run(main(kinds[0] if kinds else "agent"))
    sys.stdout.flush()
    os._exit(0)
