"""`run_agent`: a user's workflow runs an agent as a child workflow and gets its `AgentResult`.

    from durable_agent import run_agent

    @workflow.defn
    class Support:
        @workflow.run
        async def run(self, ticket: str) -> str:
            result = await run_agent(AgentInput(goal=ticket, workspace="/srv/support", tools=["lookup_order"]))
            return result.output

Workflow code: deterministic, no I/O. The agent runs on the task queue of the calling
workflow unless `task_queue` names another (whose workers carry `DurableAgentPlugin`).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.options import WORKFLOW_TASK_TIMEOUT
    from workflows.types import WORKFLOW_TYPE, AgentInput, AgentResult


async def run_agent(
    agent: AgentInput,
    *,
    id: str | None = None,
    task_queue: str | None = None,
    execution_timeout: timedelta | None = None,
) -> AgentResult:
    """Run `agent` as a child `AgentWorkflow` and return its result; `id` defaults to the
    parent's id plus `/agent-` and a deterministic `workflow.uuid4()`."""
    # An agent run's input holds only the fields given, as `start_agent` sends it: the run lays
    # them over its agent file and must tell them from defaults (workflows/agents.py).
    payload = agent.model_dump(mode="json", exclude_unset=True) if agent.agent else agent
    return await workflow.execute_child_workflow(
        WORKFLOW_TYPE,
        payload,
        id=id or f"{workflow.info().workflow_id}/agent-{workflow.uuid4().hex[:8]}",
        task_queue=task_queue,
        result_type=AgentResult,
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        execution_timeout=execution_timeout,
        static_summary=agent.goal[:400],
    )
