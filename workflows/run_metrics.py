"""What a run records about itself in metrics, from the status it publishes.

`workflow.metric_meter()` records nothing while the workflow replays, so a replayed task
(a new worker, an evicted cache) counts nothing twice. The first status a run of the
chain publishes is its baseline: what a continue-as-new carried was counted already.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.common import MetricMeter

from workflows.types import AgentStatus, RunState

WAITING_STATES: tuple[RunState, ...] = ("paused", "awaiting_approval", "needs_attention")
"""States in which a run waits for a person."""


class RunMetrics:
    """Compares each published status with the last one and records the difference."""

    def __init__(self) -> None:
        self._last: AgentStatus | None = None
        self._since: datetime | None = None

    def observe(self, status: AgentStatus) -> None:
        last, self._last = self._last, status
        if last is None:
            self._since = workflow.now()
            return
        meter = workflow.metric_meter()
        if status.step > last.step:
            meter.create_counter("durable_agent_steps", "steps started").add(status.step - last.step)
        for budget in set(status.soft_tier) - set(last.soft_tier):
            meter.create_counter("durable_agent_soft_tiers", "budgets that entered their soft tier").add(
                1, {"budget": budget}
            )
        compactions = _compactions(status) - _compactions(last)
        if compactions > 0:
            meter.create_counter("durable_agent_compactions", "context compactions").add(compactions)
        if status.state != last.state:
            self._state_changed(meter, last.state, status)

    def _state_changed(self, meter: MetricMeter, left: str, status: AgentStatus) -> None:
        now = workflow.now()
        if left in WAITING_STATES and self._since is not None:
            meter.create_histogram_timedelta("durable_agent_wait_duration", "time waiting for a person").record(
                now - self._since, {"state": left}
            )
        if status.state in WAITING_STATES:
            meter.create_counter("durable_agent_waits", "waits for a person").add(1, {"state": status.state})
        if status.result is not None:
            meter.create_counter("durable_agent_runs_closed", "runs by final state").add(
                1, {"state": status.result.state, "stop_reason": status.result.stop_reason}
            )
        self._since = now


def _compactions(status: AgentStatus) -> int:
    return status.context.counters.compactions if status.context else 0
