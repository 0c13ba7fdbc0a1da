"""What `durable-agent run` needs before it can start a run: a server and a worker.

Both are started as detached background processes (their own session, logs under
`DURABLE_AGENT_HOME`), never inside the CLI: the run must outlive the command that started
it, so that Ctrl-C on `run` only stops the following, not the work.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.runtime import Runtime
from temporalio.service import RPCError

from activities.home import refuse_workspace_holding_worker_state
from activities.workspace import ROOTS_ENV, WorkspaceRefused
from durable_agent.connection import connect, connect_config, home
from durable_agent.console import Console
from durable_agent.processes import spawn_worker
from durable_agent.server import DEFAULT_PORT, ServerError, port_open, recorded_ui_port, start_server
from durable_agent.takeover import held_by_dead_neighbour, parse_identity, worker_identity
from workflows.types import AgentInput

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
CONNECT_TIMEOUT_S = 10.0
WORKER_READY_TIMEOUT_S = 30.0
POLLER_FRESH_S = 90.0
UI_URL_ENV = "DURABLE_AGENT_UI_URL"
UI_PORT_ENV = "DURABLE_AGENT_UI_PORT"
"""A live worker polls again at least every ~70 s (a long poll's length), so a poller the
server last saw longer ago than this is gone."""


class LaunchError(Exception):
    """Why the command cannot go on, in one line for the user."""


def configured_address() -> str:
    return str(connect_config()["target_host"])


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return address, DEFAULT_PORT
    return host, int(port)


def is_local(address: str) -> bool:
    """A dev server we may start ourselves: loopback, and no TLS or API key configured."""
    config = connect_config(address)
    return split_address(address)[0] in LOCAL_HOSTS and not config.get("tls") and not config.get("api_key")


def ui_url(address: str) -> str | None:
    """The Web UI to link to: `DURABLE_AGENT_UI_URL` when set, else the UI of an embedded server
    that this home started on that port, while it runs. Never a guess: a port that merely
    listens may be another user's server."""
    given = os.environ.get(UI_URL_ENV, "").strip()
    if given:
        return given.rstrip("/")
    port = split_address(address)[1]
    ui_port = recorded_ui_port(home(), port) if is_local(address) else None
    if ui_port is None or not port_open("127.0.0.1", ui_port):
        return None
    return f"http://localhost:{ui_port}"


def auto_ui_port(port: int) -> int | None:
    """The Web UI port of a server `run` starts: `DURABLE_AGENT_UI_PORT` (0: no UI), else the
    temporal CLI's pairing, gRPC port + 1000."""
    given = os.environ.get(UI_PORT_ENV, "").strip()
    if given:
        try:
            chosen = int(given)
        except ValueError:
            raise LaunchError(f"{UI_PORT_ENV}={given!r} is not a port number") from None
        if not 0 <= chosen <= 65535:
            raise LaunchError(f"{UI_PORT_ENV}={given!r} is not a port number (0-65535; 0: no Web UI)")
        return chosen or None
    return port + 1000 if port + 1000 <= 65535 else None


async def connect_client(address: str | None = None, runtime: Runtime | None = None) -> Client:
    address = address or configured_address()
    try:
        return await asyncio.wait_for(connect(address, runtime), CONNECT_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as e:
        reason = "connection refused" if "refused" in str(e).lower() else str(e).splitlines()[0][:200]
        raise LaunchError(
            f"no Temporal server at {address} ({reason}); start one with `durable-agent server` or set TEMPORAL_ADDRESS"
        ) from None


async def connect_or_start_server(console: Console) -> tuple[Client, str]:
    """Connect; a local address with nothing listening gets the embedded server first."""
    address = configured_address()
    port = split_address(address)[1]
    # The embedded server listens on 127.0.0.1, so that is where a local one would be.
    if is_local(address) and not port_open("127.0.0.1", port):
        await asyncio.to_thread(_start_background_server, console, port)
    return await connect_client(address), address


def _start_background_server(console: Console, port: int) -> None:
    console.line(f"no Temporal server on port {port}: starting the embedded dev server in the background…")
    ui_port = auto_ui_port(port)
    try:
        server = start_server(home(), port=port, ui_port=ui_port)
    except ServerError as e:
        raise LaunchError(str(e).splitlines()[0]) from None
    ui = f", Web UI {server.ui_url}" if server.ui_url else ""
    console.line(
        f"Temporal dev server at {server.address} (pid {server.process.pid}, data {server.db_file}, "
        f"log {server.log_file}{ui}); it keeps running after this command: stop it with `kill {server.process.pid}`"
    )


async def has_worker(client: Client, queue: str) -> bool:
    """Whether a live worker polls the queue's workflow tasks.

    The server lists a worker among the pollers for minutes after it died. A poller counts
    when its last access is recent (POLLER_FRESH_S) and, when its identity names a process
    of this machine (durable_agent/takeover.py), that process still runs: a SIGKILLed local
    worker is known gone at once rather than after POLLER_FRESH_S."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    now = time.time()
    me = parse_identity(worker_identity())
    return any(
        now - poller.last_access_time.ToSeconds() < POLLER_FRESH_S
        and not (me is not None and held_by_dead_neighbour(poller.identity, me))
        for poller in response.pollers
    )


def allow_workspace(workspace: str) -> None:
    """Workers this command starts (background or demo) accept the workspace it was given,
    besides its working directory, unless the person set the roots themselves. A workspace
    holding the home is refused here, before anything starts (the worker refuses it too)."""
    try:
        refuse_workspace_holding_worker_state(workspace)
    except WorkspaceRefused as e:
        raise LaunchError(str(e)) from None
    if ROOTS_ENV not in os.environ:
        os.environ[ROOTS_ENV] = os.pathsep.join([os.getcwd(), workspace])


async def ensure_worker(client: Client, queue: str, address: str, console: Console) -> bool:
    """Start a detached background worker unless a live one already polls the queue; True if it did."""
    if await has_worker(client, queue):
        return False
    log = home() / "worker.log"
    process = spawn_worker({"DURABLE_AGENT_TASK_QUEUE": queue, "TEMPORAL_ADDRESS": address}, log)
    await wait_until_polling(client, queue, process, log)
    console.line(
        f"started a background worker for task queue {queue} (pid {process.pid}, log {log}); "
        f"it keeps serving runs after this command: stop it with `kill {process.pid}`"
    )
    return True


async def replace_worker(client: Client, queue: str, address: str, console: Console) -> bool:
    """While `run` follows and no worker answered: start one if none polls, as `run` does
    at start (a SIGKILLed local worker is known gone at once: `has_worker`). True if it did."""
    try:
        return await ensure_worker(client, queue, address, console)
    except RPCError:
        return False  # the server itself is away: `follow` says no worker answers
    except LaunchError as e:
        console.line(f"no worker polls task queue {queue}, and starting one failed: {e}")
        return False


async def watch_replacer(handle: WorkflowHandle[Any, Any], console: Console) -> Callable[[], Awaitable[bool]] | None:
    """For `watch`: replace a dead worker as `run` does, for a run on a local server (one this
    machine may start workers for). The worker serves the run's own task queue and accepts its
    workspace, both read from the run's first event: no worker is needed to know them."""
    address = configured_address()
    if not is_local(address):
        return None  # a shared server's workers are someone else's to start
    client = await connect_client(address)
    async for event in handle.fetch_history_events():
        started = event.workflow_execution_started_event_attributes
        [agent_input] = await client.data_converter.decode(started.input.payloads, [AgentInput])
        allow_workspace(agent_input.workspace)
        return functools.partial(replace_worker, client, started.task_queue.name, address, console)
    return None


async def wait_until_polling(client: Client, queue: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for a freshly started worker to poll, so a worker that cannot start is reported, not waited on."""
    deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
    while not await has_worker(client, queue):
        if process.poll() is not None:
            raise LaunchError(f"the worker exited at start with code {process.returncode}: {_last_line(log)}")
        if time.monotonic() > deadline:
            raise LaunchError(f"the worker did not start polling within {WORKER_READY_TIMEOUT_S:.0f} s; see {log}")
        await asyncio.sleep(0.2)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"no output (see {log})"
