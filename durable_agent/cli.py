"""`durable-agent`: run the server and workers, start runs, follow and control them.

The exit codes and environment variables are in EPILOG, which `--help` prints.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.metadata
import os
import signal
import sys
import threading
import typing
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.redaction import worker_redactor
from durable_agent import cli_agents, cli_control, cli_gc, cli_hosts, cli_mcp, demo_model, render, telemetry
from durable_agent.cli_base import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    command,
    run_handle,
)
from durable_agent.cli_history import add_history_commands
from durable_agent.codec_server import TOKEN_ENV, CodecServer, ui_origins
from durable_agent.codecs import CodecError, EncryptionKeys, PayloadCodecChain
from durable_agent.connection import home, task_queue
from durable_agent.console import Console
from durable_agent.follow import (
    EXIT_CODES,
    EXIT_FAILED,
    QUERY_TIMEOUT,
    WATCH_LEASE_S,
    Reporter,
    caught_up,
    failure_text,
    follow,
    snapshot_status,
)
from durable_agent.launch import (
    LaunchError,
    allow_workspace,
    configured_address,
    connect_client,
    connect_or_start_server,
    ensure_worker,
    has_worker,
    is_local,
    replace_worker,
    split_address,
    ui_url,
    watch_replacer,
)
from durable_agent.model_queue import model_call_waiting
from durable_agent.model_server import ModelServer
from durable_agent.prompts import terminal_approver
from durable_agent.runs import start_agent
from durable_agent.server import DEFAULT_PORT, DEFAULT_UI_PORT, ServerError, port_open, start_server
from durable_agent.task_failures import failing_task
from durable_agent.worker_settings import SettingsError, configured_host
from workflows.types import (
    ALL_TOOLS,
    TERMINAL_STATES,
    WORKFLOW_TYPE,
    AgentInput,
    AgentResult,
    Limits,
    LimitsPatch,
    RunState,
    WatchRequest,
)
from workflows.validation_text import validation_text

CANCEL_WAIT_S = 30.0
"""How long `cancel` waits for the run to close: a worker takes the cancel at its next workflow task."""

DEMO_MODEL_PORT = 8000
CLOSED_STATES = {"failed": "Failed", "timed_out": "TimedOut"}
"""Runs that ended without an AgentState of their own, by Temporal's ExecutionStatus."""
LIST_STATES = (*typing.get_args(RunState), *CLOSED_STATES)

T = TypeVar("T")


# --- entry point -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        sys.exit(EXIT_OK)
    console = Console(demo_model.LABEL if _demo_mode(args) else None)
    try:
        code = _dispatch(args, console)
        sys.stdout.flush()
    except BrokenPipeError:  # `durable-agent status ID | head`: the reader has what it wanted
        code = EXIT_PIPE_CLOSED
    telemetry.shutdown()  # export the last spans: os._exit below skips the exporters' own exit hooks
    sys.stderr.flush()
    # The Temporal core bridge can abort while the interpreter finalizes (sdk-python#300,
    # exit 134) when a client was used; all work is done and flushed, so leave at once.
    os._exit(code)


def _demo_mode(args: argparse.Namespace) -> bool:
    """`demo-model`, and `run` without a key: the offline demo model stands in for a real one."""
    return args.command == "demo-model" or (args.command == "run" and not os.environ.get("OPENAI_API_KEY"))


def _dispatch(args: argparse.Namespace, console: Console) -> int:
    try:
        if args.command == "server":
            return serve(args, console)
        if args.command == "demo-model":
            return serve_demo_model(args, console)
        if args.command == "codec-server":
            return serve_codec(args, console)
        return asyncio.run(args.handler(args, console))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except CliError as e:
        console.error(f"error: {e}")
        return e.code
    except (LaunchError, ServerError, CodecError) as e:
        console.error(f"error: {e}")
        return EXIT_USAGE
    except ValidationError as e:
        console.error(f"error: invalid input: {validation_text(e)}")
        return EXIT_USAGE
    except WorkflowUpdateFailedError as e:
        console.error(f"refused: {getattr(e.cause, 'message', None) or e.cause}")
        return EXIT_REFUSED
    except RPCError as e:
        console.error(f"refused: {e.message}")
        return EXIT_REFUSED


# --- parser ----------------------------------------------------------------------------


