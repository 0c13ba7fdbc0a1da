"""One sandbox per run and the durable shell (issue 28): `shell: persistent`, the default.

Judged by effects: files the commands write, host processes, what a command of one run sees
of another's, and the run's history. The security tests of the sandbox itself (which now run
their commands in the run's sandbox) are in tests/test_sandbox.py, unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shlex
import signal
import subprocess
import uuid
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.tools import ToolActivities
from activities.tools.run_sandbox import HELPER_LOADER, RUN_SANDBOXES, RunSandboxes, helper_input, sandbox_python
from activities.tools.sandbox import CGROUP_PREFIX, CommandLimits
from durable_agent.model_server import ModelServer
from tests.helpers import host_processes_named, skip_without, start
from tests.scripts import Script, answer, tool_results, tools
from tests.test_sandbox import (
    SMALL_LIMITS,
    WORKER_ENV,
    Attacked,
    attack,
    attacked,
    bombs_capped,
    cgroups_available,
    command,
    nobody_worker,
    small_worker,
)
from workflows.types import ShellState, ToolCallInput, ToolOutcome


def shell_call(workspace: Path, run_folder: str, text: str, shell: ShellState | None = None) -> ToolCallInput:
    return ToolCallInput(
        call_id="c",
        idempotency_key=uuid.uuid4().hex,
        workspace=str(workspace),
        arguments={"command": text},
        run_folder=run_folder,
        shell=shell or ShellState(),
    )


async def run_in_shell(tools_: ToolActivities, call: ToolCallInput) -> ToolOutcome:
    return await ActivityEnvironment().run(tools_.run_command, call)


def kill_run_sandboxes(workspace: Path) -> int:
    """SIGKILL this worker's sandboxes of runs in `workspace`, as a crash would end them."""
    killed = 0
    for key, sandbox in list(RUN_SANDBOXES._sandboxes.items()):
        if key[0] == str(workspace):
            os.killpg(sandbox.process.pid, signal.SIGKILL)
            killed += 1
    return killed


__all__ = ["attacked", "nobody_worker", "small_worker"]  # fixtures of tests/test_sandbox.py used here


@pytest.mark.usefixtures("worker")
async def test_cd_and_export_carry_over_to_the_next_command(
    client: Client, task_queue: str, workspace: Path, model_server: ModelServer
) -> None:
    model_server.responder = Script(
        [
            tools(
                command(
                    "mkdir -p src && cd src && export STAGE=built && unset LANG && echo t > /tmp/kept && echo in $PWD"
                )
            ),
            tools(command('pwd > where.txt; echo "$STAGE ${LANG-unset}" > stage.txt; echo h > ~/kept')),
            tools(command("cat /tmp/kept ~/kept > kept.txt")),
            answer("done"),
        ]
    )
    handle = await start(client, task_queue, goal="shell", workspace=str(workspace))
    result = await asyncio.wait_for(handle.result(), timeout=120)
    assert result.state == "completed"
    assert (workspace / "src" / "where.txt").read_text() == f"{workspace}/src\n"
    assert (workspace / "src" / "stage.txt").read_text() == "built unset\n"
    assert (workspace / "src" / "kept.txt").read_text() == "t\nh\n"  # the run's /tmp and $HOME, kept too
    # Recorded per command in the run's history: the directory and the variables set and unset.
    states = [state for state in await recorded_shell_states(handle) if state is not None]
    assert states[0] == {"cwd": f"{workspace}/src", "env": {"STAGE": "built", "LANG": None}}


@pytest.mark.usefixtures("worker")
async def test_a_fresh_shell_starts_every_command_in_the_workspace(
    client: Client, task_queue: str, workspace: Path, model_server: ModelServer
) -> None:
    model_server.responder = Script(
        [
            tools(
                command(
                    "mkdir -p src && cd src && export STAGE=built && echo t > /tmp/kept && echo h > ~/kept"
                    " && cat /tmp/kept ~/kept > wrote.txt"
                )
            ),
            tools(
                command('pwd > where.txt; echo "${STAGE-unset}" > stage.txt; ls /tmp/kept ~/kept | wc -l > kept.txt')
            ),
            answer("done"),
        ]
    )
    handle = await start(client, task_queue, goal="shell", workspace=str(workspace), shell="fresh")
    assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "completed"
    assert (workspace / "where.txt").read_text() == f"{workspace}\n"
    assert (workspace / "stage.txt").read_text() == "unset\n"
    assert (workspace / "src" / "wrote.txt").read_text() == "t\nh\n"  # the first command did write them
    assert (workspace / "kept.txt").read_text().strip() == "0"  # nor /tmp and $HOME: each its sandbox's own
    tools_sent = model_server.requests[0]["tools"]
    description = next(t["function"]["description"] for t in tools_sent if t["function"]["name"] == "run_command")
    assert "starts afresh" in description


