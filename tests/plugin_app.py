"""A user's own Temporal application, as the plugin test builds it: one workflow of theirs
that runs an agent as a child (`durable_agent.run_agent`) and returns what it answered."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent import run_agent
    from workflows.types import AgentInput, AgentResult


@workflow.defn
class TriageTicket:
    @workflow.run
    async def run(self, agent: AgentInput) -> AgentResult:
        return await run_agent(agent)
