"""`DurableAgentPlugin`: durable-agent inside the user's own Temporal application.

    client = await Client.connect(address, plugins=[DurableAgentPlugin(tools=[lookup_order, refund])])
    worker = Worker(client, task_queue="support", workflows=[MyWorkflow])  # the plugin comes from the client

On the client: the data converter (pydantic JSON, compressed, encrypted with
`DURABLE_AGENT_ENCRYPTION_KEY` when set) and `connect`'s interceptors (a query refused as stale
asked again, tracing). On each worker:
`AgentWorkflow`, its activities (the model call, the built-in tools, the archive, the
skills, the cleanup, `tool_catalog`, the MCP calls), the metrics and redaction interceptors, the
workflow runner behind the stale-activation guard (durable_agent/activation_guard.py), and, while the
worker runs, one activity worker per given tool on the tool's own task queue
(durable_agent/tools.py). With a host name (`DURABLE_AGENT_HOST`), one more activity worker
polls the host's own queue for the activities of runs pinned to it (workflows/hosts.py).
`worker.py` and `durable-agent worker` are built on it too.
A user's workflow runs an agent as a child with `run_agent` (durable_agent/child.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Interceptor, UnsandboxedWorkflowRunner, Worker, WorkerConfig

from activities import model_context
from activities.agents import AgentActivities
from activities.approval_diff import ApprovalDiffActivities
from activities.archive import ArchiveActivities
from activities.cleanup import CleanupActivities
from activities.host_check import HostCheckInterceptor
from activities.host_pollers import host_pollers
from activities.mcp_tools import McpActivities
from activities.model import ModelActivities
from activities.redaction import RedactingInterceptor
from activities.run_opening import RunOpeningActivities
from activities.skills import SkillActivities
from activities.snapshots import SnapshotActivities
from activities.stopped import StoppedAttemptInterceptor
from activities.tools import ToolActivities
from activities.user_tools import UserToolActivities, redact_tool_outcome
from durable_agent.activation_guard import guarded
from durable_agent.codecs import EncryptionKeys
from durable_agent.connection import client_interceptors, data_converter
from durable_agent.metrics import MetricsInterceptor
from durable_agent.model_queue import ModelQueueInterceptor
from durable_agent.tools import Tool, load_modules, unique
from durable_agent.worker_settings import configured_host
from workflows import context_handoff
from workflows.agent import AgentWorkflow
from workflows.hosts import host_queue
from workflows.run_opening import OPEN_RUN_ACTIVITY
from workflows.snapshots import SNAPSHOT_ACTIVITY

PLUGIN_NAME = "durable_agent.DurableAgentPlugin"


class DurableAgentPlugin(SimplePlugin):
    """Adds durable-agent to a `Client` and the `Worker`s built on it (see the module docstring)."""

    def __init__(
        self,
        tools: Sequence[Tool] = (),
        *,
        tool_modules: Sequence[str] = (),
        encryption_keys: EncryptionKeys | None = None,
        model_task_queue: str | None = None,
        activities: Sequence[Callable[..., Any]] | None = None,
        worker_interceptors: Sequence[Interceptor] | None = None,
        host: str | None = None,
        agents_dir: str | None = None,
    ) -> None:
        """`tools`: decorated tools; `tool_modules`: modules whose tools to load as well.
        `encryption_keys`: default from `DURABLE_AGENT_ENCRYPTION_KEY`. `model_task_queue`:
        where model calls run when not on the worker's queue. `activities`: in place of the
        model call and the built-in tools (a test's model, other tool limits); the workflow's
        local activities are added to them whatever they are. `worker_interceptors`: in place of
        metrics, model routing and redaction (a test's worker as it was before redaction).
        `host`: this machine's host name, default `DURABLE_AGENT_HOST` (workflows/hosts.py).
        `agents_dir`: the folder of agent files input `agent` names, besides the workspace's
        `agents/` (default `DURABLE_AGENT_AGENTS_DIR`)."""
        self.host = host or configured_host()
        self.tools = unique([*tools, *load_modules(tool_modules)])
        self._model_task_queue = model_task_queue
        self._activities = activities
        self._worker_interceptors = worker_interceptors
        self._agents = [AgentActivities(agents_dir).load_agent] if agents_dir else []
        converter = data_converter(encryption_keys)
        super().__init__(
            PLUGIN_NAME,
            data_converter=_with_codec(converter),
            interceptors=client_interceptors(),
            workflows=[AgentWorkflow],
        )
        self._tool_activities: dict[str, UserToolActivities] = {}
        self._tool_queues: set[str] = set()
        """The queues of the workers this plugin starts beside a worker: tools, and the host's."""
        self._models: list[ModelActivities] = []
        """The model calls this plugin made, one per agent worker: each closed when its worker stops."""
        self._configured: dict[str, WorkerConfig] = {}
        """Each agent worker's config as this plugin left it: its host worker serves the same."""

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        queue = config["task_queue"]  # type: ignore[typeddict-item]
        if queue in self._tool_queues:
            return config  # a tool's own worker (it inherits the client's plugins): only its tool
        config = super().configure_worker(config)
        # A user's worker may list AgentWorkflow itself: once is enough.
        config["workflows"] = list(dict.fromkeys(config.get("workflows") or []))
        context_handoff.install_sink(model_context.offer)  # a call scheduled here finds its messages here
        mcp = McpActivities()
        tools = UserToolActivities(self.tools, queue, mcp)
        self._tool_activities[queue] = tools
        self._tool_queues.update(tools.queues())
        if self._activities is None:
            self._models.append(ModelActivities())
            ours = self._models[-1].all()
        else:
            ours = list(self._activities)
        given = [*(config.get("activities") or []), *self._agents, *ours]
        needed = [*workflow_activities(), tools.tool_catalog, tools.run_tool_here, *mcp.all()]
        needed.append(tools.dependencies.wait_for_dependency)  # activity tools' dependencies, by URL
        config["activities"] = with_run_opening(with_missing(given, needed))
        ours_around = (
            interceptors(self._model_task_queue) if self._worker_interceptors is None else self._worker_interceptors
        )
        # The host check outermost, whatever the interceptors: a local try on the wrong host never runs.
        config["interceptors"] = [HostCheckInterceptor(self.host), *(config.get("interceptors") or []), *ours_around]
        config["workflow_runner"] = guarded(config.get("workflow_runner"))
        config["unsandboxed_workflow_runner"] = guarded(
            config.get("unsandboxed_workflow_runner"), default=UnsandboxedWorkflowRunner
        )
        self._configured[queue] = config
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """The worker, and beside it one activity worker per tool on its own task queue: a run
        whose tool no live worker serves waits in that queue until one does."""
        config = worker.config()
        if config["task_queue"] in self._tool_queues:  # type: ignore[typeddict-item]
            await next(worker)
            return
        tools = self._tool_activities.get(config["task_queue"])  # type: ignore[typeddict-item]
        async with AsyncExitStack() as stack:
            if (model := self._model_of(worker.config(active_config=True))) is not None:
                stack.callback(self._models.remove, model)  # done with once its worker stops
                await stack.enter_async_context(model.serving())  # entered first, so left last
            if tools is not None and tools.mcp is not None:
                # Pushed first, so run last: after the host's and the tools' workers, which may start servers, stopped.
                stack.push_async_callback(tools.mcp.pool.close_all)
            for queue, activities in (tools.queues(self.host) if tools else {}).items():
                worker_of_tool = tool_worker(config["client"], queue, activities, config.get("identity"))  # type: ignore[typeddict-item]
                await stack.enter_async_context(worker_of_tool)
            if self.host is not None:
                ours = self._configured.get(config["task_queue"], config)  # type: ignore[typeddict-item]
                await stack.enter_async_context(self._host_worker({**config, **ours}))
            if tools is not None and tools.mcp is not None:
                warming = asyncio.create_task(tools.mcp.warm_up())
                warming.add_done_callback(_seen)  # a failed import fails the first MCP call, told there
                stack.callback(warming.cancel)
            await super().run_worker(worker, next)

    def _model_of(self, config: WorkerConfig) -> ModelActivities | None:
        """The model calls this plugin made for this worker: found among its activities (two
        workers of one queue each have their own)."""
        owners = {id(getattr(function, "__self__", None)) for function in config.get("activities") or []}
        return next((m for m in self._models if owners & {id(m), id(m.outages)}), None)

    def _host_worker(self, config: WorkerConfig) -> Worker:
        """The worker of this host's queue: the same activities as the agent worker (the run's
        workspace-bound ones are scheduled here, the model call never is), the same identity."""
        queue = host_queue(config["task_queue"], self.host or "")  # type: ignore[typeddict-item]
        self._tool_queues.add(queue)
        return Worker(
            config["client"],  # type: ignore[typeddict-item]
            task_queue=queue,
            identity=config.get("identity"),
            activities=list(config.get("activities") or []),
            interceptors=list(config.get("interceptors") or []),
            max_concurrent_activities=config.get("max_concurrent_activities") or 1_000,
            max_heartbeat_throttle_interval=config.get("max_heartbeat_throttle_interval") or timedelta(seconds=0.5),
            graceful_shutdown_timeout=config.get("graceful_shutdown_timeout") or timedelta(seconds=5),
        )


def _seen(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _with_codec(converter: DataConverter) -> Callable[[DataConverter | None], DataConverter]:
    """The plugin's converter, unless the client already has one with a codec (its own encryption)."""
    return lambda existing: existing if existing is not None and existing.payload_codec else converter


def tool_worker(
    client: Client, queue: str, activities: list[Callable[..., Any]], identity: str | None = None
) -> Worker:
    """`identity`: the agent worker's, which names its process: a replacement worker on the same
    machine then fails the calls this process held, at once (durable_agent/takeover.py)."""
    return Worker(
        client,
        task_queue=queue,
        identity=identity,
        activities=activities,
        interceptors=[MetricsInterceptor(), RedactingInterceptor()],
        max_concurrent_activities=20,
    )


def workflow_activities() -> list[Callable[..., Any]]:
    """The tools, the agent files, the archive, the skills, the run's cleanup, the workspace
    snapshots and the host probe: some run as local activities, which only the worker running the workflow can run."""
    snapshots = SnapshotActivities()  # one store: a step's snapshot is taken by its last tool call or on its own
    return [
        *ToolActivities(snapshots=snapshots).all(),
        *AgentActivities().all(),
        *ArchiveActivities().all(),
        *SkillActivities().all(),
        *CleanupActivities().all(),
        *snapshots.all(),
        *ApprovalDiffActivities().all(),
        redact_tool_outcome,
        host_pollers,
    ]


def with_missing(activities: list[Callable[..., Any]], needed: list[Callable[..., Any]]) -> list[Callable[..., Any]]:
    """`activities`, deduplicated by name, plus any of `needed` it lacks by name: a worker given
    its own list (a test's model, other tool limits) must still run the workflow's local
    activities, or a run would fail its workflow task on every attempt."""
    chosen: dict[str, Callable[..., Any]] = {}
    for function in [*activities, *needed]:
        chosen.setdefault(activity_name(function), function)
    return list(chosen.values())


def with_run_opening(activities: list[Callable[..., Any]]) -> list[Callable[..., Any]]:
    """`activities` and `open_run`, made of the `check_workspace`, `snapshot_workspace` and
    `discover_skills` among them (activities/run_opening.py), unless they hold one."""
    by_name = {activity_name(function): function for function in activities}
    if OPEN_RUN_ACTIVITY in by_name:
        return activities
    opening = RunOpeningActivities(by_name["check_workspace"], by_name[SNAPSHOT_ACTIVITY], by_name["discover_skills"])
    return [*activities, *opening.all()]


def activity_name(function: Callable[..., Any]) -> str:
    return activity._Definition.must_from_callable(function).name  # the SDK's own name lookup


def interceptors(model_queue: str | None) -> list[Interceptor]:
    """Every worker's interceptors. Redaction is innermost, so what leaves an activity for
    history, metrics or traces is redacted first; `model_queue` routes model calls there.
    A stopped attempt is told apart outermost, so metrics still see the cancel."""
    routing = [ModelQueueInterceptor(model_queue)] if model_queue else []
    return [StoppedAttemptInterceptor(), MetricsInterceptor(), *routing, RedactingInterceptor()]
