"""What a worker process is configured with, from its environment, checked at start.

- `DURABLE_AGENT_MODEL_TASK_QUEUE`: the task queue of `call_model`. Default: the agent's
  own queue, or `<agent queue>-model` when a rate is set (a task queue's rate limit
  covers every activity on it, and tools must not wait behind the model's budget).
- `DURABLE_AGENT_MODEL_RPS`: model calls per second across every worker of that queue,
  enforced by the Temporal server; a call over the rate waits in the queue, scheduled but
  not started.
- `DURABLE_AGENT_CONNECT_TIMEOUT_S`: how long a worker waits for an unreachable server at
  start before it gives up (default: forever; durable_agent/server_wait.py).
- `DURABLE_AGENT_MAX_CONCURRENT_ACTIVITIES`, `..._WORKFLOW_TASKS`, `..._LOCAL_ACTIVITIES`
  and `DURABLE_AGENT_MAX_CACHED_WORKFLOWS`: the worker's slots. A waiting model call holds
  an activity slot and a cached run, nothing else, so the defaults serve 500 waiting agents.
"""

from __future__ import annotations

import os
import re

from pydantic import BaseModel, Field, ValidationError

from durable_agent.connection import task_queue
from workflows.types import HOST_NAME

MAX_SLOTS = 1_000_000
"""Above what one process could serve, and within what the SDK's core accepts (a larger
number failed the worker at start with "failed to extract field WorkerConfig.tuner")."""


class WorkerSettings(BaseModel):
    task_queue: str
    model_task_queue: str
    model_rps: float | None = Field(default=None, ge=0.01, le=MAX_SLOTS, allow_inf_nan=False)
    """At least one call per 100 s: a rate near 0 would hold every model call for good."""
    max_concurrent_activities: int = Field(default=1_000, ge=1, le=MAX_SLOTS)
    """Model calls and commands; the SDK's default of 100 would queue the 101st waiting agent."""
    max_concurrent_workflow_tasks: int = Field(default=20, ge=2, le=MAX_SLOTS)
    """Workflow tasks the worker holds at once. A held task is started on the server, so its
    1.5 s timeout (workflows/options.py) runs while it waits for the worker's one Python
    thread; too many held after a wave of model replies expire, and each expiry replays its
    run (docs/fleet.md, "Worker sizing"). Tasks beyond it wait on the server instead."""
    max_concurrent_local_activities: int = Field(default=200, ge=1, le=MAX_SLOTS)
    """The file tools, which take milliseconds."""
    max_cached_workflows: int = Field(default=2_000, ge=0, le=MAX_SLOTS)
    """Runs kept in memory between tasks; one evicted is replayed from history at its next task."""
    connect_timeout_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """None: wait for the server as long as it takes, as a worker under a supervisor should."""

    @property
    def model_queue_is_separate(self) -> bool:
        return self.model_task_queue != self.task_queue

    def slots(self) -> dict[str, int]:
        """The `Worker` options these settings size."""
        return {
            "max_concurrent_activities": self.max_concurrent_activities,
            "max_concurrent_workflow_tasks": self.max_concurrent_workflow_tasks,
            "max_concurrent_local_activities": self.max_concurrent_local_activities,
            "max_cached_workflows": self.max_cached_workflows,
        }


ENV_FIELDS = {
    "model_rps": "DURABLE_AGENT_MODEL_RPS",
    "max_concurrent_activities": "DURABLE_AGENT_MAX_CONCURRENT_ACTIVITIES",
    "max_concurrent_workflow_tasks": "DURABLE_AGENT_MAX_CONCURRENT_WORKFLOW_TASKS",
    "max_concurrent_local_activities": "DURABLE_AGENT_MAX_CONCURRENT_LOCAL_ACTIVITIES",
    "max_cached_workflows": "DURABLE_AGENT_MAX_CACHED_WORKFLOWS",
    "connect_timeout_s": "DURABLE_AGENT_CONNECT_TIMEOUT_S",
}


class SettingsError(ValueError):
    """A worker setting in the environment is not valid; the message names the variable."""


def worker_settings(queue: str | None = None) -> WorkerSettings:
    agent_queue = queue or task_queue()
    # A value of only spaces counts as unset, as an empty one does.
    values: dict[str, object] = {name: _env(var) for name, var in ENV_FIELDS.items() if _env(var)}
    default_model_queue = f"{agent_queue}-model" if values.get("model_rps") else agent_queue
    values["task_queue"] = agent_queue
    values["model_task_queue"] = _env("DURABLE_AGENT_MODEL_TASK_QUEUE") or default_model_queue
    try:
        return WorkerSettings.model_validate(values)
    except ValidationError as e:
        problems = "; ".join(f"{ENV_FIELDS.get(str(err['loc'][0]), err['loc'][0])}: {err['msg']}" for err in e.errors())
        raise SettingsError(f"invalid worker setting: {problems}") from None


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


HOST_ENV = "DURABLE_AGENT_HOST"


def configured_host() -> str | None:
    """`DURABLE_AGENT_HOST`, checked: it ends a task queue's name (workflows/hosts.py). Blank: unset."""
    host = _env(HOST_ENV) or None
    if host is not None and re.fullmatch(HOST_NAME, host) is None:
        raise SettingsError(f"{HOST_ENV}={host!r}: a host name is letters, digits, '.', '_' and '-' (at most 63)")
    return host
