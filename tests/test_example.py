"""examples/support_agent as a user runs it: the order service, the user's worker with the
plugin, the agent started from the user's workflow and from the Temporal CLI."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer
from examples.support_agent import app
from examples.support_agent.service import Shop, serve
from tests.helpers import cli_start_agent
from tests.scripts import ByGoal, Script, answer, tool_results, tools
from workflows.types import AgentResult

BROKEN = "My order A100 arrived broken. Can I get my money back?"
WHERE = "Where is my order A200?"


async def test_the_support_agent_example_runs_from_a_workflow_and_from_the_cli(
    temporal_server: EmbeddedServer, model_server: ModelServer, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop = Shop()
    service = serve(shop)
    monkeypatch.setenv("SUPPORT_API_URL", f"http://127.0.0.1:{service.server_address[1]}")
    model_server.responder = ByGoal(
        {
            BROKEN: Script(
                [
                    tools(("lookup_order", {"order_id": "A100"})),
                    tools(("refund", {"order_id": "A100", "amount": 42})),
                    answer("Refunded 42 USD."),
                ]
            ),
            WHERE: Script([tools(("lookup_order", {"order_id": "A200"})), answer("It is in transit.")]),
        }
    )
    client = await app.connect(temporal_server.address)
    queue = f"support-{uuid.uuid4().hex[:8]}"
    try:
        async with app.worker(client, queue):
            refunded = await client.execute_workflow(
                app.SupportTicket.run,
                app.Ticket(text=BROKEN, workspace=str(workspace)),
                id=f"ticket-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                result_type=AgentResult,
            )
            run_id = f"cli-{uuid.uuid4().hex[:8]}"
            agent = {"goal": WHERE, "workspace": str(workspace), "agent": "support"}
            started = await cli_start_agent(temporal_server.address, queue, run_id, agent)
            assert started.returncode == 0, started.stderr
            answered = await client.get_workflow_handle(run_id, result_type=AgentResult).result()
    finally:
        service.shutdown()
    assert refunded.state == "completed" and refunded.output == "Refunded 42 USD."
    assert [r["amount"] for r in shop.refunds.values()] == [42.0]  # one refund, made once
    assert shop.orders["A100"]["refunded"] == 42.0
    assert refunded.usage.tool_costs == {"refund": 0.05}
    assert answered.state == "completed"
    # Both runs are the agent of agents/support.md, read by the worker (input `agent`).
    prompts = [m["content"] for r in model_server.requests for m in r["messages"] if m["role"] == "system"]
    assert len(prompts) == 5 and all(p.startswith("You are the shop's support agent") for p in prompts), prompts
    looked_up = [json.loads(t) for r in model_server.requests for t in tool_results(r) if "in transit" in t]
    assert looked_up[0]["id"] == "A200"
