"""What a person meets at the command line: help, errors, worker processes, the demo."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from activities.host import process_gone
from durable_agent import demo_model
from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import cli_start_agent, run_cli, start, until, wait_for
from tests.scripts import Script, answer, tools
from tests.test_cli import LABEL, ROOT, cli_env, durable_agent, one_line_error
from tests.test_crash import SlowTurn
from worker import GC_THRESHOLDS
from workflows.types import ALL_TOOLS, LimitsPatch

WORKER_COMMANDS = {
    "durable-agent worker": [sys.executable, "-m", "durable_agent.cli", "worker"],
    "python worker.py": [sys.executable, "worker.py"],
}


@pytest.mark.parametrize("command", WORKER_COMMANDS)
async def test_both_worker_commands_run_the_same_worker(
    command: str,
    client: Client,
    temporal_server: EmbeddedServer,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
) -> None:
    model_server.responder = Script([tools(("write_file", {"path": "w.txt", "content": "w"}))], final="done")
    process = await asyncio.create_subprocess_exec(
        *WORKER_COMMANDS[command],
        cwd=ROOT,
        env=cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        first = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert first == f"worker polling task queue {task_queue!r} on {temporal_server.address}\n"
        handle = await start(client, task_queue, goal="write w.txt", workspace=str(workspace))
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.state == "completed" and (workspace / "w.txt").read_text() == "w"
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stdout.read(), 30)).decode()
        assert await process.wait() == 0, rest
        assert rest.splitlines()[-2:] == [
            "stopping: in-flight activities get a few seconds to finish",
            "worker stopped",
        ]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


SETTLED_PROBE = """
import asyncio, gc, os, signal, worker

async def main():
    async def stop_once_settled():
        for _ in range(600):
            if gc.get_freeze_count():
                break
            await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # the worker's own stop: it shuts down as on Ctrl-C

    print(gc.get_freeze_count(), flush=True)
    stopping = asyncio.create_task(stop_once_settled())
    await worker.run_worker()
    await stopping
    print(gc.get_freeze_count(), *gc.get_threshold(), flush=True)

