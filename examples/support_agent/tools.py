"""The support agent's tools: a read tool and a write tool against the order service.

Load them on a worker with `DURABLE_AGENT_TOOLS=examples.support_agent.tools`,
`durable-agent worker --tools examples.support_agent.tools`, or
`DurableAgentPlugin(tools=[lookup_order, refund])` (examples/support_agent/app.py).
The service's address: `SUPPORT_API_URL` (default http://127.0.0.1:8765).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Annotated, Any

from pydantic import Field

from durable_agent import tool, tool_context


def _api(path: str, body: dict[str, Any] | None = None, key: str | None = None) -> dict[str, Any]:
    url = os.environ.get("SUPPORT_API_URL", "http://127.0.0.1:8765") + path
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        # The service's answer (no such order, too large a refund) is for the model to read.
        return {"status": e.code, **json.loads(e.read() or b"{}")}


@tool(retries=3, cache_ttl_s=600)
def lookup_order(order_id: Annotated[str, Field(description="The order's id, e.g. A100")]) -> dict[str, Any]:
    """Look up an order: its status, total and how much was refunded."""
    return _api(f"/orders/{order_id}")


@tool(effect="write", cost_usd=0.05)
def refund(
    order_id: Annotated[str, Field(description="The order to refund")],
    amount: Annotated[float, Field(gt=0, description="Amount in USD")],
) -> dict[str, Any]:
    """Refund part or all of an order to the customer."""
    # A write tool is never re-run blindly; the key also lets the service drop a duplicate.
    return _api("/refunds", {"order_id": order_id, "amount": amount}, key=tool_context().idempotency_key)
