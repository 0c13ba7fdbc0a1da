"""MCP servers as durable tools (activities/mcp_tools.py, docs/mcp.md).

Real dev server, real workers (in process, or `python worker.py` subprocesses SIGKILLed),
the scripted model stub, real MCP servers over stdio: tests/mcp_fixture_server.py (written
with the SDK's MCPServer) and the published `mcp-server-time`, in the real command sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.types import CallToolResult, ImageContent, ToolAnnotations
from mcp.types import Tool as McpTool
from temporalio.client import Client, WorkflowFailureError

from activities.mcp_config import McpConfig, McpServer
from activities.mcp_sessions import McpSession, McpUnavailable, SessionPool, stdio_parameters, visible_paths
from activities.mcp_tools import needs_approval, rendered
from activities.tools.sandbox import WORKSPACE_FD, bwrap_binary
from durable_agent.model_server import ModelServer
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer, free_port
from tests.helpers import host_processes_named, retried_attempts, stalled, start, until, wait_for
from tests.scripts import Script, answer, tool_results, tools
from tests.test_crash import worker_env
from tests.test_replay import replayer
from worker import build_worker
from workflows import options

FIXTURE = str(Path(__file__).with_name("mcp_fixture_server.py"))
ROOT = Path(__file__).resolve().parent.parent


def configure(path: Path, monkeypatch: pytest.MonkeyPatch, **servers: dict[str, Any]) -> Path:
    """Write an MCP configuration and point the worker's environment at it."""
    config = path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    monkeypatch.setenv("DURABLE_AGENT_MCP_CONFIG", str(config))
    return config


def fixture(**extras: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [FIXTURE], **extras}


def latest(request: dict[str, Any], count: int = 1) -> list[str]:
    """The tool results of the step just before this model call."""
    return tool_results(request)[-count:]


def starts(workspace: Path) -> int:
    log = workspace / "starts.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


async def test_mcp_tools_are_offered_and_called_in_a_run_by_one_server_start(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture(), time={"command": "mcp-server-time", "args": []})
    model_server.responder = Script(
        [
            tools(("mcp__fx__echo", {"text": "one"}), ("mcp__time__get_current_time", {"timezone": "UTC"})),
            tools(("mcp__fx__append_line", {"path": "notes.txt", "line": "hello"})),
            tools(("mcp__fx__echo", {"text": 3})),
            answer("done"),
        ]
    )
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx", "time"])
        result = await handle.result()
        await until(lambda: host_processes_named(str(workspace)) == [])  # the run's close stops its servers
    assert result.state == "completed"
    offered = {t["function"]["name"]: t["function"] for t in model_server.requests[0]["tools"]}
    assert offered["mcp__fx__echo"]["parameters"]["properties"]["text"]["type"] == "string"
    assert offered["mcp__fx__echo"]["description"] == "Echo the text back."
    assert "mcp__time__get_current_time" in offered and "read_file" in offered
    echoed, now = tool_results(model_server.requests[1])
    assert echoed == "echo: one"
    assert json.loads(now)["timezone"] == "UTC"
    assert latest(model_server.requests[2]) == ["appended to notes.txt"]
    assert (workspace / "notes.txt").read_text() == "hello\n"  # in the workspace, the server's cwd
    assert latest(model_server.requests[3])[0].startswith("ERROR: ")  # the server refused a bad argument
    assert starts(workspace) == 1  # one session served the catalog and the calls


async def test_an_unconfigured_server_closes_the_run_at_its_start(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture())
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx", "nope"])
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert "unknown MCP server(s) ['nope']" in str(failure.value.cause)
    assert model_server.requests == []  # 0 model calls


async def test_a_destructive_tool_waits_for_approval(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture())
    (workspace / "doomed.txt").write_text("x")
    model_server.responder = Script([tools(("mcp__fx__delete_file", {"path": "doomed.txt"})), answer("deleted")])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        status = await wait_for(handle, lambda s: s.state == "awaiting_approval")
        assert (workspace / "doomed.txt").exists()  # nothing ran before the decision
        pending = status.pending_approvals[0]
        assert pending.tool == "mcp__fx__delete_file"
        await handle.execute_update("approve", {"call_id": pending.call_id, "approved": True})
        result = await handle.result()
    assert result.state == "completed"
    assert not (workspace / "doomed.txt").exists()
    assert tool_results(model_server.requests[1]) == ["deleted doomed.txt"]


