"""The user's own Temporal application with an agent in it.

    python -m examples.support_agent.app worker            # the user's worker, with the plugin
    python -m examples.support_agent.app ticket "text"     # the user's workflow runs the agent

`SupportTicket` (the user's workflow) runs the support agent as a child workflow and
returns its `AgentResult`. The worker is an ordinary Temporal `Worker`: `DurableAgentPlugin`
on the client adds the agent workflow, its activities, the data converter and the tools.
The agent comes from agents/support.md (its front matter and its body, the system prompt).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from durable_agent import DurableAgentPlugin, run_agent
    from examples.support_agent.tools import lookup_order, refund
    from workflows.types import AgentInput, AgentResult

TASK_QUEUE = "support"
AGENT_FILE = Path(__file__).parent / "agents" / "support.md"


@workflow.defn
class SupportTicket:
    @workflow.run
    async def run(self, agent: AgentInput) -> AgentResult:
        return await run_agent(agent)


def agent_input(ticket: str, workspace: str, path: Path = AGENT_FILE) -> AgentInput:
    """The agent of `path` on `ticket`. (Where agent files are read by the workers, input
    `"agent": "support"` says the same.)"""
    front, _, body = path.read_text().removeprefix("---\n").partition("\n---\n")
    fields: dict[str, Any] = {}
    for line in front.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = _value(value.strip())
    return AgentInput(
        goal=ticket,
        workspace=workspace,
        system_prompt=body.strip(),
        model=fields.get("model", "gpt-4.1-mini"),
        tools=fields["tools"],
        limits=fields.get("limits", {}),
    )


def _value(text: str) -> Any:
    """The front matter's flow values: `[a, b]`, `{k: 1.0}`, or a plain string."""
    if text[:1] in "[{":
        return json.loads(re.sub(r"([A-Za-z_][\w-]*)", r'"\1"', text).replace('""', '"'))
    return text


def plugin() -> DurableAgentPlugin:
    return DurableAgentPlugin(tools=[lookup_order, refund])


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
        agent_input(ticket, workspace),
        id=f"ticket-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=AgentResult,
    )
    print(result.output)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
