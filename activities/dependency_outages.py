"""Tools' dependencies that are down, as one worker sees them: one probe loop per dependency.

A tool raises `DependencyUnavailable(name, probe)` (durable_agent/dependencies.py). The worker
probes the dependency at once (`EndpointGate.confirm`, one probe however many calls raised):
one that answers is up, and the error is the call's own (retried, then a tool error). One
that does not is down on this worker: the call fails with `DependencyDown`, its run waits
(workflows/dependency_waits.py) in `wait_for_dependency`, and the worker probes it from one
background task, 1 s later, then with the wait doubling up to 60 s. Until a probe finds it up,
a call of a tool that last raised for it fails at once without running: 200 waiting runs cost
the dependency the probes of one.
"""

from __future__ import annotations

import asyncio
import inspect
import urllib.error
import urllib.request
from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.endpoint_health import EndpointGate, Outage
from activities.heartbeat import heartbeating
from durable_agent.dependencies import DependencyUnavailable, Probe
from workflows.dependency_waits import DEPENDENCY_DOWN, DependencyDetails, DependencyWait
from workflows.outages import EndpointWaited

PROBE_TIMEOUT_S = 10.0
UNKNOWN_PROBE_PAUSE_S = 5.0
"""A worker asked to wait for a dependency it has no probe for lets the run call again after
this: the call (on a worker that has the probe, or that gets it from the tool) tells."""


class DependencyOutages:
    """One worker's dependencies: their probes, outages, and the wait activity."""

    def __init__(self) -> None:
        self.gate = EndpointGate(self._probe)
        self._probes: dict[str, Probe] = {}
        """By dependency: the probe its tools last gave (or a waiting run's URL)."""
        self._needs: dict[str, str] = {}
        """By tool: the dependency it last raised for; its calls fail at once while that is down."""
        self._waiters: dict[str, int] = {}

    def register(self, dependency: str, probe: Probe) -> None:
        """A probe known before any tool raised (an HTTP MCP server of the worker's config)."""
        self._probes[dependency] = probe

    def check(self, tool: str) -> None:
        """Before a call: `DependencyDown` at once while the tool's dependency is down here."""
        dependency = self._needs.get(tool)
        if dependency is not None and (outage := self.gate.outage(dependency)) is not None:
            raise self._down(dependency, outage)

    async def confirm(self, tool: str, error: DependencyUnavailable) -> ApplicationError | None:
        """After the tool raised: `DependencyDown` when a probe finds the dependency down
        (or it is known down); None when it answers (the error is the call's own)."""
        name = error.dependency
        self._probes[name] = error.probe
        self._needs[tool] = name
        outage = await self.gate.confirm(name, f"{tool}: {error.message}")
        return None if outage is None else self._down(name, outage)

    def _down(self, dependency: str, outage: Outage) -> ApplicationError:
        since = outage.since.astimezone(UTC).isoformat(timespec="seconds")
        probe = self._probes.get(dependency)
        details = DependencyDetails(dependency=dependency, probe=probe if isinstance(probe, str) else None)
        return ApplicationError(
            f"{dependency} is down since {since} (this worker probes it): {outage.last_error}",
            details.model_dump(),
            type=DEPENDENCY_DOWN,
            non_retryable=True,
        )

    @activity.defn(name="wait_for_dependency")
    async def wait_for_dependency(self, input: DependencyWait) -> EndpointWaited:
        """Returns once the dependency answers this worker's probe; beats meanwhile. A worker
        that has no probe for it (it never ran the tool) returns after a pause: the run calls
        the tool again, and the tool gives its probe if the dependency is still down."""
        name = input.dependency
        if input.probe is not None:
            self._probes.setdefault(name, input.probe)
        if name not in self._probes:
            await asyncio.sleep(UNKNOWN_PROBE_PAUSE_S)
            return EndpointWaited(probes=self.gate.probes)
        details = {"phase": f"waiting for {name} since {input.since}", "last_error": input.error}
        self._count(name, +1)
        try:
            async with heartbeating(details):
                failed_at = datetime.fromisoformat(input.failed_at) if input.failed_at else None
                await self.gate.wait_until_up(name, input.error, failed_at)
        finally:
            self._count(name, -1)
        return EndpointWaited(probes=self.gate.probes)

    def _count(self, dependency: str, change: int) -> None:
        """`durable_agent_dependency_waiting{dependency}`: runs this worker has waiting for it;
        `durable_agent_dependency_down_since{dependency}`: since when (Unix seconds; 0 when up)."""
        self._waiters[dependency] = self._waiters.get(dependency, 0) + change
        meter = activity.metric_meter()
        attributes = {"dependency": dependency}
        waiting = meter.create_gauge("durable_agent_dependency_waiting", "runs waiting for a tool's dependency")
        waiting.with_additional_attributes(attributes).set(self._waiters[dependency])
        since = self.gate.waiting().get(dependency)
        meter.create_gauge_float(
            "durable_agent_dependency_down_since", "since when a tool's dependency is down", "s"
        ).with_additional_attributes(attributes).set(since.timestamp() if since else 0.0)

    async def _probe(self, dependency: str) -> bool:
        probe = self._probes.get(dependency)
        if probe is None:
            return False
        if isinstance(probe, str):
            return await http_probe(probe)
        try:
            answer = probe() if inspect.iscoroutinefunction(probe) else await asyncio.to_thread(probe)
            return bool(await answer if inspect.isawaitable(answer) else answer)
        except Exception:
            return False


async def http_probe(url: str, headers: dict[str, str] | None = None) -> bool:
    """One `GET url`: up when it answers with anything but a 5xx or a 429. Only the status
    is read: an MCP endpoint may answer a GET with an endless event stream. The standard
    library's client, in a thread: a probe a minute per dependency needs no other."""
    return await asyncio.to_thread(_answers_get, url, headers or {})


def _answers_get(url: str, headers: dict[str, str]) -> bool:
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310 - the tool's own URL
            status = response.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (OSError, ValueError):  # refused, unreachable, timed out (URLError is an OSError), or not a URL
        return False
    return status < 500 and status != 429
