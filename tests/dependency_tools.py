"""Tools that depend on the payments service (tests/payments_service.py) and say when it is down."""

from __future__ import annotations

import urllib.error
import urllib.request

from durable_agent import DependencyUnavailable, tool, tool_context


def _post(service: str, path: str, body: str, tries: str | None = None) -> str:
    if tries:  # the calls that really tried the service, up or down
        with open(tries, "a") as f:
            f.write(f"{path}\n")
    try:
        with urllib.request.urlopen(f"{service}{path}", data=body.encode(), timeout=5) as answer:
            return answer.read().decode()
    except urllib.error.URLError as e:
        if not isinstance(e.reason, ConnectionRefusedError):
            raise
        # Refused: nothing was sent, so the call took no effect.
        raise DependencyUnavailable("payments-api", probe=f"{service}/health", message=str(e)) from e


@tool(effect="write")
def pay(service: str, amount: float, tries: str | None = None) -> str:
    """Pay `amount` through the payments service."""
    return _post(service, "/pay", f"{amount} {tool_context().idempotency_key}", tries)


@tool(timeout_s=5)
def balance(service: str) -> str:
    """The account's balance (a short read: it runs as a local activity of the run's worker)."""
    return _post(service, "/balance", "")
