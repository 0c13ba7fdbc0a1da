"""A model endpoint that is down, as one worker sees it: one probe loop, however many runs wait.

When a model call fails with a transient error (connection refused, HTTP 5xx, or a 429 past
its retries), the worker asks the endpoint at once (`GET /models`, one probe at a time
however many calls failed): an endpoint that answers is not down, and the call is retried as
before (its failures are its own). One that does not is marked down and probed from one
background task, 1 s later, then with the wait doubling up to 60 s. Every run that waits
for it (the `wait_for_model_endpoint` activity) awaits the same loop, and a call made while
it is down fails at once without reaching the endpoint: 200 waiting runs cost the endpoint
the probes of one, one a minute after the first few. The first probe the endpoint answers
(any reply but a 5xx or a 429) ends the outage for all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

FIRST_PROBE_S = 1.0
MAX_PROBE_INTERVAL_S = 60.0
PROBE_GROWTH = 2.0

Probe = Callable[[str], Awaitable[bool]]
"""Asks the endpoint once: True when it answers."""


@dataclass
class Outage:
    since: datetime
    last_error: str
    healthy: asyncio.Event = field(default_factory=asyncio.Event)
    prober: asyncio.Task[None] | None = None


class EndpointGate:
    """The outages of one worker's endpoints, by base URL."""

    def __init__(
        self, probe: Probe, first_s: float = FIRST_PROBE_S, max_interval_s: float = MAX_PROBE_INTERVAL_S
    ) -> None:
        self._probe = probe
        self._first_s = first_s
        self._max_interval_s = max_interval_s
        self._outages: dict[str, Outage] = {}
        self._checks: dict[str, asyncio.Task[bool]] = {}
        """The probe in flight for an endpoint not (yet) known to be down, shared by its askers."""
        self.probes = 0
        """Probes this worker has sent, over all endpoints."""
        self._answered: dict[str, datetime] = {}
        """When a probe of the endpoint last found it up."""
        self._stopped = False
        """Set by `stop`: no probe starts after it."""

    def outage(self, endpoint: str) -> Outage | None:
        """The endpoint's current outage; None while it is not known to be down."""
        return self._outages.get(endpoint)

    async def confirm(self, endpoint: str, error: str) -> Outage | None:
        """After a failed call: the endpoint's outage when a probe finds it down (or it is known
        down); None when it answers."""
        if (outage := self._outages.get(endpoint)) is not None:
            outage.last_error = error
            return outage
        if self._stopped:
            return None  # the worker stopped: the call's own error stands
        check = self._checks.get(endpoint)
        if check is None:
            check = self._checks[endpoint] = asyncio.get_running_loop().create_task(self._probe_once(endpoint))
            check.add_done_callback(lambda _: self._checks.pop(endpoint, None))
        try:
            if await asyncio.shield(check):  # shielded: one asker's cancel must not cancel the others' probe
                return None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._stopped and check.cancelled() and not (task is not None and task.cancelling()):
                return None  # `stop` ended the probe, not this asker: its call's own error stands
            raise
        return self.mark_down(endpoint, error)

    async def _probe_once(self, endpoint: str) -> bool:
        self.probes += 1
        if answered := await self._probe(endpoint):
            self._answered[endpoint] = datetime.now(UTC)
        return answered

    def mark_down(self, endpoint: str, error: str) -> Outage:
        """The endpoint failed: an outage begins (its probe loop with it), or goes on."""
        outage = self._outages.get(endpoint)
        if outage is None and self._stopped:
            return Outage(since=datetime.now(UTC), last_error=error)  # the worker stopped: nobody probes
        if outage is None:
            outage = self._outages[endpoint] = Outage(since=datetime.now(UTC), last_error=error)
            outage.prober = asyncio.get_running_loop().create_task(self._probe_until_up(endpoint, outage))
        else:
            outage.last_error = error
        return outage

    async def wait_until_up(self, endpoint: str, error: str, failed_at: datetime | None = None) -> None:
        """Returns when the endpoint answers a probe: at once if a probe found it up after the
        run's call failed (`failed_at`), or if it is not known to be down."""
        answered = self._answered.get(endpoint)
        if failed_at is not None and answered is not None and answered > failed_at and endpoint not in self._outages:
            # The outage the run saw is over: a waiter that begins late (its attempt timed out
            # and was retried, or it was slow to start) costs the endpoint no other probe.
            return
        # Told of the failure by a run (e.g. this worker took over the wait from another), the
        # worker may have seen none itself: it checks first.
        outage = await self.confirm(endpoint, error)
        if outage is not None:
            await outage.healthy.wait()

    async def _probe_until_up(self, endpoint: str, outage: Outage) -> None:
        wait_s = self._first_s
        try:
            while True:
                await asyncio.sleep(wait_s)
                if await self._probe_once(endpoint):
                    break
                wait_s = min(wait_s * PROBE_GROWTH, self._max_interval_s)
        finally:
            # Up (or the worker shutting down): waiters go on, and the next failure starts afresh.
            self._outages.pop(endpoint, None)
            outage.healthy.set()

    async def stop(self) -> None:
        """The worker stops: its probe loops and checks end (their waiters go on, as each
        loop's end does), so that none goes on probing through a client closed after this."""
        self._stopped = True
        tasks = [o.prober for o in self._outages.values() if o.prober is not None] + list(self._checks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def waiting(self) -> dict[str, datetime]:
        """Endpoints down now, and since when."""
        return {endpoint: outage.since for endpoint, outage in self._outages.items()}