EPILOG = """\
environment:
  OPENAI_API_KEY        the model endpoint's key, read by the worker; without it `run`
                        uses the offline demo model (every line it prints says so)
  OPENAI_BASE_URL       any OpenAI-compatible endpoint (default: OpenAI)
  TEMPORAL_ADDRESS      the Temporal server (default localhost:7233; with nothing there,
                        `run` starts the embedded dev server); TEMPORAL_NAMESPACE,
                        TEMPORAL_API_KEY, TEMPORAL_TLS_*, TEMPORAL_PROFILE as in the
                        Temporal CLI
  DURABLE_AGENT_TASK_QUEUE  task queue (default durable-agent)
  DURABLE_AGENT_HOME    embedded server data and worker logs (default ./.durable-agent)
  DURABLE_AGENT_UI_PORT  the Web UI port of a server `run` starts (default its port + 1000;
                        0: none); DURABLE_AGENT_UI_URL  the Web UI link `run` prints (default:
                        the UI of the embedded server this home started, else no link)
  DURABLE_AGENT_PRICES  extra model prices (a JSON file or inline JSON) for cost budgets
  DURABLE_AGENT_SECRET_ENV  more variables whose values are redacted (names or globs)
  DURABLE_AGENT_MODEL_TASK_QUEUE, DURABLE_AGENT_MODEL_RPS  where model calls run, and
                        their rate across all workers
  DURABLE_AGENT_MODEL_STREAM=0  model replies unstreamed (default: streamed, the chunks
                        received so far in the pending call's heartbeat details)
  DURABLE_AGENT_LIVE_REPLY=0  no live view of replies: by default a streamed reply's text
                        so far is in its call's heartbeat details, a beat per new line, and `run`
                        and `watch` show it line by line
  DURABLE_AGENT_METRICS_PORT  a worker serves Prometheus metrics on this port (127.0.0.1,
                              or DURABLE_AGENT_METRICS_ADDRESS)
  DURABLE_AGENT_JOURNAL_MAX_BYTES, DURABLE_AGENT_OUTPUTS_MAX_BYTES,
  DURABLE_AGENT_ARCHIVE_MAX_BYTES  what one run keeps in its workspace's .durable-agent/
                        (default 64M, 512M, 256M; `gc` removes what closed runs left)
  DURABLE_AGENT_MAX_CONCURRENT_ACTIVITIES (..._WORKFLOW_TASKS, ..._LOCAL_ACTIVITIES),
  DURABLE_AGENT_MAX_CACHED_WORKFLOWS  a worker's slots
  DURABLE_AGENT_CONNECT_TIMEOUT_S  a worker gives up after this long without a server
                        (default: it waits; `worker --connect-timeout S` too)
  OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_*  traces (none without them)

exit codes:
  0    success; for `run` and `watch`: the run completed
  1    the run refused the request (unknown approval id, a signal to an ended run)
  2    bad usage or input, no server, unknown run id
  3    the run stopped at a limit or budget (its output is a partial result)
  4    the run was cancelled, terminated or failed
  130  Ctrl-C (a followed run goes on)
  141  the output pipe closed early (e.g. `| head`)
"""

VERBOSE_HELP = "every note the run records (compactions, pacing, the closing clean-up), as `status` shows them"

LIMITS_HELP = """\
limits and budgets:
  Each budget has a soft tier from --soft-ratio of it (steps: from --soft-steps): the
  model is warned to finish, and --fallback-model, if set, takes over. At the hard limit
  the run stops cleanly with state `stopped` and a partial result (exit code 3). Time
  spent waiting for a person (paused, awaiting approval, needs attention) does not count
  against --max-duration-s. `durable-agent limits ID ...` changes a running run's limits.
"""