asyncio.run(main())
os._exit(0)
"""


def test_the_worker_leaves_its_start_up_objects_out_of_the_collectors_scans(
    temporal_server: EmbeddedServer, task_queue: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SETTLED_PROBE],
        cwd=ROOT,
        env=cli_env(TEMPORAL_ADDRESS=temporal_server.address, DURABLE_AGENT_TASK_QUEUE=task_queue),
        capture_output=True,
        text=True,
        timeout=90,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[0] == "0", (done.stdout, done.stderr[-2000:])
    frozen, *thresholds = map(int, lines[-1].split())
    assert frozen > 10_000 and tuple(thresholds) == GC_THRESHOLDS, lines  # modules, SDK and clients: many objects


@pytest.mark.parametrize("command", WORKER_COMMANDS)
def test_both_worker_commands_refuse_a_bad_setting_in_one_line(command: str) -> None:
    # Checked before the worker connects: no server is needed to be told.
    env = cli_env(DURABLE_AGENT_MAX_CACHED_WORKFLOWS="abc", TEMPORAL_ADDRESS="127.0.0.1:9")
    refused = subprocess.run(WORKER_COMMANDS[command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    one_line_error(refused, 2, "invalid worker setting: DURABLE_AGENT_MAX_CACHED_WORKFLOWS")


def help_of(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "durable_agent.cli", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_help_is_enough_without_the_readme() -> None:
    bare = help_of()
    assert bare.returncode == 0 and bare.stdout.startswith("usage: durable-agent"), bare
    for command in ("server", "worker", "run", "status", "watch", "pause", "resume", "message", "approve"):
        assert f"    {command} " in bare.stdout
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DURABLE_AGENT_HOME", "exit codes:"):
        assert name in bare.stdout
    assert help_of("--help").stdout == bare.stdout
    version = help_of("--version")
    assert version.returncode == 0 and version.stdout.strip() == "durable-agent 0.1.0"

    run_help = " ".join(help_of("run", "--help").stdout.split())  # argparse wraps lines at the terminal width
    for limit, default in {"hard-steps": 50, "max-tokens": 500000, "max-cost-usd": 5, "max-duration-s": 3600}.items():
        assert f"--{limit} " in run_help and f"(default {default})" in run_help
    assert all(f"--{name.replace('_', '-')} " in run_help for name in LimitsPatch.model_fields)
    assert ", ".join(ALL_TOOLS) in run_help
    assert "does not count against --max-duration-s" in run_help
    limits_help = help_of("limits", "--help").stdout
    assert "--max-model-calls N" in limits_help and "limits and budgets:" in limits_help


async def test_no_tracebacks_and_no_pydantic_jargon(
    temporal_server: EmbeddedServer, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([answer("done")])
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    run_id = f"pipe-{task_queue}"
    done = await durable_agent("run", "answer", "--workspace", str(workspace), "--no-worker", "--id", run_id, env=env)
    assert done.returncode == 0, done

    # `durable-agent status ID | head -0`: the reader is gone before the first line.
    read_end, write_end = os.pipe()
    os.close(read_end)
    piped = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "status", run_id],
        cwd=ROOT,
        env=env,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    os.close(write_end)
    assert piped.returncode == 141 and piped.stderr == "", piped.stderr

    missing = workspace / "missing" / "x.jsonl"
    one_line_error(await durable_agent("export", run_id, "-o", str(missing), env=env), 2, f"cannot write {missing}")
    blank = await durable_agent("run", "  \n ", "--workspace", str(workspace), "--no-worker", env=env)
    one_line_error(blank, 2, "error: invalid input: goal: the goal is blank")
    one_line_error(await durable_agent("run", "x", "--workspace", str(workspace), "--id", run_id, env=env), 2, "ended")
    assert (
        "already ran and ended (completed)"
        in (await durable_agent("run", "x", "--workspace", str(workspace), "--id", run_id, env=env)).stderr
    )


async def test_signals_the_run_cannot_use_are_recorded_not_dropped(
    client: Client,
    temporal_server: EmbeddedServer,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model_server.responder = Script([tools(("run_command", {"command": "echo hi"}))], final="said hi")
    handle = await start(client, task_queue, goal="say hi", workspace=str(workspace), approval={"commands": ["^echo"]})
    await wait_for(handle, lambda s: s.state == "awaiting_approval")
    address = temporal_server.address

    async def signal(*args: str) -> None:
        sent = await run_cli(address, "workflow", "signal", "--workflow-id", handle.id, *args)
        assert sent.returncode == 0, sent  # the Temporal CLI reports success whatever the run does with it

    with caplog.at_level(logging.WARNING):
        await signal("--name", "pasue")
        await signal("--name", "add_message", "--input", '{"txt": "hi"}')
        await signal("--name", "add_message", "--input", '"use printf instead"')
        await signal("--name", "pause", "--input", '{"reason": "lunch"}')
        await signal("--name", "pause", "--input", '{"reason": "review the command"}')
        status = await wait_for(handle, lambda s: len(s.ignored_signals) == 2 and s.paused_reason is not None)

    assert status.ignored_signals == [
        "unknown signal 'pasue' ignored; this run takes pause, resume, add_message",
        'add_message ignored: text: required; txt: unknown field (expected {"text": "..."})',
    ]
    assert status.paused_reason == "lunch; review the command"
    assert all(any(note in r.getMessage() for r in caplog.records) for note in status.ignored_signals)
    shown = await durable_agent("status", handle.id, env=cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue))
    assert "ignored signal: unknown signal 'pasue' ignored" in shown.stdout
    assert "paused: lunch; review the command" in shown.stdout

    await handle.execute_update("approve", {"call_id": "1:call_0_0", "approved": True})
    await handle.signal("resume")
    assert (await handle.result()).state == "completed"
    sent = [m.get("content") for m in model_server.requests[-1]["messages"] if m.get("role") == "user"]
    assert "use printf instead" in sent


async def test_list_names_failed_runs_and_unknown_costs(
    client: Client,
    temporal_server: EmbeddedServer,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
) -> None:
    model_server.responder = Script([answer("done")])
    unpriced = await start(client, task_queue, goal="answer", workspace=str(workspace), model="no-price-model")
    assert (await unpriced.result()).usage.cost_known is False
    # A blank goal from the Temporal CLI (no CLI check on this path) closes the run with a clear error.
    blank = await cli_start_agent(
        temporal_server.address, task_queue, f"blank-{task_queue}", {"goal": " ", "workspace": str(workspace)}
    )
    assert blank.returncode == 0, blank
    with pytest.raises(WorkflowFailureError) as failed:
        await client.get_workflow_handle(f"blank-{task_queue}").result()
    assert "goal: the goal is blank" in str(failed.value.cause)

    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue)
    listed = await listed_until(lambda line: line.split()[:1] == [unpriced.id], env)
    assert listed.endswith("cost unknown"), listed
    failed_run = await listed_until(lambda line: line.split()[:1] == [f"blank-{task_queue}"], env, "--state", "failed")
    assert failed_run.split()[1] == "failed"
    assert unpriced.id not in (await durable_agent("list", "--state", "failed", env=env)).stdout


async def listed_until(matches: Callable[[str], bool], env: dict[str, str], *args: str) -> str:
    """The first `list` line that matches, once visibility has it (it trails the run by a moment)."""
    for _ in range(50):
        listed = await durable_agent("list", *args, env=env)
        assert listed.returncode == 0, listed
        found = [line for line in listed.stdout.splitlines() if matches(line)]
        if found:
            return found[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no matching line in {listed.stdout}")


async def test_the_demo_never_writes_into_a_folder_that_holds_files(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text("def mine(): return 'my own code'\n")
    # No server at this address: the refusal comes before anything is started.
    env = cli_env(OPENAI_API_KEY=None, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", DURABLE_AGENT_HOME=str(tmp_path))
    refused = await durable_agent("run", "fix calc.py", "--workspace", str(project), env=env)
    one_line_error(refused, 2, f"only runs in an empty or new folder, and {project} holds calc.py; nothing was written")
    assert LABEL in refused.stderr
    assert (project / "calc.py").read_text() == "def mine(): return 'my own code'\n"
    assert sorted(p.name for p in project.iterdir()) == ["calc.py"]
    assert not (tmp_path / "temporal.db").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["project"]


async def test_run_starts_a_worker_when_the_only_poller_was_sigkilled(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.responder = Script([tools(("write_file", {"path": "out.txt", "content": "made"}))], final="made it")
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue, DURABLE_AGENT_HOME=str(tmp_path / "home"))
    workers: list[int] = []

    async def run(name: str, *options: str) -> str:
        folder = tmp_path / name
        folder.mkdir()
        started = await durable_agent("run", "make out.txt", "--workspace", str(folder), "--detach", *options, env=env)
        assert started.returncode == 0, started
        workers.extend(int(pid) for pid in re.findall(r"stop it with `kill (\d+)`", started.stdout))
        return started.stdout

    try:
        assert "started a background worker" in await run("first", "--id", f"first-{task_queue}")
        assert (await client.get_workflow_handle(f"first-{task_queue}").result())["state"] == "completed"
        os.kill(workers[0], signal.SIGKILL)  # the server still lists it as a poller for minutes
        await until(lambda: process_gone(workers[0]))

        no_worker = await run("waits", "--no-worker", "--id", f"waits-{task_queue}")
        assert f"no worker polls task queue {task_queue}: the run makes no progress" in no_worker
        watch = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "durable_agent.cli", "watch", f"waits-{task_queue}", "--no-worker",
            cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert watch.stdout is not None
        seen = ""
        while "the run makes no progress until a worker polls" not in seen:
            line = (await asyncio.wait_for(watch.stdout.readline(), 30)).decode()
            assert line, seen
            seen += line
        assert "started a background worker" in await run("second", "--id", f"second-{task_queue}")
        rest = (await asyncio.wait_for(watch.stdout.read(), 30)).decode()
        assert await watch.wait() == 0 and "a worker answers again" in rest, seen + rest
        assert len(workers) == 2
        for run_id in (f"waits-{task_queue}", f"second-{task_queue}"):
            result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), 30)
            assert result["state"] == "completed"
        assert (tmp_path / "second" / "out.txt").read_text() == "made"
    finally:
        for pid in workers[1:]:
            os.kill(pid, signal.SIGTERM)


async def test_demo_model_serves_the_offline_demo_as_an_openai_endpoint(
    temporal_server: EmbeddedServer, task_queue: str, tmp_path: Path
) -> None:
    import openai

    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_agent.cli", "demo-model", "--port", str(port),
        cwd=ROOT, env=cli_env(OPENAI_API_KEY=None), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}/v1"
    env = cli_env(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="offline-demo",
        DURABLE_AGENT_TASK_QUEUE=task_queue,
        DURABLE_AGENT_HOME=str(tmp_path / "home"),
    )
    workers: list[int] = []
    try:
        assert server.stdout is not None
        first = (await asyncio.wait_for(server.stdout.readline(), 30)).decode()
        assert first.startswith(f"{LABEL} the offline demo model (a fixed script, not an LLM) serves {base_url}")

        sdk = openai.AsyncOpenAI(base_url=base_url, api_key="offline-demo")
        assert [m.id for m in (await sdk.models.list()).data] == [demo_model.ENDPOINT_MODEL]
        reply = await sdk.chat.completions.create(model="any", messages=[{"role": "user", "content": "go"}])
        assert reply.model == demo_model.ENDPOINT_MODEL
        assert (reply.choices[0].message.content or "").startswith(LABEL)
        await sdk.close()

        model_flag = ("--model", demo_model.ENDPOINT_MODEL)
        empty = tmp_path / "empty"
        empty.mkdir()
        run = await durable_agent("run", demo_model.GOAL, "--workspace", str(empty), *model_flag, env=env)
        workers += [int(pid) for pid in re.findall(r"stop it with `kill (\d+)`", run.stdout)]
        assert run.returncode == 0, run
        assert "completed (final_answer) after 7 steps" in run.stdout and f"  {LABEL} Done." in run.stdout
        tested = subprocess.run([sys.executable, "test_calc.py"], cwd=empty, capture_output=True, text=True)
        assert tested.returncode == 0 and "all tests passed" in tested.stdout

        project = tmp_path / "project"
        project.mkdir()
        (project / "calc.py").write_text("mine\n")
        refused = await durable_agent("run", demo_model.GOAL, "--workspace", str(project), *model_flag, env=env)
        assert refused.returncode == 0, refused
        assert "only ever works in an empty folder" in refused.stdout
        assert (project / "calc.py").read_text() == "mine\n" and [p.name for p in project.iterdir()] == ["calc.py"]
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
        server.send_signal(signal.SIGTERM)
        await asyncio.wait_for(server.wait(), 30)


async def test_run_replaces_a_worker_sigkilled_while_it_follows(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, tmp_path: Path
) -> None:
    """#23 item 2: the README says a SIGKILLed worker is replaced at once; `run` used to print
    "no worker answered within 5 s" and wait for a person to start one."""
    slow = SlowTurn(tools(("write_file", {"path": "b.txt", "content": "b"})), delay_s=120)
    model_server.responder = Script([tools(("write_file", {"path": "a.txt", "content": "a"})), slow], final="made")
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue, DURABLE_AGENT_HOME=str(tmp_path / "home"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_agent.cli", "run", "make two files", "--workspace", str(workspace),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert run.stdout is not None
    seen = ""
    workers: list[int] = []
    try:
        while not workers:
            line = (await asyncio.wait_for(run.stdout.readline(), 60)).decode()
            assert line, seen
            seen += line
            workers += [int(pid) for pid in re.findall(r"background worker .*\(pid (\d+),", line)]
        await until(slow.asked.is_set)  # step 2's model call is in flight on that worker
        os.kill(workers[0], signal.SIGKILL)
        slow.release()
        rest = (await asyncio.wait_for(run.stdout.read(), 90)).decode()
        workers += [int(pid) for pid in re.findall(r"background worker .*\(pid (\d+),", rest)]
        assert await run.wait() == 0, seen + rest
        assert len(workers) == 2 and "no worker answered" not in rest, seen + rest
        assert "completed (final_answer) after 3 steps" in rest
        assert (workspace / "a.txt").read_text() == "a" and (workspace / "b.txt").read_text() == "b"
    finally:
        slow.release()
        if run.returncode is None:
            run.kill()
        for pid in workers[1:]:
            os.kill(pid, signal.SIGTERM)


async def test_watch_replaces_a_worker_sigkilled_while_it_follows(
    client: Client, temporal_server: EmbeddedServer, task_queue: str, model_server: ModelServer, tmp_path: Path
) -> None:
    """#23: `watch` replaces a dead worker as `run` does. Its environment names another task queue
    and no workspace roots: the worker it starts serves the run's queue and accepts its workspace."""
    slow = SlowTurn(tools(("write_file", {"path": "b.txt", "content": "b"})), delay_s=120)
    model_server.responder = Script([tools(("write_file", {"path": "a.txt", "content": "a"})), slow], final="made")
    env = cli_env(DURABLE_AGENT_TASK_QUEUE=task_queue, DURABLE_AGENT_HOME=str(tmp_path / "home"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run_id = f"watched-{task_queue}"
    started = await durable_agent(
        "run", "make two files", "--workspace", str(workspace), "--detach", "--id", run_id, env=env
    )
    workers = [int(pid) for pid in re.findall(r"background worker .*\(pid (\d+),", started.stdout)]
    assert started.returncode == 0 and len(workers) == 1, started
    watch_env = {**cli_env(DURABLE_AGENT_WORKSPACE_ROOTS=None), "DURABLE_AGENT_TASK_QUEUE": f"other-{task_queue}"}
    watch_env["DURABLE_AGENT_HOME"] = env["DURABLE_AGENT_HOME"]
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_agent.cli", "watch", run_id,
        cwd=ROOT, env=watch_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert watch.stdout is not None
    try:
        seen = ""
        while "following" not in seen:
            line = (await asyncio.wait_for(watch.stdout.readline(), 60)).decode()
            assert line, seen
            seen += line
        await until(slow.asked.is_set)  # step 2's model call is in flight on the run's worker
        os.kill(workers[0], signal.SIGKILL)
        slow.release()
        rest = (await asyncio.wait_for(watch.stdout.read(), 90)).decode()
        workers += [int(pid) for pid in re.findall(r"background worker .*\(pid (\d+),", rest)]
        assert await watch.wait() == 0, seen + rest
        assert len(workers) == 2 and f"for task queue {task_queue} " in rest, seen + rest
        assert "no worker answered" not in rest and "completed (final_answer) after 3 steps" in rest, seen + rest
        assert (workspace / "a.txt").read_text() == "a" and (workspace / "b.txt").read_text() == "b"
    finally:
        slow.release()
        if watch.returncode is None:
            watch.kill()
        for pid in workers[1:]:
            os.kill(pid, signal.SIGTERM)
