"""A service a tool needs, down: the tool says so, and the run waits for it (docs/limits.md).

    from durable_agent import DependencyUnavailable, tool

    @tool(effect="write")
    def refund(order_id: str) -> str:
        "Refund an order."
        try:
            return payments.refund(order_id, key=tool_context().idempotency_key)
        except ConnectionRefusedError as e:
            raise DependencyUnavailable("payments-api", probe="http://payments/health") from e

Raise it only when the call took no effect: after the wait the call is made again, under a new
idempotency key (its journal would otherwise report the first try as of unknown outcome).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Probe = str | Callable[[], bool | Awaitable[bool]]
"""How a worker asks whether the dependency answers again: a URL (`GET`: up on any reply but a
5xx or a 429), or a sync or async function returning True when it is up (an exception: down)."""


class DependencyUnavailable(Exception):
    """Raised by a tool: `dependency` (a name the run's status shows) is down and the call did
    not take effect. The worker probes it with `probe` at once: one that answers makes this an
    ordinary error of the call (retried, then a tool error); one that does not is an outage the
    run waits out, the worker probing it from one loop however many runs wait."""

    def __init__(self, dependency: str, probe: Probe, message: str = "") -> None:
        if not dependency.strip():
            raise ValueError("DependencyUnavailable needs the dependency's name")
        self.dependency = dependency
        self.probe = probe
        self.message = message or f"{dependency} is unavailable"
        super().__init__(self.message)