async def test_a_sandboxed_server_sees_only_the_workspace_and_no_network(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker = tmp_path / "outside.txt"
    marker.write_text("host secret")
    (workspace / "inside.txt").write_text("workspace file")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    configure(tmp_path, monkeypatch, fx=fixture())
    model_server.responder = Script(
        [
            tools(
                ("mcp__fx__read_path", {"path": str(marker)}),
                ("mcp__fx__read_path", {"path": "inside.txt"}),
                ("mcp__fx__connect", {"port": port}),
            ),
            answer("done"),
        ]
    )
    try:
        async with build_worker(client, task_queue):
            handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
            result = await handle.result()
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection ever reached the host's listener
    finally:
        listener.close()
    assert result.state == "completed"
    outside, inside, connected = tool_results(model_server.requests[1])
    assert outside.startswith(f"cannot read {marker}: No such file") and "host secret" not in outside
    assert inside == "workspace file"
    assert connected.startswith("no connection")


async def test_a_hanging_server_is_cancelled_at_its_timeout_and_the_run_goes_on(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture(timeout_s=3))
    model_server.responder = Script(
        [tools(("mcp__fx__hang", {})), tools(("mcp__fx__echo", {"text": "after"})), answer("done")]
    )
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.state == "completed"
    [hung] = tool_results(model_server.requests[1])
    assert hung.startswith("ERROR: fx.hang: no answer within 3 s")
    assert latest(model_server.requests[2]) == ["echo: after"]
    assert starts(workspace) == 2  # the hung server was stopped, the next call started another


async def test_a_server_that_dies_is_started_again_read_retried_write_reported(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture())
    model_server.responder = Script(
        [
            tools(("mcp__fx__crash_once", {"marker": "crashed.txt"})),
            tools(("mcp__fx__append_then_crash", {"path": "ledger.txt", "line": "paid"})),
            tools(("mcp__fx__echo", {"text": "still here"})),
            answer("done"),
        ]
    )
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.state == "completed"
    assert latest(model_server.requests[1]) == ["survived"]  # the read ran again on a new server
    [write] = latest(model_server.requests[2])
    assert write.startswith("ERROR: the outcome is unknown: the MCP server fx stopped during the call")
    assert (workspace / "ledger.txt").read_text() == "paid\n"  # once: not run again
    assert latest(model_server.requests[3]) == ["echo: still here"]
    assert starts(workspace) == 3  # the first, after each death


async def test_results_are_capped_redacted_and_kept_by_reference_with_progress_in_heartbeats(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture())
    model_server.responder = Script(
        [tools(("mcp__fx__slow", {"seconds": 6})), tools(("mcp__fx__big", {"chars": 50_000})), answer("done")]
    )
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        details = await beat_of(handle, "mcp_call")
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.state == "completed"
    assert "of 12" in details  # the server's progress notification, e.g. "3/12 step 4 of 12"
    [big] = latest(model_server.requests[2])
    assert len(big) < 9_000 and "bytes total" in big
    ref = big.split("full output: ")[1].split(" …")[0]
    saved = (workspace / ref).read_text()
    assert saved.startswith("x" * 1000) and len(saved) > 50_000
    assert "sk-A1A1" not in big + saved and "[REDACTED:openai-key]" in saved


async def beat_of(handle: Any, activity_type: str) -> str:
    """The first heartbeat details of the run's pending activity of this type, decoded."""
    while True:
        for pending in (await handle.describe()).raw_description.pending_activities:
            if pending.activity_type.name == activity_type and pending.heartbeat_details.payloads:
                values = await handle._client.data_converter.decode(pending.heartbeat_details.payloads)
                return str(values)
        await asyncio.sleep(0.2)


async def test_an_agent_file_names_the_servers(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, fx=fixture())
    (workspace / "agents").mkdir()
    (workspace / "agents" / "echoer.md").write_text("---\ndescription: d\nmcp_servers: fx\n---\nEcho.\n")
    model_server.responder = Script([tools(("mcp__fx__echo", {"text": "hi"})), answer("done")])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), agent="echoer")
        result = await handle.result()
    assert result.state == "completed"
    assert latest(model_server.requests[1]) == ["echo: hi"]


