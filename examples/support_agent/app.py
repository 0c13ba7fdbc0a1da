"""The user's own Temporal application with an agent in it.

    python -m examples.support_agent.app worker            # the user's worker, with the plugin
    python -m examples.support_agent.app ticket "text"     # the user's workflow runs the agent

`SupportTicket` (the user's workflow) runs the support agent as a child workflow and
returns its `AgentResult`. The worker is an ordinary Temporal `Worker`: `DurableAgentPlugin`
on the client adds the agent workflow, its activities, the data converter and the tools.
The agent is input `agent: "support"`: the plugin reads agents/support.md (its front matter
and its body, the system prompt) from this folder at the run's start.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from durable_agent import DurableAgentPlugin, run_agent
    from examples.support_agent.tools import lookup_order, refund
    from workflows.types import AgentInput, AgentResult

TASK_QUEUE = "support"
AGENTS_DIR = Path(__file__).parent / "agents"


class Ticket(BaseModel):
    text: str
    workspace: str


@workflow.defn
class SupportTicket:
    @workflow.run
    async def run(self, ticket: Ticket) -> AgentResult:
        # Built here, with only the fields meant: the worker reads agents/support.md (model,
        # tools, limits, system prompt) at the run's start and fills in the rest from it.
        return await run_agent(AgentInput(goal=ticket.text, workspace=ticket.workspace, agent="support"))


def plugin() -> DurableAgentPlugin:
    return DurableAgentPlugin(tools=[lookup_order, refund], agents_dir=str(AGENTS_DIR))


async def connect(address: str | None = None) -> Client:
    return await Client.connect(address or os.environ.get("TEMPORAL_ADDRESS", "localhost:7233"), plugins=[plugin()])


def worker(client: Client, task_queue: str = TASK_QUEUE) -> Worker:
    return Worker(client, task_queue=task_queue, workflows=[SupportTicket])


async def main(argv: list[str]) -> None:
    client = await connect()
    if argv[:1] == ["worker"]:
        async with worker(client):
            print(f"support worker on task queue {TASK_QUEUE!r}", flush=True)
            await asyncio.Event().wait()
    ticket = argv[1] if len(argv) > 1 else "My order A100 arrived broken. Can I get my money back?"
    workspace = os.path.abspath(os.environ.get("SUPPORT_WORKSPACE", "."))
    result = await client.execute_workflow(
        SupportTicket.run,
        Ticket(text=ticket, workspace=workspace),
        id=f"ticket-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=AgentResult,
    )
    print(result.output)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
