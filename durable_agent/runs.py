"""Starting an agent run with the options that make crash recovery fast."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from durable_agent.connection import task_queue as default_task_queue
from workflows import options
from workflows.status_view import start_details
from workflows.types import WORKFLOW_TYPE, AgentInput, AgentResult

WORKFLOW_TASK_TIMEOUT = options.WORKFLOW_TASK_TIMEOUT
"""A workflow task held by a SIGKILLed worker moves to another worker after this long (the
server's default is 10 s): a kill during a workflow task costs this plus the new worker's
replay of the run. A replay is itself a workflow task, so runs continue as new every
`continue_as_new_every` steps to keep it well inside this timeout. The measurements behind
the value are in docs/recovery.md."""


async def start_agent(
    client: Client,
    agent: AgentInput,
    workflow_id: str,
    task_queue: str | None = None,
    *,
    start_signal: str | None = None,
    start_signal_args: Sequence[Any] = (),
    summary: str | None = None,
    details: str = "",
) -> WorkflowHandle[Any, AgentResult]:
    """`start_signal` (e.g. "pause", or "watch" from a follower) comes with the start, so the
    run has it before its first step. `summary` replaces the goal as the Web UI's summary;
    `details` is added to its details."""
    # An agent run's input holds only the fields given: the run lays them over its agent file
    # and must tell them from defaults (workflows/agents.py).
    payload = agent.model_dump(mode="json", exclude_unset=True) if agent.agent else agent
    return await client.start_workflow(
        WORKFLOW_TYPE,
        payload,
        id=workflow_id,
        task_queue=task_queue or default_task_queue(),
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        result_type=AgentResult,
        static_summary=(summary or agent.goal)[:400],  # the run page's "Summary" in the Web UI
        static_details=start_details(agent) + details,
        start_signal=start_signal,
        start_signal_args=start_signal_args,
    )


async def chain_histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """The history of every run of a workflow's continue-as-new chain, oldest first."""
    runs = [run async for run in client.list_workflows(f'WorkflowId="{workflow_id}"')]
    runs.sort(key=lambda run: run.start_time)
    return [await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history() for run in runs]