LIMIT_MEANINGS = {
    "soft_steps": "steps after which the model is warned to finish (the soft tier of steps)",
    "hard_steps": "steps after which the run stops",
    "max_tokens": "input plus output tokens over all model calls",
    "max_cost_usd": "model cost in US dollars (unpriced models count $0: see DURABLE_AGENT_PRICES)",
    "max_model_calls": "model calls (one per step)",
    "max_tool_calls": "tool calls over the whole run",
    "max_duration_s": "seconds of running time, not counting time waiting for a person",
    "soft_ratio": "fraction of each budget where its soft tier begins",
    "max_done_checks": "checks of the success criteria before a final answer is taken as it is",
    "host_wait_s": "seconds a run pinned to a host waits for it before it needs attention",
    "max_wait_s": "seconds one wait for a person may last before the run stops",
    "outage_wait_s": "seconds to wait for a failing model endpoint before the run needs attention",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-agent",
        description="LLM agents as Temporal workflows: kill any process at any moment, and the run "
        "goes on from its last finished step.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"durable-agent {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    server = commands.add_parser("server", help="run the embedded Temporal dev server in the foreground")
    server.add_argument("--port", type=int, default=None, help="gRPC port (default: from TEMPORAL_ADDRESS, else 7233)")
    server.add_argument("--ui-port", type=int, default=DEFAULT_UI_PORT, help="Web UI port (default 8233)")
    server.add_argument(
        "--codec-port", type=int, help="with an encryption key: the Web UI's codec server port (default UI port + 1)"
    )
    codec = commands.add_parser(
        "codec-server", help="serve the payload codec over HTTP for `temporal --codec-endpoint` and the Web UI"
    )
    codec.add_argument("--port", type=int, default=DEFAULT_UI_PORT + 1, help="port (default 8234)")
    codec.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    codec.add_argument("--ui-port", type=int, default=DEFAULT_UI_PORT, help="the Web UI's port for CORS (default 8233)")
    codec.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN", help="another origin browsers may call from"
    )

    worker = command(commands, "worker", work, "run a worker for the task queue until Ctrl-C or SIGTERM")
    worker.add_argument("--tools", action="append", default=[], metavar="MODULE", help="load @tool functions of MODULE")
    worker.add_argument(
        "--connect-timeout", type=float, metavar="S", help="give up after S s without a server (default: wait)"
    )
    demo = commands.add_parser(
        "demo-model",
        help="serve the offline demo model (a fixed script, not an LLM) as an OpenAI-compatible endpoint",
        description="Serve the offline demo model at OPENAI_BASE_URL, to try the real path without a key. "
        "It plays one fixed scenario (write calc.py and test_calc.py, find the bug, fix it) in an empty workspace, "
        "and every reply says it is the offline demo model.",
    )
    demo.add_argument("--port", type=int, default=DEMO_MODEL_PORT, help=f"port (default {DEMO_MODEL_PORT})")
    _add_run_parser(commands)

    command(commands, "status", status, "show a run's state, usage, limits and pending decisions", with_id=True)
    watching = command(commands, "watch", watch, "follow a run live (Ctrl-C stops watching the run)", with_id=True)
    watching.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    watching.add_argument("--no-worker", action="store_true", help="never start a worker, even when the run's died")
    cli_control.add_parsers(commands)
    going_on = command(
        commands, "continue", continue_conversation, "a completed or stopped run goes on (a next turn)", with_id=True
    )
    going_on.add_argument("--message", help="what comes next: a user message before its next model call")
    going_on.add_argument("--detach", action="store_true", help="start it and return at once")
    going_on.add_argument("--no-worker", action="store_true", help="do not start a worker if none is polling")
    going_on.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    _add_limit_options(going_on, with_defaults=False)
    cancel = command(commands, "cancel", cancel_run, "cancel a run: it stops cleanly, state cancelled", with_id=True)
    cancel.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for it to close")
    limits = command(
        commands, "limits", raise_limits, "change a run's limits (any subset)", with_id=True, epilog=LIMITS_HELP
    )
    _add_limit_options(limits, with_defaults=False)
    export = command(
        commands, "export", export_run, "write a run's transcript (JSONL) or a Markdown report", with_id=True
    )
    export.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    export.add_argument("--format", choices=("jsonl", "markdown"), default="jsonl", help="default jsonl")
    command(commands, "trace", trace_run, "emit a past run's spans from its history (OTEL_* exporter)", with_id=True)
    listing = command(commands, "list", list_runs, "list runs with their state, step, tokens and cost")
    listing.add_argument("--state", choices=LIST_STATES, help="only runs in this state")
    listing.add_argument("--host", type=cli_hosts.host_name, help="only runs pinned to this host")
    listing.add_argument("--waiting-for-host", action="store_true", help="only runs waiting for their host")
    listing.add_argument("--limit", type=_positive_int, default=50, help="at most this many runs (default 50)")
    cli_gc.add_parser(commands)
    cli_agents.add_parser(commands)
    cli_hosts.add_parsers(commands)
    cli_mcp.add_parser(commands)
    add_history_commands(commands, command)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _version() -> str:
    try:
        return importlib.metadata.version("durable-agent")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _add_run_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = command(commands, "run", run_agent, "start a run and follow it live (Ctrl-C detaches)", epilog=LIMITS_HELP)
    run.add_argument("goal", help="what the agent should do")
    run.add_argument("--workspace", required=True, help="folder the agent works in (its tools cannot leave it)")
    run.add_argument("--agent", help="run the agent file agents/NAME.md (see `durable-agent agents`)")
    run.add_argument("--model", help=f"model name (default {AgentInput.model_fields['model'].default})")
    run.add_argument("--fallback-model", help="model to switch to in the soft tier of a budget")
    tools = ", ".join(ALL_TOOLS)
    run.add_argument("--tools", nargs="+", metavar="TOOL", help=f"only these tools (default: all: {tools})")
    run.add_argument("--id", help="workflow id (default agent-<random>)")
    run.add_argument("--check-command", help="a final answer is accepted once this command exits 0 (docs/done.md)")
    run.add_argument("--criterion", action="append", dest="criteria", help="a success criterion (repeatable)")
    run.add_argument(
        "--host",
        type=cli_hosts.host_name,
        help="the host whose worker holds the workspace (default: DURABLE_AGENT_HOST)",
    )
    run.add_argument("--no-worker", action="store_true", help="do not start a worker if none is polling")
    run.add_argument("--detach", action="store_true", help="start the run and return at once")
    run.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    run.add_argument(
        "--approve-tools",
        nargs="+",
        action="extend",
        default=[],
        metavar="TOOL",
        help="tools whose every call waits for `approve`",
    )
    run.add_argument(
        "--approve-commands",
        nargs="+",
        action="extend",
        default=[],
        metavar="REGEX",
        help="run_command commands matching a regex wait for `approve`",
    )
    _add_limit_options(run, with_defaults=True)


def _add_limit_options(parser: argparse.ArgumentParser, with_defaults: bool) -> None:
    """One option per `LimitsPatch` field, so the CLI never lags behind the contract."""
    group = parser.add_argument_group("limits")
    defaults = Limits()
    for name, field in LimitsPatch.model_fields.items():
        kind = next(t for t in typing.get_args(field.annotation) if t is not type(None))
        default = f" (default {getattr(defaults, name):g})" if with_defaults else ""
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            metavar="N" if kind is int else "X",
            help=LIMIT_MEANINGS[name] + default,
        )


