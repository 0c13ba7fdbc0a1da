"""Starting an agent run with the options that make crash recovery fast."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle

from durable_agent.connection import task_queue as default_task_queue
from workflows.types import WORKFLOW_TYPE, AgentInput, AgentResult

WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)
"""A workflow task held by a SIGKILLed worker is handed to another after this long (the
server's default is 10 s). Our workflow tasks take milliseconds; continue-as-new keeps
replays short, so 2 s leaves a wide margin even on a busy machine."""


async def start_agent(
    client: Client, agent: AgentInput, workflow_id: str, task_queue: str | None = None
) -> WorkflowHandle[Any, AgentResult]:
    return await client.start_workflow(
        WORKFLOW_TYPE,
        agent,
        id=workflow_id,
        task_queue=task_queue or default_task_queue(),
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        result_type=AgentResult,
        static_summary=agent.goal[:400],  # the run page's "Summary" in the Web UI
    )
