"""The user's tools the tests load (`DURABLE_AGENT_TOOLS=tests.tool_fixtures`, or in process).

Each tool leaves its effects in files whose paths the model passes, so a test reads what
ran, how often and with which key, across worker processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from durable_agent import tool, tool_context


def _append(path: str, line: str) -> int:
    with open(path, "a") as f:
        f.write(line + "\n")
    return len(Path(path).read_text().splitlines())


@tool(effect="write")
def send_payment(ledger: str, amount: float, hold_s: float = 0.0) -> str:
    """Pay `amount`: appends a line to the ledger, then holds the call for `hold_s` seconds."""
    _append(ledger, f"paid {amount}")
    time.sleep(hold_s)
    return f"paid {amount}"


@tool(effect="idempotent")
def charge_card(ledger: Annotated[str, Field(description="Ledger file")], hold_s: float = 0.0) -> str:
    """Charge a card: appends the call's idempotency key; the first attempt holds for `hold_s`."""
    context = tool_context()
    _append(ledger, context.idempotency_key)
    if context.attempt == 1:
        time.sleep(hold_s)
    return "charged"


@tool(retries=3)
async def flaky_read(counter: str) -> str:
    """Read a value from a service that fails its first two calls."""
    calls = _append(counter, "call")
    if calls < 3:
        raise ConnectionError(f"service unavailable (call {calls})")
    return f"value after {calls} calls"


class Order(BaseModel):
    id: str
    status: str


@tool(retries=2, cache_ttl_s=300)
def order_status(service: str, order_id: str) -> Order:
    """Look up an order; `service` is a file holding the status, absent while the service is down."""
    try:
        status = Path(service).read_text().strip()
    except FileNotFoundError:
        raise ConnectionError("order service unreachable") from None
    return Order(id=order_id, status=status)


@tool(cost_usd=2.0)
def paid_search(query: str) -> str:
    """A search that costs 2 USD a call."""
    return f"results for {query}"


@tool(name="shout")
def loud(text: Annotated[str, Field(description="What to shout")]) -> str:
    """Shout the text back, with a secret the worker must redact."""
    import os

    return text.upper() + " " + os.environ.get("TOOL_TEST_SECRET", "")


@tool(retries=2)
def resumable(ledger: str, hold_s: float = 2.5) -> str:
    """Checkpoint, then lose the service; a retry starts from the last checkpoint."""
    context = tool_context()
    _append(ledger, f"attempt {context.attempt} saw {list(context.previous_details)}")
    if context.attempt == 1:
        context.heartbeat("checkpoint", 1)
        time.sleep(hold_s)  # past the worker's own background beat (a third of the heartbeat timeout)
        raise ConnectionError("lost the service after the checkpoint")
    return f"resumed from {list(context.previous_details)}"


@tool(effect="write")
def declined_payment(ledger: str) -> str:
    """A payment the bank declines: it tries once, then raises."""
    _append(ledger, "tried")
    raise ValueError("card declined")


@tool(effect="write", timeout_s=2)
def stamp(ledger: str) -> str:
    """Stamp the ledger: a short write tool (timeout_s 2), which runs beside the workflow."""
    _append(ledger, f"stamped {tool_context().idempotency_key}")
    return "stamped"


@tool(effect="write", timeout_s=5)
def slow_stamp(ledger: str, hold_s: float) -> str:
    """A short write tool that stamps the ledger, then holds the call for `hold_s` seconds."""
    _append(ledger, "stamped")
    time.sleep(hold_s)
    return "stamped"