def _limit_values(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in LimitsPatch.model_fields if getattr(args, name) is not None}


# --- server and worker -----------------------------------------------------------------


def serve(args: argparse.Namespace, console: Console) -> int:
    port = args.port or _configured_local_port()
    if port_open("127.0.0.1", port):
        console.line(f"a Temporal server is already running on port {port}; nothing to do")
        return EXIT_OK
    codec = _ui_codec_server(args.ui_port, args.codec_port)
    extra_args = ["--ui-codec-endpoint", codec.url] if codec else []
    server = start_server(home(), port=port, ui_port=args.ui_port, extra_args=extra_args)
    console.line(f"Temporal dev server: {server.address} (data {server.db_file}, log {server.log_file})")
    console.line(f"Web UI: http://localhost:{args.ui_port}")
    if codec:
        console.line(f"history is encrypted; the Web UI decrypts it through the codec server at {codec.url}")
    console.line("Ctrl-C stops it")
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        console.line("server stopped")
        return EXIT_OK
    finally:
        if codec:
            codec.stop()
    raise CliError(f"the server exited with code {code}; see {server.log_file}")


def serve_demo_model(args: argparse.Namespace, console: Console) -> int:
    try:
        model = ModelServer(demo_model.respond_as_endpoint, port=args.port, model_name=demo_model.ENDPOINT_MODEL)
    except OSError as e:
        raise CliError(f"cannot listen on port {args.port}: {e.strerror or e}") from None
    model.start()
    console.line(f"the offline demo model (a fixed script, not an LLM) serves {model.base_url}; try it:")
    console.line(f"  export OPENAI_BASE_URL={model.base_url} OPENAI_API_KEY=offline-demo")
    model_flag = f"--model {demo_model.ENDPOINT_MODEL}"
    console.line(f'  mkdir try-it && durable-agent run "{demo_model.GOAL}" --workspace try-it {model_flag}')
    console.line("Ctrl-C stops it")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        model.stop()
    return EXIT_OK


def _ui_codec_server(ui_port: int, codec_port: int | None) -> CodecServer | None:
    """With an encryption key set, a codec server for the Web UI, in this process."""
    keys = EncryptionKeys.from_env()
    if keys is None:
        return None
    port = codec_port or ui_port + 1
    try:
        codec = CodecServer(PayloadCodecChain(keys), port, origins=ui_origins(ui_port), token=_codec_token())
    except OSError as e:
        message = f"cannot serve the Web UI's codec on port {port}: {e.strerror}; pick one with --codec-port"
        raise CliError(message) from None
    return codec.start()


def serve_codec(args: argparse.Namespace, console: Console) -> int:
    codec = CodecServer(
        PayloadCodecChain(EncryptionKeys.from_env()),
        args.port,
        host=args.host,
        origins=[*ui_origins(args.ui_port), *args.cors_origin],
        token=_codec_token(),
    )
    with codec:
        held = codec.codec.keys
        keys = "no key: payloads pass as they are" if held is None else f"key ids {list(held.keys)}"
        auth = f", bearer token from {TOKEN_ENV}" if codec.token else ""
        console.line(f"codec server on {codec.url} ({keys}{auth}); Ctrl-C stops it")
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    console.line("codec server stopped")
    return EXIT_OK


