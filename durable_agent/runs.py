"""Starting an agent run with the options that make crash recovery fast."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle

from durable_agent.connection import task_queue as default_task_queue
from workflows.status_view import start_details
from workflows.types import WORKFLOW_TYPE, AgentInput, AgentResult

WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)
"""A workflow task held by a SIGKILLed worker is handed to another after this long (the
server's default is 10 s). The model call runs inside a workflow task (a local activity),
so every kill during a model call lands here, and this is the floor of the worst
recovery: above ~2 s the 3 s target is out of reach. A model call longer than 1.6 s
(80 % of it) makes the worker extend its task, three small events per extension. The
risk runs the other way: a task is also a new worker's full replay of the run, ~7.8 ms
per step here (`python -m bench.replay`; ~14 events a step, twice that under heavy load
or in the SDK's sandbox, which the worker does without, see worker.py). At 200 steps
that is ~2 s idle and up to twice that under load, the task times out, and one recovery measured 22 s. 2 s is safe only
while runs continue-as-new every <= ~50 steps (~0.4 s of replay, ~1 s under load)."""


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
        static_details=start_details(agent),
    )
