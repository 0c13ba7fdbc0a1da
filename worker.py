"""The worker process: connects, registers the agent workflow and its activities, runs.

`python worker.py` is the same as `durable-agent worker`. Only wiring lives here.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.model import ModelActivities
from activities.model_clients import openai_sdk
from activities.tools.sandbox import remove_stale_cgroups
from durable_agent import telemetry
from durable_agent.codecs import act_as_worker
from durable_agent.metrics import (
    client_meter,
    count_recoveries,
    prometheus_address,
    publish_waiting_runs,
    worker_runtime,
)
from durable_agent.plugin import DurableAgentPlugin, interceptors
from durable_agent.server_wait import ServerUnreachable, connect_when_up, gone_at_start, until_answering, watch_server
from durable_agent.takeover import take_over, worker_identity
from durable_agent.tools import ToolLoadError, configured_tools
from durable_agent.worker_settings import SettingsError, WorkerSettings, configured_host, worker_settings
from workflows.hosts import host_queue

STICKY_TIMEOUT = timedelta(seconds=1)
"""How long the server holds a run's next task for the worker that has it cached. The
default 10 s is what a dead worker would cost before another one takes over its runs;
1 s still keeps nearly every task on the cached worker in normal operation. With 50
busy agents on one worker ~5-10 % of tasks outwait it and go to the shared queue, which
the same worker then serves: measured, that was no slower than a 3 s timeout."""

GC_THRESHOLDS = (10_000, 20, 20)
"""The collector's thresholds once the worker runs: a young collection every 10,000 new
objects, not 700, and an older one every 20 of those, not 10. With hundreds of runs in flight
the worker makes objects fast, and the default thresholds start a collection at every 700
objects made beyond those freed;
with `settle_garbage_collector` this took a few per cent off the worker's CPU (docs/fleet.md)."""


WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
"""The SDK's sandbox re-imports the workflow module for every run and enters itself for
every payload of every activation, which nearly doubled a replay's time when measured
(docs/recovery.md). A new worker replays each run it takes over before its first step, so that cost would sit
on the path of every crash recovery (docs/recovery.md). What the sandbox guards against
(I/O, clocks, randomness in workflow code) is still checked: tests/test_replay.py replays
recorded histories through the sandboxed runner, which raises on any restricted call."""


HEARTBEAT_THROTTLE = timedelta(seconds=0.5)
"""The SDK forwards an activity's heartbeats at most every 0.8 x its heartbeat timeout (4 s
for a command's 5 s): a beat held back that long, then delayed a little more (a busy
server, a stalled loop), and a live call is timed out and retried. At most one every 0.5 s
forwards each of our beats, one per third of the timeout, as it comes (~1-3 ms of server
CPU each); only commands run long enough to send more than the first."""


def build_worker(
    client: Client, queue: str | None = None, *, tool_modules: Sequence[str] = (), **overrides: object
) -> Worker:
    """The worker of the agent task queue, built on `DurableAgentPlugin`: the workflows, the
    tools (the built-in ones, and those of `tool_modules`, `DURABLE_AGENT_TOOLS` and the
    `durable_agent.tools` entry points) and, unless they have a queue of their own, the model calls."""
    settings = worker_settings(queue)
    plugin = DurableAgentPlugin(
        tools=configured_tools(tool_modules),
        model_task_queue=settings.model_task_queue if settings.model_queue_is_separate else None,
        activities=overrides.pop("activities", None),  # type: ignore[arg-type]
        worker_interceptors=overrides.pop("interceptors", None),  # type: ignore[arg-type]
    )
    options: dict[str, object] = {
        "task_queue": settings.task_queue,
        # Names this process so that a replacement can tell, at start, that it is gone.
        "identity": worker_identity(),
        "plugins": [plugin],
        "workflow_runner": WORKFLOW_RUNNER,
        "sticky_queue_schedule_to_start_timeout": STICKY_TIMEOUT,
        "max_heartbeat_throttle_interval": HEARTBEAT_THROTTLE,
        "graceful_shutdown_timeout": timedelta(seconds=5),
        **settings.slots(),
    }
    if not settings.model_queue_is_separate and settings.model_rps is not None:
        options["max_task_queue_activities_per_second"] = settings.model_rps
    options.update(overrides)
    return Worker(client, **options)  # type: ignore[arg-type]