@pytest.mark.usefixtures("worker")
async def test_a_new_sandbox_starts_from_the_recorded_shell(
    client: Client, task_queue: str, workspace: Path, model_server: ModelServer
) -> None:
    def crash_then_command(request: dict[str, Any]) -> Any:
        # The sandbox the first command ran in ends before the second, as with a worker's crash.
        assert kill_run_sandboxes(workspace) == 1
        return tools(command('pwd > where.txt; echo "$STAGE" > stage.txt'))

    model_server.responder = Script(
        [tools(command("mkdir -p src && cd src && export STAGE=built")), crash_then_command, answer("done")]
    )
    handle = await start(client, task_queue, goal="shell", workspace=str(workspace))
    assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "completed"
    assert (workspace / "src" / "where.txt").read_text() == f"{workspace}/src\n"
    assert (workspace / "src" / "stage.txt").read_text() == "built\n"


@pytest.mark.usefixtures("worker")
async def test_a_command_sent_to_a_sandbox_that_just_died_runs_once_in_a_new_one(
    client: Client, task_queue: str, workspace: Path, model_server: ModelServer
) -> None:
    def crash_then_command(request: dict[str, Any]) -> Any:
        # The helper killed, bubblewrap stopped so that the worker cannot see the sandbox end:
        # the next command is sent to the dead sandbox, as when it dies just before a command.
        (bwrap,) = [box.process.pid for key, box in RUN_SANDBOXES._sandboxes.items() if key[0] == str(workspace)]
        os.kill(bwrap, signal.SIGSTOP)
        os.kill(sandbox_pid_1(bwrap), signal.SIGKILL)
        return tools(command('echo "once $STAGE" >> ledger.txt'))

    model_server.responder = Script(
        [tools(command("mkdir -p src && cd src && export STAGE=built")), crash_then_command, answer("done")]
    )
    handle = await start(client, task_queue, goal="shell", workspace=str(workspace))
    assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "completed"
    assert (workspace / "src" / "ledger.txt").read_text() == "once built\n"  # in the recorded shell, once
    assert tool_results(model_server.requests[-1])[1].startswith("exit code: 0")


@pytest.mark.usefixtures("worker")
async def test_a_sandbox_killed_mid_command_ends_that_command_and_the_next_runs_in_the_recorded_shell(
    client: Client, task_queue: str, workspace: Path, model_server: ModelServer
) -> None:
    model_server.responder = Script(
        [
            tools(command("mkdir -p src && cd src && export STAGE=built")),
            tools(command("echo started >> ledger.txt; sleep 60; echo finished >> ledger.txt")),
            tools(command('echo "next $STAGE" >> ledger.txt')),
            answer("done"),
        ]
    )
    handle = await start(client, task_queue, goal="shell", workspace=str(workspace))
    ledger = workspace / "src" / "ledger.txt"
    async with asyncio.timeout(120):
        while not ledger.exists() or "started" not in ledger.read_text():
            await asyncio.sleep(0.05)
    (bwrap,) = [box.process.pid for key, box in RUN_SANDBOXES._sandboxes.items() if key[0] == str(workspace)]
    os.kill(sandbox_pid_1(bwrap), signal.SIGKILL)  # the helper, PID 1 of the sandbox
    assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "completed"
    # The killed command was not run again, and the next one ran in a new sandbox, in the recorded shell.
    assert ledger.read_text() == "started\nnext built\n"
    _, killed, next_one = tool_results(model_server.requests[-1])
    assert "killed by signal SIGKILL" in killed, killed
    assert next_one.startswith("exit code: 0"), next_one


def sandbox_pid_1(bwrap_pid: int) -> int:
    """The host pid of the helper that bubblewrap `bwrap_pid` runs as its sandbox's PID 1."""
    children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.parametrize("attacked", ["root"], indirect=True)  # root makes command cgroups on this machine
