"""Metrics: where time and money go, and which runs wait for a person or recovered.

All of them go through the Temporal SDK's meters, so they come out of one Prometheus
endpoint next to the SDK's own worker metrics: `DURABLE_AGENT_METRICS_PORT` (`PORT` or
`HOST:PORT`) makes the worker's client runtime serve `/metrics` there, on 127.0.0.1 unless
`DURABLE_AGENT_METRICS_ADDRESS` (or the `HOST:` part) names another interface: the
metrics name task queues and counts, which are nobody else's business by default.
Without it the meters are no-ops.

Activities record what they did (real calls: each attempt once); the workflow records
through `workflow.metric_meter()`, which records nothing while a workflow replays
(workflows/run_metrics.py). docs/observability.md lists every metric and example alerts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from durable_agent import genai
from durable_agent.server_wait import QUIET_RETRIES
from durable_agent.worker_settings import SettingsError
from workflows.run_metrics import WAITING_STATES
from workflows.types import WORKFLOW_TYPE, ModelCallInput, ModelReply, ToolCallInput, ToolOutcome

PORT_ENV = "DURABLE_AGENT_METRICS_PORT"
ADDRESS_ENV = "DURABLE_AGENT_METRICS_ADDRESS"
WAITING_POLL = timedelta(seconds=30)
"""How often a worker counts, from visibility, the runs waiting for a person."""

log = logging.getLogger(__name__)


def prometheus_address() -> str | None:
    value = os.environ.get(PORT_ENV, "").strip()
    if not value:
        return None
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        raise SettingsError(f"{PORT_ENV}={value!r}: expected a port or HOST:PORT")
    return f"{host or os.environ.get(ADDRESS_ENV, '').strip() or '127.0.0.1'}:{port}"


def worker_runtime() -> Runtime:
    """A worker's runtime: serving Prometheus metrics when `DURABLE_AGENT_METRICS_PORT` asks
    for it, and logging without a warning per retried call (durable_agent/server_wait.py).

    Raises SettingsError, one line, when the address cannot be served (e.g. a second worker
    on the same port): the SDK's exporter says only "Failed starting Prometheus exporter"."""
    address = prometheus_address()
    metrics = None if address is None else PrometheusConfig(bind_address=address, durations_as_seconds=True)
    try:
        return Runtime(telemetry=TelemetryConfig(logging=QUIET_RETRIES, metrics=metrics))
    except ValueError as e:
        raise SettingsError(
            f"{PORT_ENV}: cannot serve metrics on {address} ({str(e).rpartition(': ')[2]}); "
            "is another worker using this port? Give each worker its own."
        ) from None


def client_meter(client: Client) -> MetricMeter:
    return (client.service_client.config.runtime or Runtime.default()).metric_meter


def count_recoveries(meter: MetricMeter, kind: str, count: int) -> None:
    """`durable_agent_recoveries`: `takeover` (durable_agent/takeover.py), `tool_retry` (a
    tool call's later attempt), `command_interrupted` (reported to the model as such)."""
    meter.create_counter("durable_agent_recoveries", "tool calls recovered after a failure").add(
        count, {"kind": kind}
    )  # a 0 too: the series exists from the first call, so alerts on its increase see a baseline


class MetricsInterceptor(Interceptor):
    """Model and tool calls, as the activities ran them (each attempt once)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _MetricsActivityInbound(next)


class _MetricsActivityInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        request = input.args[0] if input.args else None
        if isinstance(request, ModelCallInput):
            return await self._model_call(input, request)
        if isinstance(request, ToolCallInput):
            return await self._tool_call(input)
        return await super().execute_activity(input)

    async def _model_call(self, input: ExecuteActivityInput, request: ModelCallInput) -> Any:
        meter = activity.metric_meter()
        model = {"model": request.model}
        started = time.monotonic()
        try:
            reply = await super().execute_activity(input)
        except BaseException as e:
            outcome = {**model, "outcome": "error", "error_type": genai.error_type(e)}
            raise
        else:
            outcome = {**model, "outcome": "ok", "error_type": ""}
            if isinstance(reply, ModelReply):
                tokens = meter.create_counter("durable_agent_tokens", "tokens used", "tokens")
                tokens.add(reply.input_tokens, {**model, "direction": "input"})
                tokens.add(reply.output_tokens, {**model, "direction": "output"})
                if reply.usage_estimated:  # the endpoint sent no usage: the figures above are estimates
                    estimated = meter.create_counter(
                        "durable_agent_tokens_estimated", "tokens estimated: the endpoint reported no usage", "tokens"
                    )
                    estimated.add(reply.input_tokens, {**model, "direction": "input"})
                    estimated.add(reply.output_tokens, {**model, "direction": "output"})
                cost = meter.create_histogram_float("durable_agent_cost_usd", "cost of each model call", "USD")
                cost.record(reply.cost_usd(), model)
            return reply
        finally:
            meter.create_histogram_timedelta("durable_agent_model_call_duration", "model call time").record(
                timedelta(seconds=time.monotonic() - started), model
            )
            meter.create_counter("durable_agent_model_calls", "model calls by outcome").add(1, outcome)

    async def _tool_call(self, input: ExecuteActivityInput) -> Any:
        meter = activity.metric_meter()
        info = activity.info()
        count_recoveries(meter, "tool_retry", 1 if info.attempt > 1 else 0)
        outcome: ToolOutcome | None = None
        try:
            result = await super().execute_activity(input)
            outcome = result if isinstance(result, ToolOutcome) else None
            return result
        finally:
            label = genai.tool_outcome(outcome)
            if label == "interrupted":
                count_recoveries(meter, "command_interrupted", 1)
            calls = meter.create_counter("durable_agent_tool_calls", "tool calls by tool and outcome")
            calls.add(1, {"tool": info.activity_type, "outcome": label})
            request = input.args[0]
            for tool, _, done in genai.riders(request, outcome) if isinstance(request, ToolCallInput) else []:
                calls.add(1, {"tool": tool, "outcome": genai.tool_outcome(done)})


def record_tool_cost(tool: str, cost_usd: float) -> None:
    """`durable_agent_tool_cost_usd{tool}`: what one call of a priced tool cost (its `cost_usd`)."""
    meter = activity.metric_meter()
    meter.create_histogram_float("durable_agent_tool_cost_usd", "cost of each tool call", "USD").record(
        cost_usd, {"tool": tool}
    )


async def publish_waiting_runs(client: Client, task_queue: str) -> None:
    """`durable_agent_runs_waiting{state}`: running agents of this task queue that wait for a
    person, counted from visibility (the `AgentState` search attribute) every 30 s. Every
    worker of the queue reports the same figure: aggregate with max(), not sum()."""
    gauge = client_meter(client).create_gauge("durable_agent_runs_waiting", "runs waiting for a person")
    while True:
        for state in WAITING_STATES:
            query = (
                f'WorkflowType="{WORKFLOW_TYPE}" AND ExecutionStatus="Running" '
                f'AND TaskQueue="{task_queue}" AND AgentState="{state}"'
            )
            try:
                counted = await client.count_workflows(query)
            except RPCError as e:
                log.warning("could not count runs waiting for a person: %s", e)
                continue
            gauge.set(counted.count, {"state": state, "task_queue": task_queue})
        await asyncio.sleep(WAITING_POLL.total_seconds())