def build_model_worker(client: Client, queue: str | None = None) -> Worker | None:
    """The worker of the model task queue when it is not the agent queue; None otherwise.
    Its rate (`DURABLE_AGENT_MODEL_RPS`) is enforced by the server for every worker of it."""
    settings = worker_settings(queue)
    if not settings.model_queue_is_separate:
        return None
    model = ModelActivities()
    return Worker(
        client,
        task_queue=settings.model_task_queue,
        identity=worker_identity(),
        activities=model.all(),
        # Its clients' connections closed when it stops, as the agent worker's plugin does.
        plugins=[SimplePlugin("durable_agent.model_clients", run_context=model.serving)],
        interceptors=interceptors(None),
        max_task_queue_activities_per_second=settings.model_rps,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        graceful_shutdown_timeout=timedelta(seconds=5),
        max_concurrent_activities=settings.max_concurrent_activities,
    )


def start_takeover(worker: Worker) -> asyncio.Task[int]:
    """Once the worker polls: retry at once the tool calls that a dead worker of this
    machine held, rather than after their heartbeat timeout (durable_agent/takeover.py)."""
    config = worker.config()
    return asyncio.create_task(_take_over(config["client"], config["task_queue"], config["identity"] or ""))


async def _take_over(client: Client, queue: str, identity: str) -> int:
    taken = await take_over(client, queue, identity)
    count_recoveries(client_meter(client), "takeover", taken)
    return taken


def start_waiting_runs(worker: Worker) -> asyncio.Task[None] | None:
    """With metrics on, the gauge of runs waiting for a person (durable_agent/metrics.py)."""
    if prometheus_address() is None:
        return None
    config = worker.config()
    return asyncio.create_task(publish_waiting_runs(config["client"], config["task_queue"]))


async def run_worker(
    client: Client | None = None,
    queue: str | None = None,
    tool_modules: Sequence[str] = (),
    connect_timeout_s: float | None = None,
) -> None:
    """Run until SIGINT or SIGTERM, then give in-flight tasks a few seconds and shut down.

    The one worker runtime: `python worker.py` and `durable-agent worker` both run this.
    Without a `client` it waits for the server (durable_agent/server_wait.py): as long as it
    takes, unless `connect_timeout_s` or the settings' limit says otherwise. A fatal worker
    error is raised.
    """
    settings = worker_settings(queue)  # a bad setting fails before anything connects
    configured_host()
    act_as_worker()
    watch_commands_by_pidfd()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    owned = client is None
    if client is None:
        limit = settings.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        client = await _connect_unless_stopped(limit, stop)
        if client is None:
            print("worker stopped before the server answered", flush=True)
            return
    while True:
        try:
            await _serve(client, settings, queue, tool_modules, stop)
            return
        except RuntimeError as e:
            if not gone_at_start(e):
                raise
        _say("the worker stopped while the Temporal server was away; it starts again when the server answers")
        client = await _answering_again(client, owned, stop)
        if client is None:
            print("worker stopped before the server answered", flush=True)
            return
        _say(f"the Temporal server at {client.service_client.config.target_host} answers again")


async def _answering_again(client: Client, owned: bool, stop: asyncio.Event) -> Client | None:
    """The client to start the workers again with, once the server answers; None on stop.
    A connection of our own is made anew: the stopped worker can stay registered with the old
    one's core client, which then refuses a new worker on the same task queue ("Registration
    of multiple workers with overlapping worker task types ... not allowed")."""
    if owned:
        return await _connect_unless_stopped(None, stop)
    return client if await until_answering(client, stop) else None