def test_the_cli_lists_servers_and_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configure(tmp_path, monkeypatch, fx=fixture(), time={"command": "mcp-server-time"}, gone={"command": "no-such"})
    done = subprocess.run(
        [sys.executable, "-c", "from durable_agent.cli import main; main()", "mcp"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # one server could not be listed
    lines = done.stdout.splitlines()
    assert "fx: stdio" in lines[0] and "(sandboxed, no network)" in lines[0]
    assert any(line.split()[:3] == ["mcp__fx__delete_file", "write", "yes"] for line in lines)
    assert any(line.split()[:3] == ["mcp__time__get_current_time", "read", "no"] for line in lines)
    assert "gone: stdio `no-such`" in done.stdout
    assert "cannot list its tools: MCP server gone could not start" in done.stdout


async def test_worker_sigkills_between_and_during_calls(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed during a write: its effect once, the model told the outcome is unknown; during a
    read: run again on the next worker; between calls (awaiting approval): the next worker
    starts its own session. One server start per worker that served the run."""
    config = configure(tmp_path, monkeypatch, fx=fixture())
    ledger, counter, doomed = workspace / "ledger.txt", workspace / "tally.txt", workspace / "doomed.txt"
    doomed.write_text("x")
    model_server.responder = Script(
        [
            tools(("mcp__fx__append_line", {"path": "ledger.txt", "line": "paid", "hold_s": 120})),
            tools(("mcp__fx__tally", {"path": "tally.txt", "hold_first_s": 120})),
            tools(("mcp__fx__delete_file", {"path": "doomed.txt"})),
            answer("done"),
        ]
    )
    env = {**worker_env(temporal_server, model_server, task_queue), "DURABLE_AGENT_MCP_CONFIG": str(config)}
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        await until(lambda: lines(ledger) == ["paid"])
        kill_hard(worker)  # during the write call
        worker = spawn_worker(env, tmp_path / "w1.log")
        await until(lambda: len(lines(counter)) == 1)
        kill_hard(worker)  # during the read call
        worker = spawn_worker(env, tmp_path / "w2.log")
        status = await wait_for(handle, lambda s: s.state == "awaiting_approval", timeout_s=90)
        kill_hard(worker)  # between calls
        worker = spawn_worker(env, tmp_path / "w3.log")
        await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
        result = await asyncio.wait_for(handle.result(), 120)
    finally:
        stop_gently(worker)
    assert result.state == "completed"
    [write] = latest(model_server.requests[1])
    # The journal of the call's next attempt (a write tool is retried: the journal answers).
    assert write.startswith("ERROR: the outcome is unknown: its worker stopped during the call"), write
    assert "it was not run again" in write
    assert lines(ledger) == ["paid"]  # exactly once
    assert latest(model_server.requests[2]) == ["2 call(s)"] and lines(counter) == ["call", "call"]
    assert latest(model_server.requests[3]) == ["deleted doomed.txt"] and not doomed.exists()
    assert starts(workspace) == 4  # w0 (catalog and the write), w1 (the read), w2 (its retry), w3 (the delete)
    assert host_processes_named(str(workspace)) == []  # no sandboxed server outlived its worker


async def test_a_write_whose_attempt_timed_out_on_a_stalled_worker_reports_its_real_outcome(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker stops (SIGSTOP) for longer than the heartbeat timeout during two write calls,
    an MCP server's and a user's Python tool, and an idempotent one: the server times their
    attempts out and retries them, on the same worker, whose calls went on. Each retry waits
    for its call and reports its outcome, not "unknown"; each call ran once."""
    config = configure(tmp_path, monkeypatch, fx=fixture())
    ledger, payments, charges = workspace / "ledger.txt", workspace / "payments.txt", workspace / "charges.txt"
    stalled_s = options.HEARTBEAT_TIMEOUT.total_seconds() + 4
    hold_s = stalled_s + 5  # the calls still running when the worker goes on, and the retries arrive
    model_server.responder = Script(
        [
            tools(
                ("mcp__fx__append_line", {"path": "ledger.txt", "line": "paid", "hold_s": hold_s}),
                ("send_payment", {"ledger": str(payments), "amount": 5, "hold_s": hold_s}),
                ("charge_card", {"ledger": str(charges), "hold_s": hold_s}),  # its first attempt holds
            ),
            answer("done"),
        ]
    )
    env = {
        **worker_env(temporal_server, model_server, task_queue),
        "DURABLE_AGENT_MCP_CONFIG": str(config),
        "DURABLE_AGENT_TOOLS": "tests.tool_fixtures",
    }
    worker = spawn_worker(env, tmp_path / "w.log")
    try:
        handle = await start(
            client,
            task_queue,
            goal="g",
            workspace=str(workspace),
            mcp_servers=["fx"],
            tools=["send_payment", "charge_card"],
        )
        await until(lambda: lines(ledger) == ["paid"] and lines(payments) == ["paid 5.0"] and len(lines(charges)) == 1)
        await stalled(worker, stalled_s)
        result = await asyncio.wait_for(handle.result(), 120)
    finally:
        stop_gently(worker)
    assert result.state == "completed"
    assert sorted(latest(model_server.requests[1], 3)) == ["appended to ledger.txt", "charged", "paid 5.0"]
    assert lines(ledger) == ["paid"] and lines(payments) == ["paid 5.0"] and len(lines(charges)) == 1  # once each
    assert await retried_attempts(handle), "no attempt timed out: the stall proved nothing"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_server_sees_only_the_env_its_config_names_expanded_from_the_worker(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FX_SOURCE", "from-the-worker")
    monkeypatch.setenv("WORKER_ONLY", "not-for-servers")
    monkeypatch.setenv("USER", "worker-user")  # the SDK passes these on unless told not to
    monkeypatch.setenv("SHELL", "/bin/bash")
    configure(tmp_path, monkeypatch, fx=fixture(env={"FX_VALUE": "${FX_SOURCE}"}))
    names = ["FX_VALUE", "WORKER_ONLY", "USER", "SHELL", "DURABLE_AGENT_MCP_CONFIG"]
    model_server.responder = Script([tools(*(("mcp__fx__getenv", {"name": n}) for n in names)), answer("done")])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        result = await handle.result()
    assert result.state == "completed"
    assert latest(model_server.requests[1], len(names)) == ["from-the-worker"] + ["(unset)"] * 4


async def test_an_http_server_is_called_with_its_headers_expanded(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    served = tmp_path / "http"
    served.mkdir()
    process = subprocess.Popen([sys.executable, FIXTURE, "--http", str(port)], cwd=served, stderr=subprocess.DEVNULL)
    monkeypatch.setenv("FX_HTTP_TOKEN", "token-value")
    url = f"http://127.0.0.1:{port}/mcp"
    configure(tmp_path, monkeypatch, web={"url": url, "headers": {"Authorization": "Bearer ${FX_HTTP_TOKEN}"}})
    model_server.responder = Script(
        [tools(("mcp__web__echo", {"text": "over http"}), ("mcp__web__authorization", {})), answer("done")]
    )
    try:
        await until(lambda: port_open(port))
        async with build_worker(client, task_queue):
            handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["web"])
            result = await handle.result()
    finally:
        process.terminate()
        process.wait()
    assert result.state == "completed"
    # The header reached the server expanded: its value came back redacted as the worker's secret.
    assert latest(model_server.requests[1], 2) == ["echo: over http", "Bearer [REDACTED:FX_HTTP_TOKEN]"]


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def test_a_server_down_at_the_start_is_waited_for(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    served = tmp_path / "http"
    served.mkdir()
    configure(tmp_path, monkeypatch, web={"url": f"http://127.0.0.1:{port}/mcp"})
    model_server.responder = Script([tools(("mcp__web__echo", {"text": "up"})), answer("done")])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["web"])
        status = await wait_for(handle, lambda s: s.activity.startswith("waiting for an MCP server"), timeout_s=90)
        assert "MCP server web could not start" in status.activity and status.state == "running"
        assert model_server.requests == []  # no model call before the tools are known
        serve = [sys.executable, FIXTURE, "--http", str(port)]
        process = subprocess.Popen(serve, cwd=served, stderr=subprocess.DEVNULL)
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            process.terminate()
            process.wait()
    assert result.state == "completed"
    assert latest(model_server.requests[1]) == ["echo: up"]


# --- the parts, without a run --------------------------------------------------------


def test_the_documented_configuration_parses_with_its_defaults() -> None:
    text = (ROOT / "docs" / "mcp.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    servers = McpConfig.model_validate(json.loads(example)).servers
    time_server = servers["time"]
    assert (time_server.sandbox, time_server.network, time_server.approve, time_server.timeout_s) == (
        True,
        False,
        "destructive",
        60.0,
    )
    assert servers["shop"].approve == ["refund"] and servers["shop"].env == {"SHOP_TOKEN": "${SHOP_TOKEN}"}
    assert not servers["search"].stdio and servers["search"].headers["Authorization"] == "Bearer ${SEARCH_TOKEN}"
    with pytest.raises(ValueError, match="either `command`"):
        McpServer(command="x", url="http://y")


@pytest.mark.parametrize(
    ("approve", "annotations", "waits"),
    [
        ("destructive", None, True),  # not read-only, and destructive by the spec's default
        ("destructive", ToolAnnotations(read_only_hint=True), False),
        ("destructive", ToolAnnotations(destructive_hint=False), False),
        ("always", ToolAnnotations(read_only_hint=True), True),
        ("never", None, False),
        (["refund"], ToolAnnotations(read_only_hint=True), True),
        (["other"], None, False),
    ],
)
def test_approval_follows_the_config_and_the_annotations(
    approve: Any, annotations: ToolAnnotations | None, waits: bool
) -> None:
    tool = McpTool(name="refund", input_schema={"type": "object"}, annotations=annotations)
    assert needs_approval(McpServer(command="x", approve=approve), tool) is waits


def test_images_are_described_not_shown() -> None:
    result = CallToolResult(content=[ImageContent(type="image", data="QUJD" * 100, mime_type="image/png")])
    assert rendered(result) == "[image: image/png, 300 bytes, not shown]"


def test_only_files_named_by_absolute_path_are_mounted(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text("")
    shown = visible_paths(["/usr/bin/python3", str(script), str(tmp_path), "relative.py"])
    assert shown == [sys.prefix, sys.base_prefix, str(script)] or shown == [sys.prefix, str(script)]


def test_a_sandboxed_server_binds_the_workspace_the_worker_checked_by_descriptor(workspace: Path) -> None:
    """As a command's sandbox does (tests/test_sandbox.py races it): never by a path a swap could redirect."""
    params, workspace_fd = stdio_parameters(McpServer(command="mcp-server-time"), str(workspace))
    assert workspace_fd is not None
    try:
        at = params.args.index("--bind-fd")
        assert params.args[at + 1 : at + 3] == [str(WORKSPACE_FD), str(workspace)] and "--bind" not in params.args
        assert f"/proc/{os.getpid()}/fd/{workspace_fd}" in params.args  # what the launcher opens as WORKSPACE_FD
        assert os.readlink(f"/proc/self/fd/{workspace_fd}") == str(workspace)
    finally:
        os.close(workspace_fd)


def test_no_sandbox_no_server_unless_the_operator_consents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", "/bin/false")
    bwrap_binary.cache_clear()
    try:
        with pytest.raises(McpUnavailable, match="the MCP server is refused: the command sandbox cannot start"):
            stdio_parameters(McpServer(command="mcp-server-time"), str(tmp_path))
        monkeypatch.setenv("DURABLE_AGENT_UNSANDBOXED_COMMANDS", "i-understand")
        plain, workspace_fd = stdio_parameters(McpServer(command="mcp-server-time"), str(tmp_path))
        assert plain.command == "bash" and plain.args[-1] == "mcp-server-time" and workspace_fd is None
    finally:
        monkeypatch.delenv("DURABLE_AGENT_BWRAP")
        bwrap_binary.cache_clear()


async def test_network_true_reaches_the_host_and_unsandboxed_still_gets_only_its_env(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHELL", "/bin/bash")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    networked = McpSession("fx", McpServer(**fixture(network=True)), str(workspace))
    plain = McpSession("fx", McpServer(**fixture(sandbox=False)), str(workspace))
    await networked.open()
    await plain.open()
    try:
        reached = await networked.client().call_tool("connect", {"port": port})
        user = await plain.client().call_tool("getenv", {"name": "SHELL"})
        path = await plain.client().call_tool("getenv", {"name": "PATH"})
    finally:
        await networked.close()
        await plain.close()
        listener.close()
    assert rendered(reached) == "connected"
    assert rendered(user) == "(unset)" and rendered(path).startswith(f"{sys.prefix}/bin:")


async def test_an_idle_session_is_closed(workspace: Path) -> None:
    pool = SessionPool(idle_s=1.0)
    await pool.get("run", "fx", McpServer(**fixture()), str(workspace))
    assert host_processes_named(str(workspace)) != [] and pool.starts == 1
    await until(lambda: host_processes_named(str(workspace)) == [], within_s=30)


async def test_cancelling_the_run_cancels_the_call_on_the_server(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's handler of the running call is cancelled: by the SDK's `notifications/cancelled`
    when the activity is, or at the latest when the run's close stops the server. (Only with
    neither does the test fail.)"""
    configure(tmp_path, monkeypatch, fx=fixture())
    model_server.responder = Script([tools(("mcp__fx__slow", {"seconds": 120})), answer("done")])
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["fx"])
        await beat_of(handle, "mcp_call")
        await handle.cancel()
        result = await asyncio.wait_for(handle.result(), 60)
        await until(lambda: (workspace / "cancelled.txt").exists(), within_s=30)
    assert result.state == "cancelled"


IMPORT_GAPS = """
import asyncio, sys, time
from activities.mcp_sessions import import_mcp_sdk
assert "mcp" not in sys.modules

async def main() -> None:
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    ticker = asyncio.create_task(tick())
    began = time.monotonic()
    await import_mcp_sdk()
    took = time.monotonic() - began
    ticker.cancel()
    assert "mcp.client.stdio" in sys.modules
    print(max(gaps, default=took), took)

asyncio.run(main())
"""


def test_the_sdk_is_imported_off_the_event_loop() -> None:
    """A new worker's first MCP call (a retry after a crash) imports the SDK, ~1.2 s of CPU:
    on the event loop it would hold up every heartbeat of the worker (5 s timeouts) for that
    long, and longer on a loaded machine. Off the loop, the loop keeps turning meanwhile."""
    done = subprocess.run([sys.executable, "-c", IMPORT_GAPS], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    longest_gap, import_s = map(float, done.stdout.split())
    assert longest_gap < import_s / 4, (longest_gap, import_s)


MUTE = McpServer(command=sys.executable, args=["-c", "import time; time.sleep(3600)"])
"""A server that never answers the handshake."""


async def test_a_start_outlives_its_cancelled_caller_and_serves_the_next_attempt(workspace: Path) -> None:
    """A catalog's local activity is cancelled when its run leaves the worker's cache (a workflow
    task that failed or timed out); the attempt that follows takes the server it was starting."""
    pool = SessionPool()
    first = asyncio.create_task(pool.get("run", "fx", McpServer(**fixture()), str(workspace)))
    await until(lambda: host_processes_named(str(workspace)) != [])
    starting = host_processes_named(str(workspace))
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    session = await pool.get("run", "fx", McpServer(**fixture()), str(workspace))
    assert rendered(await session.client().call_tool("echo", {"text": "x"})) == "echo: x"
    assert host_processes_named(str(workspace)) == starting  # the same processes serve it
    assert pool.starts == 1 and starts(workspace) == 1
    await pool.close_all()
    assert host_processes_named(str(workspace)) == []


async def test_the_runs_close_stops_a_server_still_starting(workspace: Path) -> None:
    pool = SessionPool()
    waiting = asyncio.create_task(pool.get("run", "mute", MUTE, str(workspace)))
    await until(lambda: host_processes_named(str(workspace)) != [])
    assert pool.close_run("run") == 0  # no session yet: only its start
    with pytest.raises(McpUnavailable, match="stopped while starting: its run closed"):
        await waiting
    assert host_processes_named(str(workspace)) == []  # stopped before the caller was told
    assert pool.starts == 0


async def test_a_stopping_worker_stops_a_server_still_starting_and_says_so(workspace: Path) -> None:
    pool = SessionPool()
    waiting = asyncio.create_task(pool.get("run", "mute", MUTE, str(workspace)))
    await until(lambda: host_processes_named(str(workspace)) != [])
    await pool.close_all()
    assert host_processes_named(str(workspace)) == []
    with pytest.raises(McpUnavailable, match="stopped while starting: its worker is stopping"):
        await waiting


@pytest.mark.parametrize("second", ["close_run", "close_all"])
async def test_a_second_stop_of_a_stopping_start_still_stops_it(workspace: Path, second: str) -> None:
    """`mcp_close` runs again when its workflow task is retried, and a worker may stop just
    after a run's close: a second stop must neither hang nor cut the first one short."""
    pool = SessionPool()
    waiting = asyncio.create_task(pool.get("run", "mute", MUTE, str(workspace)))
    await until(lambda: host_processes_named(str(workspace)) != [])
    await asyncio.sleep(1.0)  # the server is up; its handshake waits
    pool.close_run("run")
    await asyncio.sleep(0.5)  # inside the SDK's shutdown: stdin closed, its grace running
    if second == "close_run":
        pool.close_run("run")
    else:
        await asyncio.wait_for(pool.close_all(), 30)
    with pytest.raises(McpUnavailable, match="stopped while starting: its run closed"):
        await asyncio.wait_for(waiting, 30)  # the first stop's reason
    await until(lambda: host_processes_named(str(workspace)) == [], within_s=30)


async def test_a_close_that_meets_the_end_of_the_handshake_is_kept(workspace: Path) -> None:
    """`close_run` in the few turns of the loop between the handshake's end and the session's
    entry in the pool: the session is closed, not kept for a run that is gone."""
    pool = SessionPool()
    opened: list[McpSession] = []
    original = McpSession.open

    async def watched(self: McpSession) -> None:
        opened.append(self)
        await original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(McpSession, "open", watched)
        caller = asyncio.create_task(pool.get("run", "fx", McpServer(**fixture()), str(workspace)))
        while not opened or opened[0].session is None:
            await asyncio.sleep(0)
        pool.close_run("run")
        with pytest.raises(McpUnavailable, match="its run closed"):
            await caller
    assert pool._sessions == {}
    await until(lambda: host_processes_named(str(workspace)) == [], within_s=30)


async def test_a_run_cancelled_while_its_server_starts_stops_it_at_its_close(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(tmp_path, monkeypatch, mute={"command": MUTE.command, "args": MUTE.args})
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="g", workspace=str(workspace), mcp_servers=["mute"])
        await until(lambda: host_processes_named(str(workspace)) != [])
        await handle.cancel()
        assert (await handle.result()).state == "cancelled"
        await until(lambda: host_processes_named(str(workspace)) == [], within_s=30)
    assert model_server.requests == []
    history = await handle.fetch_history()
    summaries = [e.user_metadata.summary.data for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(b"mcp_close: mute" in summary for summary in summaries)  # its close ran, under the new patch
    assert (await replayer().replay_workflow(history)).replay_failure is None
