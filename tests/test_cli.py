"""`durable-agent` as a user runs it: a real subprocess against the session's dev server."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import demo_model
from durable_agent.follow import Reporter, Snapshot
from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import JOURNAL_GONE, wait_for
from tests.scripts import Script, answer, tools
from workflows.types import AgentStatus, Limits, Message, ToolCall, Usage

ROOT = Path(__file__).resolve().parent.parent
LABEL = demo_model.LABEL


def cli_env(**changes: str | None) -> dict[str, str]:
    """The test process's environment (server address, model endpoint) with changes; None removes."""
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


async def durable_agent(*args: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Awaited without blocking the loop, which also runs the test's in-process worker."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "durable_agent.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    return subprocess.CompletedProcess(list(args), process.returncode or 0, out.decode(), err.decode())


def one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, result
    assert result.stderr.count("\n") == 1 and text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


async def test_run_follows_the_steps_then_status_export_and_list(
    temporal_server: EmbeddedServer,
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
) -> None:
    model_server.responder = Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "A"}), ("write_file", {"path": "b.txt", "content": "B"})),
            tools(("run_command", {"command": "cat a.txt b.txt"})),
        ],
        final="wrote a.txt and b.txt",
    )
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    run = await durable_agent(
        "run", "write two files", "--workspace", str(workspace), "--no-worker", "--id", f"cli-{task_queue}", env=env
    )

    assert run.returncode == 0, run
    lines = run.stdout.splitlines()
    assert "step 1 · 2 calls in parallel: write_file: a.txt, write_file: b.txt" in run.stdout
    assert any(line.startswith("step 2 · run_command: cat a.txt b.txt (exit 0)") for line in lines)
    assert any(line.startswith("step 3 · final answer") for line in lines)
    assert "completed (final_answer) after 3 steps" in lines
    assert "  wrote a.txt and b.txt" in lines
    assert LABEL not in run.stdout

    status = await durable_agent("status", f"cli-{task_queue}", env=env)
    assert status.returncode == 0 and "completed (final_answer) after 3 steps" in status.stdout
    files = next(line.removeprefix("files: ") for line in status.stdout.splitlines() if line.startswith("files: "))
    assert files.startswith(JOURNAL_GONE), status.stdout

    exported = await durable_agent("export", f"cli-{task_queue}", "-o", str(workspace / "t.jsonl"), env=env)
    assert exported.returncode == 0, exported
    messages = [Message.model_validate_json(line) for line in (workspace / "t.jsonl").read_text().splitlines()]
    assert [m.role for m in messages][:3] == ["system", "user", "assistant"]
    assert messages[1].content == "write two files" and messages[-1].content == "wrote a.txt and b.txt"

    listed = await durable_agent("list", "--state", "completed", env=env)
    assert listed.returncode == 0 and listed.stdout.startswith("ID")
    assert any(line.split()[:3] == [f"cli-{task_queue}", "completed", "3"] for line in listed.stdout.splitlines())