async def _serve(
    client: Client, settings: WorkerSettings, queue: str | None, tool_modules: Sequence[str], stop: asyncio.Event
) -> None:
    """The workers, until `stop` (then a graceful shutdown) or a fatal error, which is raised."""
    workers = [build_worker(client, queue, tool_modules=tool_modules)]
    model_worker = build_model_worker(client, queue)
    if model_worker is not None:
        workers.append(model_worker)
    running = asyncio.ensure_future(asyncio.gather(*(w.run() for w in workers)))
    takeover = start_takeover(workers[0])
    takeover.add_done_callback(_report_takeover)
    waiting = start_waiting_runs(workers[0])
    watching = asyncio.create_task(watch_server(client, _say))
    print(
        f"worker polling task queue {settings.task_queue!r} on {client.service_client.config.target_host}", flush=True
    )
    if (host := configured_host()) is not None:
        print(f"host {host}: also polling task queue {host_queue(settings.task_queue, host)!r}", flush=True)
    if settings.model_queue_is_separate:
        print(f"model calls on task queue {settings.model_task_queue!r}", flush=True)
    # openai is imported once the worker polls, so that a replacement worker polls sooner.
    await asyncio.to_thread(openai_sdk)
    if stale := await asyncio.to_thread(remove_stale_cgroups):
        print(f"removed {stale} command cgroup(s) left by dead workers", flush=True)
    settle_garbage_collector()
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    takeover.cancel()
    watching.cancel()
    if waiting is not None:
        waiting.cancel()
    stopping.cancel()
    if running.done():
        running.result()  # raises the fatal error
        return
    print("stopping: in-flight activities get a few seconds to finish", flush=True)
    await asyncio.gather(*(w.shutdown() for w in workers))
    await running
    print("worker stopped", flush=True)


async def _connect_unless_stopped(limit_s: float | None, stop: asyncio.Event) -> Client | None:
    """A client once the server answers (durable_agent/server_wait.py); None on Ctrl-C or
    SIGTERM while waiting for it."""
    connecting = asyncio.ensure_future(connect_when_up(worker_runtime(), limit_s, _say))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)
    return None


def _say(line: str) -> None:
    print(line, flush=True)


def watch_commands_by_pidfd() -> None:
    """On Python 3.11, asyncio waits for each child process in a thread of its own, started
    per command; a pidfd on the event loop does it without (3.12 does this by default)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))  # refused where the kernel or seccomp lacks it
    except OSError:
        return
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())  # 3.11's watcher works only once attached
    asyncio.set_child_watcher(watcher)


def settle_garbage_collector() -> None:
    """Once per process, when the worker has imported all it will (openai last): what start-up
    made lives as long as the process (modules, the SDK, the clients), so it leaves the
    collector's scans (`gc.freeze`), which walked all of it at every full collection; and
    GC_THRESHOLDS. Not in `DurableAgentPlugin`: the collector of a user's own worker is theirs."""
    if gc.get_freeze_count():
        return  # done already (a restart after the server was away), or the process's owner froze it
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _report_takeover(takeover: asyncio.Task[int]) -> None:
    if not takeover.cancelled() and takeover.result():
        print(f"retried at once {takeover.result()} tool call(s) held by dead workers", flush=True)


def main() -> None:
    try:
        asyncio.run(run_worker())
    except (SettingsError, ToolLoadError) as e:
        _exit_with(f"worker.py: {e}", 2)
    except ServerUnreachable as e:
        _exit_with(f"worker.py: {e}", 1)
    except Exception as e:  # a fatal worker error
        _exit_with(f"worker.py: the worker stopped: {e}", 1)
    telemetry.shutdown()  # export the last spans: os._exit below skips the exporters' own exit hooks
    # The core bridge can abort at interpreter exit (PyGILState_Release) while its runtime
    # winds down; everything is shut down by now, so leave without running finalizers.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _exit_with(line: str, code: int) -> None:
    """Errors are one line on stderr (no traceback)."""
    print(line, file=sys.stderr, flush=True)
    os._exit(code)


if __name__ == "__main__":
    main()