async def test_a_later_command_in_the_runs_sandbox_is_capped_by_its_own_cgroup(
    client: Client, attacked: Attacked
) -> None:
    """The second and third commands start from the standby child, already in their cgroups."""
    if not bombs_capped(attacked.user):
        skip_without("cgroup", "root without a writable cgroup: nothing caps a fork bomb")
    marker = f"bomb-{uuid.uuid4().hex[:12]}"
    bomb = "x = []\nwhile True: x.append(bytearray(2**24))"
    result, outputs = await attack(
        client,
        attacked,
        command("echo first"),
        command(f"python3 -c {shlex.quote(bomb)}; echo exit $? > bomb.txt", timeout_s=60),
        command(f": {marker}; :(){{ :|:& }};:; sleep 60", timeout_s=5),
        command("echo alive > alive.txt"),
    )
    assert result.state == "completed"
    memory = f"{SMALL_LIMITS.memory_bytes / 2**30:g} GiB"
    assert outputs[1].startswith(f"ERROR: command killed: its processes went over their memory limit ({memory})")
    assert outputs[2].startswith("ERROR: command timed out after 5 s")
    assert "fork: retry: Resource temporarily unavailable" in outputs[2]  # the kernel capped it
    assert (attacked.workspace / "alive.txt").read_text() == "alive\n"
    assert host_processes_named(marker) == []


