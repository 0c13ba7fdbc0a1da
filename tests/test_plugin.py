"""`DurableAgentPlugin` in a user's own application: a worker built only from the plugin (no
worker.py) runs an agent as a child of the user's workflow, with encryption on."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import DurableAgentPlugin
from durable_agent.codecs import ENCRYPTED, EncryptionKeys
from durable_agent.model_server import ModelServer
from durable_agent.server import EmbeddedServer
from tests.plugin_app import TriageTicket
from tests.scripts import Script, answer, tool_results, tools
from tests.tool_fixtures import order_status
from workflows.types import AgentInput, AgentResult


async def test_a_worker_built_only_from_the_plugin_runs_an_agent_as_a_child_encrypted(
    temporal_server: EmbeddedServer, model_server: ModelServer, workspace: Path
) -> None:
    service = workspace / "orders.txt"
    service.write_text("delivered")
    lookup = {"service": str(service), "order_id": "A7"}
    model_server.responder = Script([tools(("order_status", lookup)), answer("order A7 was delivered")])
    keys = EncryptionKeys.parse("k1:" + base64.b64encode(os.urandom(32)).decode())
    client = await Client.connect(
        temporal_server.address, plugins=[DurableAgentPlugin(tools=[order_status], encryption_keys=keys)]
    )
    queue, parent_id = f"app-{uuid.uuid4().hex[:8]}", f"triage-{uuid.uuid4().hex[:8]}"
    agent = AgentInput(goal="where is order A7?", workspace=str(workspace), tools=["order_status"])
    async with Worker(client, task_queue=queue, workflows=[TriageTicket]):
        result = await client.execute_workflow(
            TriageTicket.run, agent, id=parent_id, task_queue=queue, result_type=AgentResult
        )
        [child] = [w async for w in client.list_workflows(f'ParentWorkflowId="{parent_id}"')]
    assert result.state == "completed" and result.output == "order A7 was delivered"
    assert '"status":"delivered"' in tool_results(model_server.requests[-1])[0]
    # Read without the plugin's codec: every payload of the child's history is encrypted.
    plain = await Client.connect(temporal_server.address)
    history = plain.get_workflow_handle(child.id).fetch_history_events()
    # Patch markers (the SDK's patch ids) and search attributes (which the server indexes) are plain by design.
    plain_by_design = {EventType.EVENT_TYPE_MARKER_RECORDED, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES}
    events = [e.SerializeToString() async for e in history if e.event_type not in plain_by_design]
    assert sum(ENCRYPTED in e for e in events) >= 6  # the input, the catalog, model and tool calls
    leaks = [e for e in events if b"json/plain" in e or b"delivered" in e]
    assert not leaks, leaks
