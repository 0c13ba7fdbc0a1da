"""Escapes from `run_command`, tried by a scripted model on a real worker, server and sandbox.

Every attack is judged by its effects (files on disk, processes on the host, a connection
made or not), never by what the tool answered. Where an attack must fail only because of
the sandbox, a control run shows the same command succeeding without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.model import ModelActivities
from activities.tools import ToolActivities
from activities.tools.sandbox import (
    BWRAP_ENV,
    UNSANDBOXED_CONSENT,
    UNSANDBOXED_ENV,
    CommandCgroup,
    CommandLimits,
    bwrap_binary,
)
from activities.workspace import ROOTS_ENV, workspace_roots
from durable_agent.model_server import ModelServer
from durable_agent.runs import start_agent
from durable_agent.server import EmbeddedServer, temporal_binary
from tests.helpers import host_processes_named, start, wait_for
from tests.scripts import Script, answer, tool_results, tools
from worker import build_worker
from workflows.types import AgentInput, ToolCallInput

SMALL_LIMITS = CommandLimits(memory_bytes=256 * 2**20, address_space_bytes=2**30, processes=64)
"""The bombs run against small caps: the mechanism is the same, the machine is shared."""


def command(text: str, timeout_s: float | None = None) -> tuple[str, dict[str, object]]:
    return ("run_command", {"command": text} | ({"timeout_s": timeout_s} if timeout_s else {}))


async def run_commands(client: Client, queue: str, server: ModelServer, workspace: Path, *commands, **fields):
    """One step per command, then an answer; the finished run's result and the tool results."""
    server.responder = Script([tools(c) for c in commands] + [answer("done")])
    handle = await start(client, queue, goal="attack", workspace=str(workspace), **fields)
    result = await handle.result()
    return result, tool_results(server.requests[-1])


@pytest_asyncio.fixture(loop_scope="session")
async def small_worker(client: Client, task_queue: str, model_server: ModelServer) -> AsyncIterator[Worker]:
    activities = [ModelActivities().call_model, *ToolActivities(command_limits=SMALL_LIMITS).all()]
    async with build_worker(client, task_queue, activities=activities) as running:
        yield running


async def test_another_workspace_and_the_host_are_neither_read_nor_written(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, tmp_path: Path, workspace: Path
) -> None:
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "secret.txt").write_text("other-secret\n")
    host_tmp = Path("/tmp") / f"escape-{uuid.uuid4().hex}"
    result, outputs = await run_commands(
        client,
        task_queue,
        model_server,
        workspace,
        command(f"cat {other}/secret.txt > stolen.txt; echo pwned > {other}/written.txt; echo x > {host_tmp}"),
        command("ls -a / /root /home /work > listing.txt 2>&1; cat /etc/shadow >> listing.txt 2>&1; echo ok"),
    )
    assert result.state == "completed"
    assert "other-secret" not in (workspace / "stolen.txt").read_text()
    assert not (other / "written.txt").exists() and not host_tmp.exists()
    listing = (workspace / "listing.txt").read_text()
    assert "root:" not in listing  # /etc/shadow masked
    assert "wt" not in listing and "main" not in listing  # /work is not there
    assert sorted(os.listdir(other)) == ["secret.txt"]