@pytest.mark.usefixtures("worker")
async def test_a_secret_exported_by_a_command_is_never_recorded(
    client: Client, task_queue: str, workspace: Path, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in WORKER_ENV.items():
        monkeypatch.setenv(name, value)
    secret = WORKER_ENV["SOME_API_TOKEN"]
    model_server.responder = Script(
        [
            tools(command("export COPY=$SOME_API_TOKEN PLAIN=kept")),
            tools(command('echo "${COPY-unset} $PLAIN" > seen.txt')),
            answer("done"),
        ]
    )
    handle = await start(client, task_queue, goal="s", workspace=str(workspace), env_allow=["SOME_API_TOKEN"])
    assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "completed"
    states = [state for state in await recorded_shell_states(handle) if state is not None]
    assert states[0]["env"] == {"PLAIN": "kept"}  # COPY left out, not recorded redacted
    assert (workspace / "seen.txt").read_text() == "unset kept\n"
    history = json.dumps((await handle.fetch_history()).to_json_dict())
    assert secret not in history


async def recorded_shell_states(handle: Any) -> list[dict[str, Any] | None]:
    """The `shell` of every run_command outcome in the run's history, in order."""
    states = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_completed_event_attributes"):
            for payload in event.activity_task_completed_event_attributes.result.payloads:
                outcome = json.loads(payload.data)
                if isinstance(outcome, dict) and "shell" in outcome:
                    states.append(outcome["shell"])
    return states


async def test_a_process_left_running_cannot_outlive_the_run(client: Client, attacked: Attacked) -> None:
    marker = f"left-{uuid.uuid4().hex[:12]}"
    result, outputs = await attack(
        client,
        attacked,
        # Out of the command's process group, and (where it could) out of its cgroup's reach by time.
        command(f"setsid nohup bash -c 'exec -a {marker} sleep 300' > /dev/null 2>&1 & sleep 0.3; echo left"),
        command(f"pgrep -f {marker} > /dev/null && echo still-here || echo gone"),
    )
    assert result.state == "completed"
    assert host_processes_named(marker) == []


async def test_a_command_cannot_open_what_the_sandboxs_pid_1_holds(client: Client, attacked: Attacked) -> None:
    """The helper is PID 1 of the run's sandbox and of the commands' uid; not dumpable, so its
    descriptors (the worker's control socket among them), memory and environment stay closed."""
    probe = (
        "import os, sys\n"
        "def tried(open_):\n"
        "    try:\n"
        "        open_()\n"
        "        return 'opened'\n"
        "    except OSError as e:\n"
        "        return os.strerror(e.errno)\n"
        "for pid in ('1', 'self'):\n"
        "    for name in ('environ', 'mem'):\n"
        "        print(f'/proc/{pid}/{name}', tried(lambda: open(f'/proc/{pid}/{name}', 'rb').close()))\n"
        "    fds = [0, 1, 2, 3, 4, 5]  # PID 1's: the worker's control socket is among them\n"
        "    seen = {tried(lambda: os.readlink(f'/proc/{pid}/fd/{fd}')) for fd in fds}\n"
        "    seen |= {tried(lambda: os.open(f'/proc/{pid}/fd/{fd}', os.O_RDONLY)) for fd in fds}\n"
        "    print(f'/proc/{pid}/fd/N', ','.join(sorted(seen)))\n"
    )
    result, _ = await attack(client, attacked, command(f"python3 -c {shlex.quote(probe)} > pid1.txt 2>&1"))
    assert result.state == "completed"
    seen = dict(line.split(" ", 1) for line in (attacked.workspace / "pid1.txt").read_text().splitlines())
    denied = "Permission denied"
    assert seen["/proc/1/environ"] == seen["/proc/1/mem"] == seen["/proc/1/fd/N"] == denied, seen
    # The same opens of a process of that uid that is dumpable (the probe itself) succeed.
    assert seen["/proc/self/environ"] == seen["/proc/self/mem"] == "opened", seen
    assert "opened" in seen["/proc/self/fd/N"], seen


def processes_called(name: str) -> list[int]:
    """Host processes whose argv[0] is `name` (`exec -a`)."""
    return [pid for pid in host_processes_named(name) if _argv0(pid) == name]


def _argv0(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except OSError:
        return None


async def test_a_command_cannot_see_or_signal_another_runs_sandbox(workspace: Path) -> None:
    other_run = f"run-{uuid.uuid4().hex[:8]}"
    marker = f"other-{uuid.uuid4().hex[:12]}"
    activities = ToolActivities()
    other = asyncio.ensure_future(
        run_in_shell(activities, shell_call(workspace, other_run, f"bash -c 'exec -a {marker} sleep 120'; echo lived"))
    )
    try:
        async with asyncio.timeout(60):
            while not (pids := processes_called(marker)):  # the `sleep`, not the shells around it
                await asyncio.sleep(0.05)
        attack_ = (
            f"ps -eo pid,args > ps.txt; ls /proc > proc.txt; kill -KILL {' '.join(map(str, pids))} 2>&1; "
            "kill -KILL -1; for p in /proc/[0-9]*; do kill -KILL ${p#/proc/} 2>/dev/null; done; echo tried"
        )
        await run_in_shell(activities, shell_call(workspace, f"run-{uuid.uuid4().hex[:8]}", attack_))
        assert marker not in (workspace / "ps.txt").read_text()
        assert all(str(pid) not in (workspace / "proc.txt").read_text().split() for pid in pids)
        assert processes_called(marker) == pids  # untouched
        os.kill(pids[0], signal.SIGTERM)  # its shell goes on after it
        outcome = await other
        assert outcome.ok and outcome.output.startswith("exit code: 0") and "lived" in outcome.output, outcome
    finally:
        other.cancel()
        await RUN_SANDBOXES.end_run(str(workspace), other_run)


@pytest.mark.parametrize(("magic", "runs"), [(None, "the code compiled by the worker"), (b"\0\0\r\n", "the source")])
def test_the_helpers_loader_runs_the_workers_code_only_in_an_interpreter_of_the_same_bytecode(
    magic: bytes | None, runs: str
) -> None:
    """The sandbox's python3 is the host's, not the worker's: where their bytecode differs,
    the helper is compiled from its source in the sandbox."""
    shown = "import sys; sys.stdout.write(sys._getframe().f_code.co_filename)"
    given = helper_input(shown) if magic is None else helper_input(shown, magic)
    loaded = subprocess.run(
        [sandbox_python(), "-I", "-S", "-c", HELPER_LOADER], input=given, capture_output=True, check=True
    )
    theirs = subprocess.run(
        [
            sandbox_python(),
            "-I",
            "-S",
            "-c",
            "import sys, _frozen_importlib_external as b; sys.stdout.buffer.write(b.MAGIC_NUMBER)",
        ],
        capture_output=True,
        check=True,
    ).stdout
    compiled_here = magic is None and theirs == MAGIC_NUMBER  # a host's python3 of another version compiles
    assert loaded.stdout == (b"shell_helper.py" if compiled_here else b"<string>"), runs


async def test_one_sandbox_serves_all_of_a_runs_commands(workspace: Path) -> None:
    activities = ToolActivities()
    run = f"run-{uuid.uuid4().hex[:8]}"
    first = await run_in_shell(activities, shell_call(workspace, run, "sleep 30 > /dev/null & echo $$ > /tmp/first"))
    assert first.ok, first
    second = await run_in_shell(activities, shell_call(workspace, run, "cat /tmp/first; ps -eo pid= | wc -l"))
    # Same /tmp (one sandbox), and the first command's background sleep is gone (PID 1, this shell, ps, wc).
    lines = second.output.splitlines()
    assert lines[0] == "exit code: 0" and lines[1].isdigit() and int(lines[2]) == 4, second
    assert await RUN_SANDBOXES.end_run(str(workspace), run) == 1
    third = await run_in_shell(activities, shell_call(workspace, run, "cat /tmp/first 2>&1"))
    assert "No such file" in third.output  # a new sandbox after the run's was ended
    await RUN_SANDBOXES.end_run(str(workspace), run)


async def test_a_command_in_the_runs_sandbox_runs_under_its_limits_and_its_own_cgroup(workspace: Path) -> None:
    limits = CommandLimits(cpu_s=77, address_space_bytes=3 * 2**30, processes=99, file_bytes=5 * 2**20, open_files=123)
    run = f"run-{uuid.uuid4().hex[:8]}"
    activities = ToolActivities(command_limits=limits)
    try:
        outcome = await run_in_shell(activities, shell_call(workspace, run, "cat /proc/self/limits /proc/self/cgroup"))
        again = await run_in_shell(activities, shell_call(workspace, run, "cat /proc/self/cgroup"))
    finally:
        await RUN_SANDBOXES.end_run(str(workspace), run)
    assert outcome.ok, outcome
    limit = {line[:26].strip(): line[26:].split()[:2] for line in outcome.output.splitlines()}
    assert limit["Max cpu time"] == ["77", "77"]
    assert limit["Max address space"] == [str(3 * 2**30)] * 2
    assert limit["Max file size"] == [str(5 * 2**20)] * 2
    assert limit["Max open files"] == ["123", "123"]
    assert limit["Max core file size"] == ["0", "0"]
    _, worker_hard = resource.getrlimit(resource.RLIMIT_NPROC)
    assert limit["Max processes"] == [str(99 if worker_hard == resource.RLIM_INFINITY else min(99, worker_hard))] * 2
    if cgroups_available():  # each command its own cgroup: a pids line naming a command cgroup, another each time
        groups = [next(line for line in o.output.splitlines() if ":pids:" in line) for o in (outcome, again)]
        assert all(CGROUP_PREFIX in line for line in groups) and groups[0] != groups[1], groups


async def test_a_runs_sandbox_ends_after_its_idle_timeout(workspace: Path) -> None:
    sandboxes = RunSandboxes(idle_s=0.5)
    key = (str(workspace), "idle-run", False)
    sandbox = await sandboxes.acquire(key, str(workspace))
    sandboxes.release(key, sandbox)
    await asyncio.wait_for(sandbox.process.wait(), timeout=30)  # ended by the idle timer, nothing else
    assert len(sandboxes) == 0
    again = await sandboxes.acquire(key, str(workspace))  # the next command gets a new one
    assert again is not sandbox and again.alive()
    sandboxes.release(key, again)
    assert await sandboxes.end_run(str(workspace), "idle-run") == 1


async def test_a_shell_state_too_large_to_send_keeps_the_directory_and_drops_the_variables(
    workspace: Path,
) -> None:
    """A command that exports 300 KB (more than the helper's socket takes in one message) still
    ends; its directory is kept, its variables are not (as for any state over MAX_STATE_CHARS)."""
    run = f"run-{uuid.uuid4().hex[:8]}"
    activities = ToolActivities()
    huge = "mkdir -p src && cd src && export SMALL=1 HUGE=$(head -c 300000 /dev/zero | tr '\\0' x) && echo set"
    try:
        first = await asyncio.wait_for(run_in_shell(activities, shell_call(workspace, run, huge)), 60)
        assert first.ok and "set" in first.output, first
        assert first.shell == ShellState(cwd=f"{workspace}/src"), first.shell
        second = await run_in_shell(
            activities, shell_call(workspace, run, 'echo "${SMALL-unset}" > s.txt', first.shell)
        )
        assert second.ok and (workspace / "src" / "s.txt").read_text() == "unset\n"
    finally:
        await RUN_SANDBOXES.end_run(str(workspace), run)