def _codec_token() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


def _configured_local_port() -> int:
    address = configured_address()
    return split_address(address)[1] if is_local(address) else DEFAULT_PORT


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def work(args: argparse.Namespace, console: Console) -> int:
    from durable_agent.server_wait import ServerUnreachable
    from durable_agent.tools import ToolLoadError
    from durable_agent.worker_settings import SettingsError, worker_settings
    from worker import run_worker  # imports every activity: only here

    try:
        worker_settings(task_queue())  # a bad setting fails before anything connects
    except SettingsError as e:
        raise CliError(str(e)) from None
    try:
        await run_worker(None, task_queue(), tool_modules=args.tools, connect_timeout_s=args.connect_timeout)
    except (ServerUnreachable, SettingsError, ToolLoadError) as e:
        raise CliError(str(e)) from None
    except Exception as e:  # a fatal worker error
        raise CliError(f"the worker stopped: {e}") from None
    return EXIT_OK


CANCEL_AGAIN_S = 1.0


async def _until_signalled(awaitable: Awaitable[T]) -> T | None:
    """Await it; on Ctrl-C or SIGTERM cancel it and return None instead."""
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, interrupted.set)
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.create_task(interrupted.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        waiter.cancel()
    if task.done():
        return task.result()
    # Cancelled again until it ends: a cancel can be swallowed (asyncio.wait_for returns its
    # call's result when the call ends as the cancel arrives, and the follow loop goes on).
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_AGAIN_S)
    await asyncio.gather(task, return_exceptions=True)  # its error, if any, is retrieved
    return None


# --- run -------------------------------------------------------------------------------


async def run_agent(args: argparse.Namespace, console: Console) -> int:
    demo = _demo_mode(args)
    if demo:
        _prepare_demo_workspace(Path(args.workspace).expanduser())
    agent_input = _agent_input(args, demo)
    allow_workspace(agent_input.workspace)
    client, address = await connect_or_start_server(console)
    run_id = args.id or f"agent-{uuid.uuid4().hex[:8]}"
    if demo:
        if args.no_worker or args.detach:
            console.line("note: the demo ignores --no-worker and --detach: its model and worker live in this command")
        return await _run_demo(client, address, agent_input, run_id, console, args.verbose)
    queue = task_queue()
    if not args.no_worker:
        await ensure_worker(client, queue, address, console)
    elif not await has_worker(client, queue):
        console.line(
            f"no worker polls task queue {queue}: the run makes no progress until one does "
            "(start one with `durable-agent worker`)"
        )
    handle = await _start(client, agent_input, run_id, queue, address, console, detach=args.detach)
    if args.detach:
        console.line(f"detached: follow it with `durable-agent watch {run_id}`")
        return EXIT_OK
    replace = None if args.no_worker else functools.partial(replace_worker, client, queue, address, console)
    approver = terminal_approver(handle, console)
    following = follow(handle, console, approver=approver, verbose=args.verbose, on_no_worker=replace)
    code = await _until_signalled(following)
    if code is None:
        console.line(f"detached; the run goes on. Re-attach: durable-agent watch {run_id}")
        return EXIT_INTERRUPTED
    return code


async def continue_conversation(args: argparse.Namespace, console: Console) -> int:
    from durable_agent.conversation import Continuation, continue_run

    request = Continuation(workflow_id=args.id, message=args.message, limits=LimitsPatch(**_limit_values(args)))
    client, address = await connect_or_start_server(console)
    await run_handle(args.id)  # an unknown id is one line
    if not args.no_worker:
        await ensure_worker(client, task_queue(), address, console)
    watch = {} if args.detach else {"start_signal": "watch", "start_signal_args": [WatchRequest(for_s=WATCH_LEASE_S)]}
    handle, after = await continue_run(client, request, **watch)
    console.line(f"{args.id} goes on after step {after} (run {handle.result_run_id})")
    if args.detach:
        console.line(f"detached: follow it with `durable-agent watch {args.id}`")
        return EXIT_OK
    reporter = Reporter(args.id, verbose=args.verbose)
    reporter.next_step = after + 1  # the steps before were shown by the run that made them
    following = follow(handle, console, approver=terminal_approver(handle, console), reporter=reporter)
    code = await _until_signalled(following)
    if code is None:
        console.line(f"detached; the run goes on. Re-attach: durable-agent watch {args.id}")
        return EXIT_INTERRUPTED
    return code