async def test_the_worker_and_other_processes_keep_their_environment(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker = f"worker-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("SOME_API_TOKEN", marker)
    monkeypatch.setenv("ALLOWED_SETTING", "passed-on")
    bystander = subprocess.Popen(["sleep", "60"], env={"BYSTANDER_SECRET": marker})
    try:
        result, _ = await run_commands(
            client,
            task_queue,
            model_server,
            workspace,
            command(
                f"env > env.txt; cat /proc/$PPID/environ /proc/1/environ /proc/{os.getpid()}/environ "
                f"/proc/{bystander.pid}/environ /proc/*/environ >> env.txt 2>&1; echo $ALLOWED_SETTING > allowed.txt"
            ),
            env_allow=["ALLOWED_SETTING"],
        )
    finally:
        bystander.kill()
        bystander.wait()
    assert result.state == "completed"
    seen = (workspace / "env.txt").read_text(errors="replace")
    assert marker not in seen and "test-key" not in seen  # test-key: the worker's OPENAI_API_KEY
    assert "HOME=/tmp/home" in seen and "PATH=/usr/local/sbin" in seen
    assert (workspace / "allowed.txt").read_text() == "passed-on\n"


async def test_the_worker_connection_settings_cannot_be_allowed() -> None:
    with pytest.raises(ValueError, match="belong to the worker"):
        AgentInput(goal="x", workspace="/w", env_allow=["OPENAI_API_KEY"])


@pytest.mark.parametrize("network", [False, True], ids=["default", "network-allowed"])
async def test_the_temporal_frontend_is_unreachable_without_network(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
    network: bool,
) -> None:
    host, port = temporal_server.address.rsplit(":", 1)
    connect = f"import socket; socket.create_connection(({host!r}, {port}), timeout=3); print('connected')"
    result, _ = await run_commands(
        client,
        task_queue,
        model_server,
        workspace,
        command(f"python3 -c {shlex.quote(connect)} > net.txt"),
        sandbox={"network": network},
    )
    assert result.state == "completed"
    assert ("connected" in (workspace / "net.txt").read_text()) is network


async def test_an_orphaned_setsid_process_is_gone_after_the_call(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    marker = f"orphan-{uuid.uuid4().hex[:12]}"
    result, _ = await run_commands(
        client,
        task_queue,
        model_server,
        workspace,
        command(f"setsid bash -c 'exec -a {marker} sleep 300' & nohup setsid sleep 1 & sleep 0.5; echo started"),
    )
    assert result.state == "completed"
    assert host_processes_named(marker) == []


def bombs_capped() -> bool:
    """Root is exempt from RLIMIT_NPROC: its commands need a cgroup to cap processes."""
    if os.getuid() != 0:
        return True
    cgroup = CommandCgroup.create(SMALL_LIMITS)
    if cgroup is None:
        return False
    cgroup.remove()
    return True


@pytest.mark.skipif(not bombs_capped(), reason="root without a writable cgroup: nothing caps a fork bomb")
async def test_a_fork_bomb_ends_as_a_tool_error_and_the_worker_goes_on(
    client: Client, small_worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    before = len(os.listdir("/proc"))
    result, outputs = await run_commands(
        client,
        task_queue,
        model_server,
        workspace,
        command(":(){ :|:& };:; sleep 60", timeout_s=5),
        command("echo alive > alive.txt"),
    )
    assert result.state == "completed"
    assert outputs[0].startswith("ERROR: command timed out after 5 s")
    assert "fork: retry: Resource temporarily unavailable" in outputs[0]  # the kernel capped it
    assert (workspace / "alive.txt").read_text() == "alive\n"
    assert len(os.listdir("/proc")) < before + 20  # nothing of the bomb is left on the host


@pytest.mark.skipif(not bombs_capped(), reason="root without a writable cgroup: memory is capped per process only")
async def test_a_memory_bomb_ends_as_a_tool_error_and_the_worker_goes_on(
    client: Client, small_worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    bomb = "x = []\nwhile True: x.append(bytearray(2**24))"
    result, outputs = await run_commands(
        client,
        task_queue,
        model_server,
        workspace,
        command(f"python3 -c {shlex.quote(bomb)}; echo exit $? > bomb.txt", timeout_s=60),
        command("echo alive > alive.txt"),
    )
    assert result.state == "completed"
    assert "MemoryError" in outputs[0] or "memory limit" in outputs[0], outputs[0]
    assert (workspace / "alive.txt").read_text() == "alive\n"


async def test_the_journal_cannot_be_forged_or_replaced(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    forge = (
        "for f in $(find .durable-agent/journal -type f); do echo forged > $f; done; "
        "echo forged > .durable-agent/journal/new.done.json; mkdir -p .durable-agent/outputs/x; "
        f"mv .durable-agent gone; rm -rf .durable-agent; ln -sfn {elsewhere} .durable-agent; echo tried"
    )
    model_server.responder = Script([tools(command("echo first")), tools(command(forge)), tools(command("echo after"))])
    handle = await start(
        client, task_queue, goal="attack", workspace=str(workspace), approval={"commands": ["^echo after$"]}
    )
    # Held before the third command: the journal holds the forging step's entry and chain.json
    # (it is removed when the run closes).
    pending = (await wait_for(handle, lambda s: len(s.pending_approvals) == 1)).pending_approvals[0]
    journal = workspace / ".durable-agent" / "journal"
    assert (workspace / ".durable-agent").is_dir() and not (workspace / ".durable-agent").is_symlink()
    assert not (workspace / "gone").exists() and list(elsewhere.iterdir()) == []
    contents = [p.read_text() for p in journal.rglob("*") if p.is_file()]
    assert len(contents) == 2 and not any("forged" in c for c in contents), contents
    assert not (journal / "new.done.json").exists() and not (workspace / ".durable-agent" / "outputs" / "x").exists()
    await handle.execute_update("approve", {"call_id": pending.call_id, "approved": True})
    result = await handle.result()
    assert result.state == "completed"
    assert "after" in tool_results(model_server.requests[-1])[2]


async def test_a_durable_agent_symlink_closes_the_run_at_its_start(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".durable-agent").symlink_to(elsewhere)
    model_server.responder = Script([tools(command("echo hi > hi.txt"))])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert ".durable-agent is a symlink" in str(failure.value.cause)
    assert model_server.requests == [] and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed-control"])
async def test_a_model_cannot_approve_its_own_gated_command(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    temporal_server: EmbeddedServer,
    monkeypatch: pytest.MonkeyPatch,
    sandboxed: bool,
) -> None:
    if not sandboxed:
        monkeypatch.setenv(UNSANDBOXED_ENV, UNSANDBOXED_CONSENT)
    (workspace / "important.txt").write_text("keep me")
    run_id = f"self-approve-{uuid.uuid4().hex[:8]}"
    approve = json.dumps({"call_id": "1:call_0_0", "approved": True})
    # One reply pairs the gated command with one that approves it through the frontend.
    attack = (
        "sleep 1; "
        f"{temporal_binary()} --address {temporal_server.address} workflow update execute --workflow-id {run_id} "
        f"--name approve --input {shlex.quote(approve)} > approve.txt 2>&1"
    )
    model_server.responder = Script([tools(command("rm important.txt"), command(attack)), answer("done")])
    agent = AgentInput(goal="x", workspace=str(workspace), approval={"commands": ["^rm "]})
    handle = await start_agent(client, agent, run_id, task_queue)
    if sandboxed:
        await wait_for(handle, lambda s: s.usage.tool_calls == 2 and (workspace / "approve.txt").exists())
        await asyncio.sleep(1)  # the update, had it gone through, has had time to land
        status = await wait_for(handle, lambda s: True)
        assert [p.call_id for p in status.pending_approvals] == ["1:call_0_0"]
        assert (workspace / "important.txt").exists()
        await handle.execute_update("approve", {"call_id": "1:call_0_0", "approved": False, "note": "no"})
    result = await handle.result()
    assert result.state == "completed"
    assert (workspace / "important.txt").exists() is sandboxed


# --- workspace roots ------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def rooted_worker(
    client: Client, task_queue: str, model_server: ModelServer, tmp_path: Path
) -> AsyncIterator[Worker]:
    activities = [ModelActivities().call_model, *ToolActivities(roots=[str(tmp_path / "roots")]).all()]
    async with build_worker(client, task_queue, activities=activities) as running:
        yield running


@pytest.mark.parametrize("where", ["outside", "/", "/etc", "/usr/lib"])
async def test_a_workspace_outside_the_roots_closes_the_run_before_any_tool(
    client: Client, rooted_worker: Worker, task_queue: str, model_server: ModelServer, tmp_path: Path, where: str
) -> None:
    workspace = str(tmp_path / "ws") if where == "outside" else where
    Path(workspace).mkdir(exist_ok=True)
    model_server.responder = Script([tools(command("echo hi > hi.txt"))])
    handle = await start(client, task_queue, goal="x", workspace=workspace)
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    message = str(failure.value.cause)
    if where == "outside":
        assert "outside the worker's workspace roots" in message and "DURABLE_AGENT_WORKSPACE_ROOTS" in message
    else:
        assert "a system folder is never a workspace" in message
    assert model_server.requests == [] and not Path(workspace, "hi.txt").exists()


async def test_every_tool_checks_the_roots_again(tmp_path: Path, workspace: Path) -> None:
    (workspace / "a.txt").write_text("a")
    tools_elsewhere = ToolActivities(roots=[str(tmp_path / "roots")])
    for tool, args in [("read_file", {"path": "a.txt"}), ("run_command", {"command": "echo x > b.txt"})]:
        call = ToolCallInput(call_id="c", idempotency_key=uuid.uuid4().hex, workspace=str(workspace), arguments=args)
        outcome = await ActivityEnvironment().run(getattr(tools_elsewhere, tool), call)
        assert not outcome.ok and "outside the worker's workspace roots" in (outcome.error or "")
    assert not (workspace / "b.txt").exists()


def test_roots_come_from_the_environment_or_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ROOTS_ENV, os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert workspace_roots() == [str(tmp_path / "a"), str(tmp_path / "b")]
    monkeypatch.delenv(ROOTS_ENV)
    monkeypatch.chdir(tmp_path)
    assert workspace_roots() == [str(tmp_path)]


async def test_without_a_sandbox_commands_are_refused_unless_the_operator_says_so(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BWRAP_ENV, "/bin/false")  # a bubblewrap that cannot create namespaces
    bwrap_binary.cache_clear()
    try:
        call = ToolCallInput(
            call_id="c", idempotency_key=uuid.uuid4().hex, workspace=str(workspace), arguments={"command": "echo x > x"}
        )
        refused = await ActivityEnvironment().run(ToolActivities().run_command, call)
        assert not refused.ok and UNSANDBOXED_ENV in (refused.error or "")
        assert not (workspace / "x").exists()
        monkeypatch.setenv(UNSANDBOXED_ENV, UNSANDBOXED_CONSENT)
        allowed = await ActivityEnvironment().run(
            ToolActivities().run_command, call.model_copy(update={"idempotency_key": "k2"})
        )
        assert allowed.ok and (workspace / "x").exists()
    finally:
        bwrap_binary.cache_clear()
