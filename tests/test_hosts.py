"""Many hosts: two workers stand for two machines, each in a mount namespace of its own where
the other's workspace folder is hidden (a tmpfs over it), on one task queue.

A tool call that landed on the wrong host would write into that host's empty tmpfs, not the
real folder: the files in the real folders, and the identity of the worker that ran each
activity in history, say where every call ran. `python -m bench hosts` runs 2 x 10 runs; the
test runs 2 x 3 (CI's 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from bench.hosts import ANYWHERE, LOCAL, WORKSPACE_FREE, activity_places
from durable_agent.model_server import ModelServer, count_assistant_turns
from durable_agent.processes import WORKER_SCRIPT, kill_hard, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import rejected_update, skip_without, start, until, wait_for
from tests.scripts import ByGoal, Script, answer, goal_of, tools
from tests.test_crash import worker_env
from workflows.hosts import HOST_FIRST_PROBE, host_queue
from workflows.types import ALL_TOOLS

HOSTS = ("alpha", "beta")
RUNS_PER_HOST = 3
DURABLE_AGENT = str(Path(sys.executable).parent / "durable-agent")
TOOLS = [*ALL_TOOLS, "host_note"]
MCP_FIXTURE = Path(__file__).parent / "mcp_fixture_server.py"
"""The built-in tools and a user's tool declared workspace-bound (tests/host_tools.py)."""


HOLD = "echo 2 >> ledger.txt; until [ -e go ]; do sleep 0.05; done"
"""Step 2's command: it holds until the workspace has `go` (the sandbox shows it nothing else)."""


def script() -> Script:
    """Two steps and the answer."""
    return Script(
        [
            tools(
                ("write_file", {"path": "notes.txt", "content": "one"}),
                ("run_command", {"command": "echo 1 >> ledger.txt"}),
                ("host_note", {"text": "here"}),
            ),
            tools(
                ("read_file", {"path": "notes.txt"}),
                ("run_command", {"command": HOLD}),
            ),
            answer("done"),
        ]
    )


@pytest.fixture
def namespaces() -> None:
    if os.geteuid() != 0:
        skip_without("root", "two hosts need mount namespaces (unshare -m, as root)")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        skip_without("root", f"unshare -m failed: {probe.stderr.decode().strip()}")