def _prepare_demo_workspace(workspace: Path) -> None:
    """The demo writes calc.py and test_calc.py over whatever is there: it only ever works in
    an empty folder, or one it creates."""
    if not workspace.exists():
        workspace.mkdir(parents=True)
        return
    if not workspace.is_dir():
        return  # _agent_input says so
    found = sorted(entry.name for entry in workspace.iterdir())
    if found:
        shown = ", ".join(found[:3]) + (", …" if len(found) > 3 else "")
        raise CliError(
            f"the offline demo (no OPENAI_API_KEY set) writes calc.py and test_calc.py, so it only runs in an "
            f"empty or new folder, and {workspace} holds {shown}; nothing was written. Give --workspace a new "
            "folder, or set OPENAI_API_KEY to work on this one with a real model"
        )


def _agent_input(args: argparse.Namespace, demo: bool) -> AgentInput:
    workspace = Path(args.workspace).expanduser().resolve()
    if not workspace.exists():
        raise CliError(f"workspace {args.workspace} does not exist")
    if not workspace.is_dir():
        raise CliError(f"workspace {args.workspace} is not a folder")
    _refuse_system_folder(args.workspace)
    # Only what was given: an agent file (--agent) fills in the rest.
    fields: dict[str, Any] = {"goal": args.goal, "workspace": str(workspace), "agent": args.agent}
    if args.tools is not None:
        fields["tools"] = args.tools
    if limits := _limit_values(args):
        fields["limits"] = limits
    if approval := {k: v for k, v in (("tools", args.approve_tools), ("commands", args.approve_commands)) if v}:
        fields["approval"] = approval
    model = args.model or (demo_model.MODEL if demo else None)
    if model:
        fields["model"] = model
    if args.fallback_model:
        fields["fallback_model"] = args.fallback_model
    done = {"check_command": args.check_command, "success_criteria": args.criteria}
    fields.update({k: v for k, v in done.items() if v})
    try:
        host = args.host or configured_host()  # this machine's workers serve its workspaces
    except SettingsError as e:
        raise CliError(str(e)) from None
    if host:
        fields["host"] = host
    return AgentInput.model_validate(fields)


def _refuse_system_folder(workspace: str) -> None:
    """`/` and system folders are refused by every worker: say so before a run is started to be refused."""
    from activities.workspace import WorkspaceRefused, check_allowed

    try:
        check_allowed(workspace, roots=["/"])  # the roots are the worker's to check; system folders never pass
    except WorkspaceRefused as e:
        raise CliError(str(e)) from None


async def _start(
    client: Client,
    agent_input: AgentInput,
    run_id: str,
    queue: str,
    address: str,
    console: Console,
    detach: bool = False,
) -> WorkflowHandle[Any, AgentResult]:
    await _refuse_closed_id(client, run_id)
    try:
        # A followed run is watched from its first model call on (see follow.WATCH_LEASE_S).
        watch = {} if detach else {"start_signal": "watch", "start_signal_args": [WatchRequest(for_s=WATCH_LEASE_S)]}
        handle = await start_agent(client, agent_input, run_id, queue, **watch)
    except WorkflowAlreadyStartedError:
        raise CliError(f"a run with id {run_id!r} already exists; pick another --id") from None
    where = ui_url(address)
    link = f" · Web UI: {where}/namespaces/{client.namespace}/workflows/{run_id}" if where else ""
    console.line(f"started run {run_id} on task queue {queue}{link}")
    console.line(f"goal: {agent_input.goal}")
    return handle


