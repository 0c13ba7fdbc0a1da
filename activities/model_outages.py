"""Model calls during an outage of their endpoint, worker side (activities/endpoint_health.py).

A transient failure (connection refused, HTTP 5xx) makes the worker probe the endpoint. An
endpoint that answers the probe is up: the error is the call's own, retried as before and,
after the last attempt, a person's to decide. One that does not is down on this worker; so
is one that still answers 429 (or 408, 409) on a call's last attempt, when Temporal's
retries have honoured its `Retry-After` and it asks for more patience: the probe loop then
spaces the worker's next calls to it. From then until a probe finds it up, a call of a run that waits out outages
(`ModelCallInput.outage_wait`) does not reach the endpoint: it fails at once with
`ModelEndpointDown`, and its run waits (workflows/outages.py) in `wait_for_model_endpoint`,
which returns when the worker's one probe loop for that endpoint sees it answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC
from typing import TYPE_CHECKING

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.endpoint_health import EndpointGate, Outage
from activities.heartbeat import heartbeating
from activities.model_clients import ModelClients, openai_sdk
from workflows.options import MODEL_RETRY
from workflows.outages import ENDPOINT_DOWN, EndpointWait, EndpointWaited

if TYPE_CHECKING:
    from openai import AsyncOpenAI

PROBE_TIMEOUT_S = 10.0
"""A probe is `GET /models`: an endpoint that answers takes milliseconds."""
RETRY_LIMITED = frozenset({"ModelHttp408", "ModelHttp409", "ModelHttp429"})
"""The endpoint answers but asks for patience (honoured by Temporal's retries, `Retry-After`):
an outage only once the call's retries are spent."""


class ModelOutages:
    """One worker's view of its model endpoints' outages, and the wait activity."""

    def __init__(self, clients: ModelClients) -> None:
        self._clients = clients
        self.gate = EndpointGate(self.probe)
        self._waiters = 0

    @asynccontextmanager
    async def watch(self, client: AsyncOpenAI, waits: bool) -> AsyncIterator[None]:
        """Around one call: fails it at once while its endpoint is down, and turns a failure
        that shows an outage into `ModelEndpointDown`. `waits`: the run waits out outages;
        a run recorded before that gets its errors as they were."""
        if not waits:
            yield
            return
        endpoint = str(client.base_url)
        if (outage := self.gate.outage(endpoint)) is not None:
            raise endpoint_down(outage, endpoint)
        try:
            yield
        except ApplicationError as e:
            if not _may_be_outage(e, activity.info().attempt):
                raise
            if e.type in RETRY_LIMITED:  # it answered, asking for patience the retries did not buy
                outage: Outage | None = self.gate.mark_down(endpoint, e.message)
            else:
                outage = await self.gate.confirm(endpoint, e.message)
            if outage is None:
                raise
            raise endpoint_down(outage, endpoint) from None

    @activity.defn(name="wait_for_model_endpoint")
    async def wait_for_model_endpoint(self, input: EndpointWait) -> EndpointWaited:
        """Returns once the worker's endpoint answers a probe; beats meanwhile, saying since when."""
        async with self._clients.lease() as client:
            endpoint = str(client.base_url)
        details = {"phase": f"waiting for the model endpoint since {input.since}", "last_error": input.error}
        self._waiters += 1
        self._publish_gauges()
        try:
            async with heartbeating(details):
                await self.gate.wait_until_up(endpoint, input.error)
        finally:
            self._waiters -= 1
            self._publish_gauges()
        return EndpointWaited(probes=self.gate.probes)

    def _publish_gauges(self) -> None:
        """`durable_agent_model_endpoint_waiting`: runs this worker has waiting for an endpoint;
        `durable_agent_model_endpoint_down_since`: since when (Unix seconds; 0 while none is down)."""
        meter = activity.metric_meter()
        meter.create_gauge("durable_agent_model_endpoint_waiting", "runs waiting for the model endpoint").set(
            self._waiters
        )
        since = min(self.gate.waiting().values(), default=None)
        meter.create_gauge_float(
            "durable_agent_model_endpoint_down_since", "since when the model endpoint is down", "s"
        ).set(since.timestamp() if since else 0.0)

    async def probe(self, endpoint: str) -> bool:
        """One `GET /models`: up when the endpoint answers with anything but a 5xx or a 429."""
        sdk = openai_sdk()
        async with self._clients.lease() as client:
            try:
                await client.get("/models", cast_to=object, options={"timeout": PROBE_TIMEOUT_S})
            except sdk.APIStatusError as e:
                return e.status_code < 500 and e.status_code != 429
            except (sdk.APIConnectionError, sdk.APITimeoutError):
                return False
        return True


def _may_be_outage(error: ApplicationError, attempt: int) -> bool:
    if error.type in RETRY_LIMITED:
        return attempt >= MODEL_RETRY.maximum_attempts
    return error.type == "ModelUnavailable" or (error.type or "").startswith("ModelHttp5")


def endpoint_down(outage: Outage, endpoint: str) -> ApplicationError:
    since = outage.since.astimezone(UTC).isoformat(timespec="seconds")
    return ApplicationError(
        f"the model endpoint {endpoint} is down since {since} (this worker probes it): {outage.last_error}",
        since,
        type=ENDPOINT_DOWN,
        non_retryable=True,
    )