class Fleet:
    """One worker per host, each seeing its own folder and not the other's."""

    def __init__(self, env: dict[str, str], root: Path, logs: Path) -> None:
        self.env, self.root, self.logs = env, root, logs
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.pids: dict[int, str] = {}
        for host in HOSTS:
            self.folder(host).mkdir(parents=True)

    def folder(self, host: str) -> Path:
        return self.root / host

    def spawn(self, host: str) -> None:
        hidden = [str(self.folder(other)) for other in HOSTS if other != host]
        mounts = " && ".join(f'mount -t tmpfs tmpfs "{path}"' for path in hidden)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{host}.log", "ab") as log:
            process = subprocess.Popen(
                ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" "$1"', sys.executable, str(WORKER_SCRIPT)],
                env={**os.environ, **self.env, "DURABLE_AGENT_HOST": host},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.workers[host] = process
        self.pids[process.pid] = host  # unshare and sh exec: the worker keeps this pid

    def kill(self, host: str) -> None:
        kill_hard(self.workers[host])

    def stop(self) -> None:
        for process in self.workers.values():
            stop_gently(process)


@pytest.fixture
def fleet(
    namespaces: None, temporal_server: EmbeddedServer, model_server: ModelServer, task_queue: str, tmp_path: Path
) -> Iterator[Fleet]:
    env = {**worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_TOOLS": "tests.host_tools"}
    running = Fleet(env, tmp_path / "hosts", tmp_path / "logs")
    try:
        for host in HOSTS:
            running.spawn(host)
        yield running
    finally:
        running.stop()


async def start_runs(client: Client, task_queue: str, fleet: Fleet, released: bool) -> dict[str, list[WorkflowHandle]]:
    runs: dict[str, list[WorkflowHandle]] = {}
    for host in HOSTS:
        for n in range(RUNS_PER_HOST):
            workspace = fleet.folder(host) / f"ws{n}"
            workspace.mkdir()
            if released:
                (workspace / "go").touch()
            handle = await start(
                client, task_queue, goal=f"{host} run {n}", workspace=str(workspace), host=host, tools=TOOLS
            )
            runs.setdefault(host, []).append(handle)
    return runs


async def where_activities_ran(handle: WorkflowHandle) -> list[tuple[str, str, int]]:
    """(activity type, task queue or LOCAL, pid of the worker that ran it) of every activity of
    the run that ran on its host or the shared queue (bench/hosts.py)."""
    ran = []
    for name, queue, pid, summary in await activity_places(handle):
        if queue == ANYWHERE:
            # Read no workspace: the host probe and the tool catalog (of tools only: one that
            # lists MCP servers runs where they start, on the host).
            assert name in WORKSPACE_FREE and b"fx" not in summary, f"a workspace-bound local activity ran: {summary}"
        else:
            ran.append((name, queue, pid))
    return ran


def ledger(folder: Path) -> list[str]:
    path = folder / "ledger.txt"
    return path.read_text().split() if path.exists() else []


def model_calls_by_run(model_server: ModelServer) -> Counter[str]:
    return Counter(goal_of(request) for request in model_server.requests)


async def test_every_tool_call_runs_on_its_runs_host(
    client: Client, fleet: Fleet, model_server: ModelServer, task_queue: str, tmp_path: Path
) -> None:
    model_server.responder = script()
    runs = await start_runs(client, task_queue, fleet, released=True)
    results = await asyncio.wait_for(
        asyncio.gather(*(h.result() for handles in runs.values() for h in handles)), timeout=180
    )
    assert [r.state for r in results] == ["completed"] * len(results)
    calls = model_calls_by_run(model_server)
    local: Counter[str] = Counter()
    for host, handles in runs.items():
        for n, handle in enumerate(handles):
            folder = fleet.folder(host) / f"ws{n}"
            assert ledger(folder) == ["1", "2"]  # every command once, in the real folder of its host
            assert (folder / "notes.txt").read_text() == "one"
            assert (folder / "tool-notes.txt").read_text() == f"here {fleet.workers[host].pid}\n"  # the user's tool
            assert calls[f"{host} run {n}"] == 3  # one per step, and the final answer
            for name, queue, pid in await where_activities_ran(handle):
                if name == "call_model":
                    assert queue == task_queue
                elif name == "host_note":
                    assert queue == host_queue(f"{task_queue}/tool/host_note", host)
                    assert fleet.pids.get(pid) == host
                else:
                    assert queue in (LOCAL, host_queue(task_queue, host)), name
                    assert fleet.pids.get(pid) == host, f"{name} of a run on {host} ran on {fleet.pids.get(pid)}"
                    local[host] += queue == LOCAL
    # A run whose workflow task ran on its host's worker made its file calls there locally
    # (a run keeps to its host once there; under load some tasks may land elsewhere).
    assert all(local[host] > 0 for host in HOSTS), local


async def test_runs_wait_for_a_killed_host_and_finish_when_it_comes_back(
    client: Client, fleet: Fleet, model_server: ModelServer, task_queue: str, tmp_path: Path
) -> None:
    model_server.responder = script()
    runs = await start_runs(client, task_queue, fleet, released=False)
    await until(lambda: all(ledger(fleet.folder("alpha") / f"ws{n}") == ["1", "2"] for n in range(RUNS_PER_HOST)))
    fleet.kill("alpha")  # during step 2's commands
    for host in HOSTS:
        for n in range(RUNS_PER_HOST):
            (fleet.folder(host) / f"ws{n}" / "go").touch()
    beta = await asyncio.wait_for(asyncio.gather(*(h.result() for h in runs["beta"])), timeout=120)
    assert [r.state for r in beta] == ["completed"] * RUNS_PER_HOST  # the other host's runs finish meanwhile
    for handle in runs["alpha"]:
        status = await wait_for(handle, lambda s: s.host_wait is not None, timeout_s=60)
        assert status.state == "running" and status.host_wait.startswith("waiting for host alpha since ")
        assert status.activity == status.host_wait
    listing = await asyncio.create_subprocess_exec(
        DURABLE_AGENT, "hosts", stdout=asyncio.subprocess.PIPE, env={**os.environ, **fleet.env}
    )
    rows = {line.split()[0]: line for line in (await listing.communicate())[0].decode().splitlines()[1:]}
    assert set(rows) >= set(HOSTS)
    assert all(h.id in rows["alpha"] for h in runs["alpha"])  # its runs, each waiting for it
    assert str(fleet.workers["beta"].pid) in rows["beta"] and "s ago" in rows["beta"]  # who polls, when last
    listing = await asyncio.create_subprocess_exec(
        DURABLE_AGENT, "list", "--waiting-for-host", stdout=asyncio.subprocess.PIPE, env={**os.environ, **fleet.env}
    )
    listed = {line.split()[0] for line in (await listing.communicate())[0].decode().splitlines()[1:]}
    # Other tests' runs may wait too (the session's server is shared): alpha's all, beta's none.
    assert listed >= {h.id for h in runs["alpha"]} and not listed & {h.id for h in runs["beta"]}
    fleet.spawn("alpha")
    alpha = await asyncio.wait_for(asyncio.gather(*(h.result() for h in runs["alpha"])), timeout=120)
    assert [r.state for r in alpha] == ["completed"] * RUNS_PER_HOST
    for host in HOSTS:
        for n in range(RUNS_PER_HOST):
            assert ledger(fleet.folder(host) / f"ws{n}") == ["1", "2"]
    turns = Counter((goal_of(r), count_assistant_turns(r)) for r in model_server.requests)
    for host in HOSTS:
        for n in range(RUNS_PER_HOST):
            repeated = sum(count - 1 for (goal, _), count in turns.items() if goal == f"{host} run {n}")
            assert repeated <= 1  # at most one repeated model call per run
    # Never failed nor needing attention while it waited: AgentState went running -> completed.
    for handle in runs["alpha"]:
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
                fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
                if "AgentState" in fields:
                    assert b"needs_attention" not in fields["AgentState"].data


async def test_move_restores_the_last_step_on_the_other_host(
    client: Client, fleet: Fleet, model_server: ModelServer, task_queue: str, tmp_path: Path
) -> None:
    model_server.responder = script()
    workspace = fleet.folder("alpha") / "moved"
    workspace.mkdir()
    handle = await start(
        client,
        task_queue,
        goal="move me",
        workspace=str(workspace),
        host="alpha",
        tools=TOOLS,
        snapshot_exclude=["node_modules"],
    )
    in_beta = ["nsenter", "-t", str(fleet.workers["beta"].pid), "-m"]
    installed = 'mkdir -p "$0/node_modules" && echo built-on-beta > "$0/node_modules/dep.js"'
    subprocess.run([*in_beta, "sh", "-c", installed, str(workspace)], check=True)  # beta's own, left by the move
    await until(lambda: ledger(workspace) == ["1", "2"])
    fleet.kill("alpha")
    await wait_for(handle, lambda s: s.host_wait is not None, timeout_s=60)
    no_store = {k: v for k, v in os.environ.items() if k != "DURABLE_AGENT_SNAPSHOT_STORE"}
    refused = subprocess.run(
        [DURABLE_AGENT, "move", handle.id, "--to-host", "beta"], env=no_store, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "DURABLE_AGENT_SNAPSHOT_STORE is not set" in refused.stdout
    assert len(refused.stdout.strip().splitlines()) == 1
    moved = await asyncio.create_subprocess_exec(DURABLE_AGENT, "move", handle.id, "--to-host", "beta")
    assert await moved.wait() == 0
    await wait_for(handle, lambda s: any(m.startswith("moved to beta") for m in s.host_moves), timeout_s=60)
    # After the restore (which resets the folder); mkdir, so that a move without one shows in the ledger.
    subprocess.run([*in_beta, "sh", "-c", 'mkdir -p "$0" && touch "$0/go"', str(workspace)], check=True)
    result = await asyncio.wait_for(handle.result(), timeout=120)
    assert result.state == "completed"
    # On beta, the folder holds step 1's snapshot plus step 2's command, run there.
    beta_view = subprocess.run(
        [*in_beta, "cat", str(workspace / "ledger.txt")], capture_output=True, text=True, check=True
    )
    assert beta_view.stdout.split() == ["1", "2"]
    beta_dep = [*in_beta, "cat", str(workspace / "node_modules" / "dep.js")]
    assert subprocess.run(beta_dep, capture_output=True, text=True, check=True).stdout == "built-on-beta\n"
    ran = await where_activities_ran(handle)
    restores = [(queue, fleet.pids.get(pid)) for name, queue, pid in ran if name == "restore_snapshot"]
    assert restores == [(host_queue(task_queue, "beta"), "beta")]
    assert any(name == "run_command" and fleet.pids.get(pid) == "beta" for name, _, pid in ran)


async def test_a_host_no_worker_has_shows_at_once_and_needs_attention_after_its_wait(
    client: Client, worker: Worker, model_server: ModelServer, task_queue: str, workspace: Path
) -> None:
    model_server.responder = script()
    handle = await start(
        client, task_queue, goal="typo", workspace=str(workspace), host="alhpa", limits={"host_wait_s": 20}
    )
    status = await wait_for(handle, lambda s: s.host_wait is not None, timeout_s=30)
    assert status.state == "running" and status.host_wait.startswith("waiting for host alhpa since ")
    # At once: the run's own probe (before its first call there) said so, not the call's first
    # schedule-to-start timeout (HOST_FIRST_PROBE); the server's clock, not this test's, says when.
    assert status.host_wait.endswith("(no worker has polled host alhpa)")
    assert await seconds_to_know_the_host_is_unseen(handle) < HOST_FIRST_PROBE.total_seconds()
    # The Web UI's current details, and `durable-agent status`, say so.
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert f"Now: {status.host_wait}" in metadata.current_details and "Host: alhpa" in metadata.current_details
    shown = await asyncio.create_subprocess_exec(DURABLE_AGENT, "status", handle.id, stdout=asyncio.subprocess.PIPE)
    out = (await asyncio.wait_for(shown.communicate(), 60))[0].decode()  # the loop runs the worker meanwhile
    assert "now: waiting for host alhpa since " in out and "host: alhpa" in out
    assert "on host alhpa already" in await rejected_update(handle, "move_host", {"host": "alhpa"})
    status = await wait_for(handle, lambda s: s.state == "needs_attention", timeout_s=90)
    assert status.attention is not None and status.attention.call_id == "host"
    assert any(action.startswith("move:") for action in status.attention.suggested_actions)
    assert model_server.requests == []  # nothing ran: the workspace check waits for the host
    await handle.execute_update("resolve", {"action": "terminate"})
    result = await asyncio.wait_for(handle.result(), timeout=30)
    assert result.state == "terminated"


def child_script(host: str) -> Script:
    return Script(
        [
            tools(
                ("write_file", {"path": f"child-{host}.txt", "content": host}),
                ("run_command", {"command": f"echo {host} >> ledger.txt"}),
            )
        ],
        final=f"{host} child done",
    )


def seen_from(host_pid: int, path: Path) -> str | None:
    """`path` as the process `host_pid` sees it, in its own mount namespace."""
    shown = subprocess.run(["nsenter", "-t", str(host_pid), "-m", "cat", str(path)], capture_output=True)
    return shown.stdout.decode() if shown.returncode == 0 else None


async def test_a_delegate_that_names_another_host_runs_its_tools_there(
    client: Client, fleet: Fleet, model_server: ModelServer, task_queue: str
) -> None:
    """A run on alpha delegates twice at once: one delegate inherits alpha, the other names
    beta and works in the folder at the same path on beta (beta's own: alpha's is hidden there)."""
    workspace = fleet.folder("alpha") / "ws"
    workspace.mkdir()
    beta_pid = fleet.workers["beta"].pid
    mounts = Path(f"/proc/{beta_pid}/mountinfo")
    await until(lambda: f" {fleet.folder('alpha')} " in mounts.read_text())  # beta hides alpha's folder
    made = subprocess.run(["nsenter", "-t", str(beta_pid), "-m", "mkdir", "-p", str(workspace)], capture_output=True)
    assert made.returncode == 0, made.stderr
    delegates = tools(("delegate", {"goal": "on alpha"}), ("delegate", {"goal": "on beta", "host": "beta"}))
    model_server.responder = ByGoal(
        {
            "parent": Script([delegates], final="both done"),
            "on alpha": child_script("alpha"),
            "on beta": child_script("beta"),
        }
    )
    handle = await start(client, task_queue, goal="parent", workspace=str(workspace), host="alpha", tools=TOOLS)
    result = await asyncio.wait_for(handle.result(), timeout=180)
    assert result.state == "completed", result
    assert ledger(workspace) == ["alpha"] and not (workspace / "child-beta.txt").exists()
    assert (workspace / "child-alpha.txt").read_text() == "alpha"
    assert seen_from(beta_pid, workspace / "ledger.txt") == "beta\n"
    assert seen_from(beta_pid, workspace / "child-beta.txt") == "beta"
    history = await handle.fetch_history()
    children = {
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    }
    on_host = {}
    for child_id in children:
        child = client.get_workflow_handle(child_id)
        ran = await where_activities_ran(child)
        hosts = {fleet.pids.get(pid) for name, _, pid in ran if name != "call_model"}
        assert len(hosts) == 1, ran  # every tool call of a delegate on its one host
        on_host[hosts.pop()] = child_id
    assert set(on_host) == {"alpha", "beta"}


async def seconds_to_know_the_host_is_unseen(handle: WorkflowHandle) -> float:
    """From the run's start to the end of the workflow task that recorded its host probe."""
    started = completed = None
    async for event in handle.fetch_history_events():
        if started is None:
            started = event.event_time.ToDatetime()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            completed = event.event_time.ToDatetime()  # a task's markers follow its completion
        summary = event.user_metadata.summary.data
        if event.marker_recorded_event_attributes.marker_name == "core_local_activity" and b"host_pollers:" in summary:
            assert started is not None and completed is not None
            return (completed - started).total_seconds()
    raise AssertionError("the run recorded no host probe")


async def test_run_on_a_machine_with_a_host_name_pins_the_run_to_it(
    client: Client, worker: Worker, model_server: ModelServer, task_queue: str, workspace: Path
) -> None:
    env = {**os.environ, "DURABLE_AGENT_TASK_QUEUE": task_queue, "DURABLE_AGENT_HOST": "this-machine"}
    started = await asyncio.create_subprocess_exec(
        *(
            DURABLE_AGENT,
            "run",
            "pin me",
            "--workspace",
            str(workspace),
            "--no-worker",
            "--detach",
            "--id",
            "pin-me-" + task_queue,
        ),
        env=env,
    )
    assert await asyncio.wait_for(started.wait(), 60) == 0
    handle = client.get_workflow_handle("pin-me-" + task_queue)
    status = await wait_for(handle, lambda s: s.host is not None)
    assert status.host == "this-machine"
    await handle.cancel()


async def test_a_pinned_runs_mcp_server_runs_on_its_host(
    namespaces: None,
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    tmp_path: Path,
) -> None:
    """An MCP stdio server starts in the run's workspace: on the run's host, for its tool list,
    its calls and its close, never on the other host (which cannot see the workspace)."""
    config = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": [str(MCP_FIXTURE)], "approve": "never"}
    config.write_text(json.dumps({"mcpServers": {"fx": server}}))
    env = {**worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_MCP_CONFIG": str(config)}
    hosts = Fleet(env, tmp_path / "hosts", tmp_path / "logs")
    model_server.responder = Script([tools(("mcp__fx__append_line", {"path": "mcp.txt", "line": "x"}))], final="done")
    try:
        for host in HOSTS:
            hosts.spawn(host)
        runs = {}
        for host in HOSTS:
            workspace = hosts.folder(host) / "ws"
            workspace.mkdir()
            runs[host] = await start(
                client, task_queue, goal=f"{host} mcp", workspace=str(workspace), host=host, mcp_servers=["fx"]
            )
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in runs.values())), timeout=120)
    finally:
        hosts.stop()
    assert [r.state for r in results] == ["completed", "completed"], results
    for host, handle in runs.items():
        assert (hosts.folder(host) / "ws" / "mcp.txt").read_text() == "x\n"  # written by its host's server
        ran = {(name, queue, hosts.pids.get(pid)) for name, queue, pid in await where_activities_ran(handle)}
        assert {("tool_catalog", LOCAL, host), ("tool_catalog", host_queue(task_queue, host), host)} & ran, ran
        for name in ("mcp_call", "mcp_close"):
            assert (name, host_queue(task_queue, host), host) in ran, (name, ran)