async def _refuse_closed_id(client: Client, run_id: str) -> None:
    """Temporal would start a new run under a closed run's id; a person reusing an id by mistake is told."""
    try:
        description = await client.get_workflow_handle(run_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return
        raise
    state = description.status.name.lower() if description.status else "closed"
    if description.status != WorkflowExecutionStatus.RUNNING:
        raise CliError(
            f"a run with id {run_id!r} already ran and ended ({state}); see `durable-agent status {run_id}` "
            "or pick another --id"
        )


async def _run_demo(
    client: Client, address: str, agent_input: AgentInput, run_id: str, console: Console, verbose: bool
) -> int:
    from durable_agent.demo import Demo

    console.line(
        "no OPENAI_API_KEY set: using the offline demo model, which plays one fixed scenario whatever "
        "the goal (write calc.py and its test, find the bug, fix it). Set OPENAI_API_KEY for a real model."
    )
    with Demo(console, address, run_id) as demo:
        await demo.wait_ready(client)
        handle = await _start(client, agent_input, run_id, demo.queue, address, console)
        code = await _until_signalled(follow(handle, console, on_progress=demo.on_progress, verbose=verbose))
        if code is None:
            # The demo's model and worker live in this command, so the run cannot go on without it.
            await handle.terminate("the offline demo was interrupted")
            console.line(
                "interrupted: the demo's model and worker run inside this command, so the demo run was terminated"
            )
            return EXIT_INTERRUPTED
        console.line(demo.report())
        return code


# --- following and inspecting ----------------------------------------------------------


async def watch(args: argparse.Namespace, console: Console) -> int:
    handle, running = await run_handle(args.id)
    if not running:
        lines, code = await _ended(handle)
        console.lines(lines)
        return code
    current = await snapshot_status(handle)
    reporter = None
    if current is not None:
        console.lines(render.status_lines(args.id, current))
        reporter, done = await caught_up(handle, current, args.verbose)
        console.lines(done)

    async def following() -> int:
        # Said once Ctrl-C is ours to handle: a person (or a script) may press it right after.
        console.line("following (Ctrl-C stops watching; the run goes on)")
        replace = None if args.no_worker else await watch_replacer(handle, console)
        return await follow(
            handle, console, since=current, reporter=reporter, verbose=args.verbose, on_no_worker=replace
        )

    code = await _until_signalled(following())
    if code is None:
        console.line(f"stopped watching; the run goes on. Watch again: durable-agent watch {args.id}")
        return EXIT_INTERRUPTED
    return code


async def status(args: argparse.Namespace, console: Console) -> int:
    handle, running = await run_handle(args.id)
    if not running:
        # The result is in history: no worker needed (a query on a closed run needs one).
        console.lines((await _ended(handle))[0])
        return EXIT_OK
    current = await snapshot_status(handle)
    if current is None and (failing := await failing_task(handle)) is not None:
        raise CliError(f"{args.id} is running, but its workflow task fails: {failing}")
    if current is None:
        console.lines(await _status_from_history(handle))
        return EXIT_OK
    console.lines(render.status_lines(args.id, current))
    waiting = await model_call_waiting(handle)
    if waiting is not None:
        console.line(f"waiting: {waiting}")
    return EXIT_OK


async def _status_from_history(handle: WorkflowHandle[Any, AgentResult]) -> list[str]:
    """What the server knows of a run no worker answers for: its search attributes (written at
    once for a state change, at most every 10 s for step, tokens and cost) and pending activities."""
    from workflows.agent import AGENT_COST, AGENT_STATE, AGENT_STEP, AGENT_TOKENS  # the workflow's own keys

    description = await handle.describe()
    found = description.typed_search_attributes
    tokens = found.get(AGENT_TOKENS) or 0
    shown = _cost_text(tokens, found.get(AGENT_COST))
    cost_text = f" · cost {shown.removeprefix('cost ')}" if shown != "-" else ""
    lines = [
        f"{handle.id}: {found.get(AGENT_STATE) or 'running'} at step {found.get(AGENT_STEP) or 0} · "
        f"{tokens:,} tokens{cost_text} (from its search attributes)"
    ]
    lines += [
        f"pending: {activity.activity_type.name} (attempt {activity.attempt})"
        for activity in description.raw_description.pending_activities
    ]
    lines.append(
        f"no worker answered within {QUERY_TIMEOUT.seconds} s: the run makes no progress and its live status "
        "(usage, limits, pending approvals) needs one; start one with `durable-agent worker`"
    )
    return lines


async def _ended(handle: WorkflowHandle[Any, AgentResult]) -> tuple[list[str], int]:
    """An ended run's lines and exit code, from its history."""
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        return [f"{handle.id}: {failure_text(e)}"], EXIT_FAILED
    return [f"{handle.id}:", *render.result_lines(result)], EXIT_CODES[result.state]


async def export_run(args: argparse.Namespace, console: Console) -> int:
    from durable_agent import export
    from durable_agent.history import HistoryError

    handle, running = await run_handle(args.id)
    try:
        if running:
            report = await export.running_report(handle, QUERY_TIMEOUT)
        else:
            report = await export.closed_report(await connect_client(), args.id)
    except RPCError as e:
        message = f"no worker answered the run's queries ({e.message}); start one with `durable-agent worker`"
        raise CliError(message) from None
    except WorkflowQueryFailedError as e:
        raise CliError(f"the run's worker did not answer its queries ({e}); ask again") from None
    except HistoryError as e:
        raise CliError(str(e)) from None
    # Redacted again with this machine's secrets: runs recorded before redaction existed.
    report = worker_redactor().value(report)
    lines = export.jsonl(report.messages) if args.format == "jsonl" else [export.markdown(report).rstrip("\n")]
    if args.output is None:
        console.lines(lines)
        return EXIT_OK
    try:
        args.output.write_text("".join(line + "\n" for line in lines))
    except OSError as e:
        raise CliError(f"cannot write {args.output}: {e.strerror or e}") from None
    what = f"{len(lines)} messages" if args.format == "jsonl" else "a Markdown report"
    console.line(f"wrote {what} to {args.output}")
    return EXIT_OK


async def trace_run(args: argparse.Namespace, console: Console) -> int:
    from durable_agent.history import HistoryError, emit_spans, replay_chain

    tracing = telemetry.configured()
    if tracing is None:
        raise CliError(
            "no trace exporter configured: set OTEL_TRACES_EXPORTER (otlp, console) or OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    await run_handle(args.id)
    try:
        chain = await replay_chain(await connect_client(), args.id)
    except HistoryError as e:
        raise CliError(str(e)) from None
    emitted = emit_spans(chain, tracing.tracer)
    note = "" if chain.closed else " (the run is still running: its invoke_agent span is emitted when it closes)"
    console.error(f"emitted {emitted} spans of {args.id} from {len(chain.runs)} run(s) of its history{note}")
    return EXIT_OK


async def list_runs(args: argparse.Namespace, console: Console) -> int:
    client = await connect_client()
    # A continue-as-new chain is one run to a person: its latest run stands for it.
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus != 'ContinuedAsNew'"
    if args.state in CLOSED_STATES:
        query += f" AND ExecutionStatus = '{CLOSED_STATES[args.state]}'"
    elif args.state:
        query += f" AND AgentState = '{args.state}'"
    if args.state and args.state not in TERMINAL_STATES and args.state not in CLOSED_STATES:
        # A run terminated by the server keeps the AgentState it had: live means Running.
        query += " AND ExecutionStatus = 'Running'"
    if args.host:
        query += f" AND AgentHost = '{args.host}'"
    waiting = await cli_hosts.waiting_runs(client) if args.waiting_for_host else None
    rows: dict[str, tuple[str, ...]] = {}
    async for run in client.list_workflows(query):
        if waiting is not None and run.id not in waiting:
            continue
        # Newest first: a run continued with `durable-agent continue` shows as its latest run.
        rows.setdefault(run.id, _list_row(run))
        if len(rows) >= args.limit:
            break
    if not rows:
        console.line("no runs" + (f" in state {args.state}" if args.state else ""))
        return EXIT_OK
    console.lines(render.table([("ID", "STATE", "STEP", "TOKENS", "COST"), *rows.values()]))
    return EXIT_OK


def _list_row(run: WorkflowExecution) -> tuple[str, ...]:
    from workflows.agent import AGENT_COST, AGENT_STATE, AGENT_STEP, AGENT_TOKENS  # the workflow's own keys

    found = run.typed_search_attributes
    # A run that never wrote its attributes (e.g. failed on bad input), or that closed without
    # running workflow code (terminated, timed out, continued as new), shows Temporal's status.
    state = found.get(AGENT_STATE)
    if not state or (state not in TERMINAL_STATES and run.status != WorkflowExecutionStatus.RUNNING):
        state = run.status.name.lower() if run.status else "?"
    cost = found.get(AGENT_COST)
    tokens = found.get(AGENT_TOKENS) or 0
    return run.id, state, str(found.get(AGENT_STEP) or 0), f"{tokens:,}", _cost_text(tokens, cost)


def _cost_text(tokens: int, cost: float | None) -> str:
    """The search attributes' cost: the workflow leaves AgentCostUsd unset while a model without
    a price was used; a run with no model reply yet has no cost to show either way."""
    return "-" if not tokens else "cost unknown" if cost is None else f"${cost:.4f}"


# --- gc --------------------------------------------------------------------------------


# --- control ---------------------------------------------------------------------------


async def cancel_run(args: argparse.Namespace, console: Console) -> int:
    handle, _ = await run_handle(args.id, running=True)
    await handle.cancel()
    console.line(f"cancel sent to {args.id}: it stops cleanly with state cancelled")
    if args.no_wait:
        return EXIT_OK
    try:
        lines, _ = await asyncio.wait_for(_ended(handle), CANCEL_WAIT_S)
    except TimeoutError:
        console.line(f"{args.id} has not closed within {CANCEL_WAIT_S:g} s: it closes when a worker takes the cancel")
        return EXIT_OK
    console.lines(lines)
    return EXIT_OK  # the cancel was delivered; the lines say how the run ended


async def raise_limits(args: argparse.Namespace, console: Console) -> int:
    given = _limit_values(args)
    if not given:
        raise CliError("give at least one limit, e.g. --hard-steps 80 (see `durable-agent limits --help`)")
    handle, _ = await run_handle(args.id, running=True)
    limits = await handle.execute_update("raise_limits", LimitsPatch(**given), result_type=Limits)
    console.line(f"{args.id}: limits now {render.limits_text(limits)}")
    return EXIT_OK


if __name__ == "__main__":
    main()