async def test_control_commands_on_a_gated_run(
    client: Client,
    temporal_server: EmbeddedServer,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": "echo hi > hi.txt"})), answer("said hi")])
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    run_id = f"gated-{task_queue}"
    started = await durable_agent(
        "run",
        "say hi",
        "--workspace",
        str(workspace),
        "--no-worker",
        "--detach",
        "--id",
        run_id,
        "--approve-commands",
        "^echo",
        env=env,
    )
    assert started.returncode == 0 and f"durable-agent watch {run_id}" in started.stdout
    await wait_for(client.get_workflow_handle(run_id), lambda s: s.state == "awaiting_approval")

    status = await durable_agent("status", run_id, env=env)
    assert status.returncode == 0
    assert f"{run_id}: awaiting_approval · step 1" in status.stdout
    assert "awaiting approval: 1:call_0_0 · run_command: echo hi > hi.txt" in status.stdout

    one_line_error(await durable_agent("approve", run_id, "nope", env=env), 1, "no pending approval 'nope'")
    one_line_error(await durable_agent("limits", run_id, "--hard-steps", "0", env=env), 2, "hard_steps")
    limits = await durable_agent("limits", run_id, "--hard-steps", "60", env=env)
    assert limits.returncode == 0 and "steps 60 (soft 40)" in limits.stdout
    approved = await durable_agent("approve", run_id, "1:call_0_0", "--note", "fine", env=env)
    assert approved.returncode == 0 and "1:call_0_0 approved" in approved.stdout

    watched = await durable_agent("watch", run_id, env=env)
    assert watched.returncode == 0, watched
    assert "completed (final_answer) after 2 steps" in watched.stdout
    assert (workspace / "hi.txt").read_text() == "hi\n"
    one_line_error(await durable_agent("pause", run_id, env=env), 1, f"run {run_id} has already ended (completed)")


async def test_run_starts_a_detached_server_and_worker_that_outlive_it(
    model_server: ModelServer, workspace: Path, tmp_path: Path
) -> None:
    model_server.responder = Script([tools(("write_file", {"path": "out.txt", "content": "made"}))], final="made it")
    env = cli_env(
        TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
        DURABLE_AGENT_HOME=str(tmp_path / "home"),
        DURABLE_AGENT_TASK_QUEUE="durable-agent",
    )
    started = await durable_agent(
        "run", "make out.txt", "--workspace", str(workspace), "--detach", "--id", "bg", env=env
    )
    pids = [int(pid) for pid in re.findall(r"stop it with `kill (\d+)`", started.stdout)]
    try:
        assert started.returncode == 0, started
        assert "Temporal dev server at" in started.stdout and "started a background worker" in started.stdout
        assert len(pids) == 2
        # `run` has exited; its server and worker carry the run to its end.
        watched = await durable_agent("watch", "bg", env=env)
        assert watched.returncode == 0 and "completed (final_answer)" in watched.stdout, watched
        assert (workspace / "out.txt").read_text() == "made"
    finally:
        for pid in reversed(pids):  # the worker first, then the server it talks to
            os.kill(pid, signal.SIGTERM)


async def test_clear_one_line_errors(temporal_server: EmbeddedServer, tmp_path: Path) -> None:
    env = cli_env(OPENAI_API_KEY="test-key")
    one_line_error(await durable_agent("status", "no-such-run", env=env), 2, "no run with id 'no-such-run'")
    missing = tmp_path / "missing"
    one_line_error(await durable_agent("run", "x", "--workspace", str(missing), env=env), 2, "does not exist")
    (tmp_path / "file").write_text("")
    one_line_error(
        await durable_agent("run", "x", "--workspace", str(tmp_path / "file"), env=env), 2, "is not a folder"
    )
    one_line_error(
        await durable_agent("run", "x", "--workspace", str(tmp_path), "--approve-tools", "fly", env=env),
        2,
        "unknown tool",
    )
    closed = f"127.0.0.1:{free_port()}"
    one_line_error(
        await durable_agent("status", "x", env=cli_env(TEMPORAL_ADDRESS=closed)), 2, f"no Temporal server at {closed}"
    )


async def test_without_a_key_the_demo_runs_labelled_and_survives_a_worker_kill(
    temporal_server: EmbeddedServer, tmp_path: Path
) -> None:
    workspace = tmp_path / "demo"
    workspace.mkdir()
    env = cli_env(
        OPENAI_API_KEY=None,
        OPENAI_BASE_URL=None,
        DURABLE_AGENT_TASK_QUEUE=None,
        DURABLE_AGENT_HOME=str(tmp_path / "home"),
    )
    run = await durable_agent("run", demo_model.GOAL, "--workspace", str(workspace), env=env)

    assert run.returncode == 0, run
    lines = run.stdout.splitlines()
    assert lines and all(line.startswith(LABEL) for line in lines), run.stdout
    assert "killed the worker" in run.stdout and "started a new worker" in run.stdout
    assert "completed (final_answer) after 6 steps" in run.stdout
    assert "finished steps redone after the kill: 0" in run.stdout
    tests_pass = subprocess.run([sys.executable, "test_calc.py"], cwd=workspace, capture_output=True, text=True)
    assert tests_pass.returncode == 0 and "all tests passed" in tests_pass.stdout


def test_demo_model_is_deterministic_and_reads_exit_codes() -> None:
    first = demo_model.respond({"messages": [{"role": "user", "content": "go"}]})
    assert first == demo_model.respond({"messages": [{"role": "user", "content": "go"}]})
    assert [name for name, _ in first.tool_calls] == ["write_file", "write_file"]
    after_run = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "exit code: 0\nall tests passed\n"},
    ]
    assert demo_model.respond({"messages": after_run}).tool_calls == []  # passed first time: done


def test_a_step_is_printed_once_all_its_tool_results_are_in() -> None:
    reporter = Reporter("r")
    calls = [
        ToolCall(id="a", name="list_files", arguments="{}"),
        ToolCall(id="b", name="read_file", arguments='{"path": "x"}'),
    ]
    reply = Message(role="assistant", tool_calls=calls, step=1)
    one_result = Message(role="tool", content="ok", tool_call_id="a", step=1)
    status = AgentStatus(state="running", step=1, model="m", usage=Usage(), limits=Limits())
    assert reporter.finished_steps(Snapshot(status, [reply, one_result])) == []
    both = [reply, one_result, Message(role="tool", content="ERROR: no such file", tool_call_id="b", step=1)]
    assert reporter.finished_steps(Snapshot(status, both)) == [
        (1, "step 1 · 2 calls in parallel: list_files, read_file: x (error)")
    ]
    assert reporter.finished_steps(Snapshot(status, both)) == []  # printed once


async def test_run_asks_for_approvals_inline_at_a_terminal(
    temporal_server: EmbeddedServer, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script(
        [tools(("run_command", {"command": "echo yes > ok.txt"}), ("run_command", {"command": "rm -rf /tmp/x"}))],
        final="asked twice",
    )
    leader, follower = os.openpty()  # stdin is a terminal, as when a person runs the command
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "durable_agent.cli",
        "run",
        "gated",
        "--workspace",
        str(workspace),
        "--no-worker",
        "--approve-commands",
        "echo",
        "rm",
        cwd=ROOT,
        env=cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue),
        stdin=follower,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    os.close(follower)
    mark, seen, answered = "? [y]es / [n]o / or type why not: ", "", 0
    assert process.stdout is not None
    while answered < 2:
        chunk = await asyncio.wait_for(process.stdout.read(200), timeout=30)
        assert chunk, seen
        seen += chunk.decode()
        for asked in seen.split(mark)[answered:-1]:  # text before each complete prompt
            os.write(leader, b"y\n" if asked.endswith("echo yes > ok.txt") else b"too risky\n")
            answered += 1
    out, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    os.close(leader)
    assert process.returncode == 0, seen + out.decode()
    assert (workspace / "ok.txt").read_text() == "yes\n"
    last = model_server.requests[-1]["messages"]
    assert any("denied by a person: too risky" in (m.get("content") or "") for m in last)
