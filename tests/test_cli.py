"""`durable-agent` as a user runs it: a real subprocess against the session's dev server."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import demo_model
from durable_agent.follow import LiveReply, Reporter, Snapshot, note_line
from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import JOURNAL_GONE, start, wait_for
from tests.scripts import Script, answer, tools
from worker import build_worker
from workflows.types import AgentStatus, Degradation, Limits, Message, ToolCall, Usage

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
    assert not any(line.startswith(("files:", "note:")) for line in lines), run.stdout  # bookkeeping: --verbose

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
    one_line_error(await durable_agent("run", "x", "--workspace", "/", "--id", "root-ws", env=env), 2, "system folder")
    no_rows = await durable_agent("list", "--limit", "0", env=env)
    assert no_rows.returncode == 2 and "must be 1 or more" in no_rows.stderr, no_rows
    # Refused before a run was started to be refused: Temporal never heard of it.
    one_line_error(await durable_agent("status", "root-ws", env=env), 2, "no run with id 'root-ws'")
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
    client: Client, temporal_server: EmbeddedServer, tmp_path: Path
) -> None:
    workspace = tmp_path / "demo"
    workspace.mkdir()
    # Without the suite's workspace roots: the workers `run` starts accept the workspace
    # (outside its working directory) because `run` adds it to their roots.
    env = cli_env(
        OPENAI_API_KEY=None,
        OPENAI_BASE_URL=None,
        DURABLE_AGENT_TASK_QUEUE=None,
        DURABLE_AGENT_HOME=str(tmp_path / "home"),
        DURABLE_AGENT_WORKSPACE_ROOTS=None,
    )
    assert not workspace.resolve().is_relative_to(ROOT)
    run_id = f"demo-{uuid.uuid4().hex[:10]}"
    run = await durable_agent("run", demo_model.GOAL, "--workspace", str(workspace), "--id", run_id, env=env)

    assert run.returncode == 0, run
    lines = run.stdout.splitlines()
    assert lines and all(line.startswith(LABEL) for line in lines), run.stdout
    assert "killed the worker" in run.stdout and "started a new worker" in run.stdout
    assert "completed (final_answer) after 6 steps" in run.stdout
    assert "finished steps redone after the kill: 0" in run.stdout
    # By effect, not by the demo's words: the history shows two workers, the first one's
    # process is gone, and only the model call in flight ran twice (attempt 2 on the second).
    events = (await client.get_workflow_handle(run_id).fetch_history()).events
    workers = list(
        dict.fromkeys(
            e.workflow_task_started_event_attributes.identity
            for e in events
            if e.HasField("workflow_task_started_event_attributes")
        )
    )
    assert len(workers) == 2, workers
    assert not process_alive(int(workers[0].split("@")[0]))
    retried = [
        e.activity_task_started_event_attributes
        for e in events
        if e.HasField("activity_task_started_event_attributes") and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert [(a.attempt, a.identity) for a in retried] == [(2, workers[1])]
    tests_pass = subprocess.run([sys.executable, "test_calc.py"], cwd=workspace, capture_output=True, text=True)
    assert tests_pass.returncode == 0 and "all tests passed" in tests_pass.stdout


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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


async def test_cancel_verb_closes_the_run_as_cancelled(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    model_server.responder = Script([answer("never asked")])
    handle = await start(client, task_queue, start_signal="pause", goal="x", workspace=str(workspace))
    await wait_for(handle, lambda s: s.state == "paused")
    cancelled = await durable_agent("cancel", handle.id, env=env)
    assert cancelled.returncode == 0, cancelled
    assert f"cancel sent to {handle.id}" in cancelled.stdout and "\ncancelled (cancelled) after" in cancelled.stdout
    result = await handle.result()
    assert (result.state, result.stop_reason) == ("cancelled", "cancelled")
    assert model_server.requests == []
    one_line_error(await durable_agent("cancel", handle.id, env=env), 1, "has already ended")


async def test_status_without_a_worker_says_what_the_server_knows(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([answer("never asked")])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, start_signal="pause", goal="x", workspace=str(workspace))
        await wait_for(handle, lambda s: s.state == "paused")
    # The worker is gone: no query can be answered; the search attributes still say paused.
    shown = await durable_agent("status", handle.id, env=cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue))
    assert shown.returncode == 0, shown
    assert shown.stdout.startswith(f"{handle.id}: paused at step 0 · 0 tokens (from its search attributes)\n"), shown
    assert "no worker answered within 5 s" in shown.stdout and "durable-agent worker" in shown.stdout
    await handle.terminate("test over")


async def test_watch_shows_finished_steps_once_before_following_and_says_so_on_ctrl_c(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": "echo hi"}))], final="never reached")
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), approval={"tools": ["run_command"]})
    status = await wait_for(handle, lambda s: bool(s.pending_approvals))
    await handle.signal("pause", {"reason": "looking"})
    await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
    await wait_for(handle, lambda s: s.state == "paused" and s.step == 1)

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "durable_agent.cli",
        "watch",
        handle.id,
        cwd=ROOT,
        env=cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    before: list[str] = []
    while not before or not before[-1].startswith("following"):
        before.append((await asyncio.wait_for(process.stdout.readline(), 60)).decode().rstrip("\n"))
    assert sum(line.startswith("step 1 · run_command: echo hi") for line in before) == 1, before
    process.send_signal(signal.SIGINT)
    after, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 130
    assert not any(line.startswith("step 1") for line in after.decode().splitlines()), after  # not reprinted as new
    assert f"stopped watching; the run goes on. Watch again: durable-agent watch {handle.id}" in after.decode()
    await handle.terminate("test over")


async def test_ctrl_c_ends_a_follow_that_swallowed_its_first_cancel() -> None:
    """`asyncio.wait_for` returns its call's result when the call ends as the cancel arrives:
    the follow loop then goes on, and one cancel left `watch` hanging after Ctrl-C."""
    from durable_agent.cli import _until_signalled

    swallowed = asyncio.Event()

    async def follow_that_missed_the_cancel() -> int:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.set()  # as wait_for does in the race: the loop goes on
        await asyncio.sleep(60)
        return 0

    ctrl_c = asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
    try:
        assert await asyncio.wait_for(_until_signalled(follow_that_missed_the_cancel()), 10) is None
    finally:
        ctrl_c.cancel()
    assert swallowed.is_set()


def test_notes_say_what_changed_for_the_run_and_keep_bookkeeping_for_verbose() -> None:
    folded = Degradation(step=9, kind="compaction", detail="folded steps 1-4 (size), ~9,000 → ~2,000 tokens; summary")
    idle = Degradation(step=2, kind="compaction", detail="nothing to fold yet (~887 tokens in context)")
    pacing = Degradation(step=4, kind="early_soft_tier", detail="step 4 used 730 tokens, over twice the average")
    warned = Degradation(step=8, kind="soft_warning", detail="steps: you have 2 steps left; wrap up")
    assert note_line(folded, verbose=False).startswith("note: older steps were summarised")
    assert note_line(warned, verbose=False) == "note: the run nears a limit (steps): the model was told to wrap up"
    assert note_line(idle, verbose=False) is None and note_line(pacing, verbose=False) is None
    assert note_line(idle, verbose=True) == "note: compaction: nothing to fold yet (~887 tokens in context)"
    assert note_line(pacing, verbose=True) == f"note: early_soft_tier: {pacing.detail}"


def test_the_live_reply_shows_each_line_once_and_starts_over_on_a_retry() -> None:
    live = LiveReply()
    assert live.lines(3, 1, {"text": "I will re", "text_offset": 0}) == []  # no whole line yet
    assert live.lines(3, 1, {"text": "I will read it.\nThen fi", "text_offset": 0}) == ["step 3 … I will read it."]
    assert live.lines(3, 1, {"text": "I will read it.\nThen fi", "text_offset": 0}) == []
    # The text so far keeps its last characters only: what scrolled out was shown already.
    assert live.lines(3, 1, {"text": "it.\nThen fix it.\nAnd", "text_offset": 12}) == ["step 3 … Then fix it."]
    # Tool calls end the text: its last line shows too.
    assert live.lines(
        3, 1, {"text": "it.\nThen fix it.\nAnd test.", "text_offset": 12, "tool_calls": ["read_file"]}
    ) == [
        "step 3 … And test.",
        "step 3 … asks for read_file",
    ]
    assert live.lines(3, 2, {"text": "Let me", "text_offset": 0}) == [
        "step 3 … attempt 2: the model's reply starts over"
    ]
    assert live.lines(4, 1, {"text": "Next.\n", "text_offset": 0}) == ["step 4 … Next."]


async def test_run_shows_the_reply_while_the_model_writes_it(
    worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    text = "".join(f"line {n:02} of a reply written slowly\n" for n in range(1, 9))
    model_server.stream_interval_s = 0.06  # 4 characters an event: about 4 s for the reply
    model_server.responder = Script([], final=text)
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    run = await durable_agent("run", "x", "--workspace", str(workspace), "--no-worker", env=env)
    assert run.returncode == 0, run
    lines = run.stdout.splitlines()
    live = [line for line in lines if line.startswith("step 1 … ")]
    final = next(i for i, line in enumerate(lines) if line.startswith("step 1 · final answer"))
    assert live, run.stdout  # the reply showed while it came, before its step ended
    assert all(lines.index(line) < final for line in live)
    shown = [line.removeprefix("step 1 … ") for line in live]
    assert shown == sorted(set(shown)) and set(shown) <= set(text.splitlines()), shown  # in order, each once
