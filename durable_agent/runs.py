"""Starting an agent run with the options that make crash recovery fast."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from durable_agent.connection import task_queue as default_task_queue
from workflows import options
from workflows.status_view import start_details
from workflows.types import WORKFLOW_TYPE, AgentInput, AgentResult

WORKFLOW_TASK_TIMEOUT = options.WORKFLOW_TASK_TIMEOUT
"""A workflow task held by a SIGKILLed worker is handed to another after this long (the
server's default is 10 s). Workflow tasks are in flight most of a step's time (three a
step; the model call is a local activity inside one), so most kills land here: recovery
is this timeout plus the new worker's replay. Measured A/B with a one-off script that
did what `python -m bench.recovery --restart-delay 0` now does (12 kills, restart at
once, the takeover of tool calls in both): at 2 s, medians 1.80-1.93 s and worst 2.42-2.50 s; at 1.5 s, 1.69-1.83 s and
1.97-2.11 s.
The risk runs the other way: a task is also a new worker's full replay of the run, ~5-8 ms
per step here (`python -m bench.replay`; ~14 events a step), several times that while 50
runs replay at once after a crash. With a one-off script counting timeouts in the
histories of 50 agents on one worker, SIGKILLed mid-run: 53 and 54
tasks timed out at 2 s (the 50 the kill interrupted, and a few of the replays), 70 and 89
at 1.5 s; every run completed, in the same wall time. A task that times out during a
model call repeats that call: `python -m bench chaos --seed 11` (50 agents, 20 kills, 2
server restarts, one run each) counted 404 model calls beyond the steps at 1.5 s, 314 at
2 s. In normal operation, 50 agents at
0 and 50 ms model latency: no more timeouts at 1.5 s than at 2 s (0-9 either way). A
model call longer than 1.2 s (80 % of it) makes the worker extend its task, three small
events per extension. Safe while runs continue-as-new every <= ~50 steps (~0.25-0.4 s of
replay idle); at 200 steps a replay takes ~2 s, and one recovery measured 22 s."""


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


async def chain_histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """The history of every run of a workflow's continue-as-new chain, oldest first."""
    runs = [run async for run in client.list_workflows(f'WorkflowId="{workflow_id}"')]
    runs.sort(key=lambda run: run.start_time)
    return [await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history() for run in runs]
