"""Timeouts and retry policies for every activity the agent runs, with the reasons.

Crash recovery speed is set here. When a worker is SIGKILLed mid-activity, the server
notices only when a heartbeat is missed: a 2 s heartbeat timeout (activities beat every
0.5 s; the worker sends at most one a second, see worker.py) plus a 0.1 s first retry
interval puts the call on a new worker ~2.1 s after it last beat. Start-to-close
timeouts only bound hung calls.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

HEARTBEAT_TIMEOUT = timedelta(seconds=2)
"""Not lower: the timeout also runs from the moment the server hands an activity to a
worker, before its first beat, and a loaded worker (50 agents on 2 cores) can take over a
second to begin one; at 2 s some calls were already retried spuriously under such load.
Going lower would not shorten the worst recovery either: a worker killed inside a
workflow task costs the 2 s task timeout (durable_agent/runs.py) anyway."""

RETRY_FIRST = timedelta(milliseconds=100)
"""The first retry is the one after a crash: the heartbeat timeout has already waited 2 s
and a replacement worker is usually polling by then, so every 100 ms here is 100 ms of
recovery (the former 0.5 s was a sixth of the ~3 s). Real failures then back off fast."""
RETRY_GROWTH = 4.0
"""From 0.1 s, x4 spaces retries 0.1, 0.4, 1.6, 6.4, 25.6 s: the model gets ~34 s in all
before a person is asked (0.5 s doubling gave 15.5 s), tools 8.5 s (was 7.5 s)."""

MODEL_START_TO_CLOSE = timedelta(seconds=120)
MODEL_RETRY = RetryPolicy(
    initial_interval=RETRY_FIRST,
    backoff_coefficient=RETRY_GROWTH,
    maximum_interval=timedelta(seconds=30),
    # Bounded: after ~30 s of failures (0.1+0.4+1.6+6.4+25.6 s between the six attempts)
    # a person decides (needs_attention), not a retry loop.
    maximum_attempts=6,
    non_retryable_error_types=["ModelRequestRejected", "ModelNotConfigured", "StaleContext"],
)

TOOL_START_TO_CLOSE = timedelta(seconds=120)
COMMAND_GRACE = timedelta(seconds=30)
"""run_command's start-to-close is its own timeout plus this, so the tool reports the timeout."""
TOOL_RETRY = RetryPolicy(
    initial_interval=RETRY_FIRST,
    backoff_coefficient=RETRY_GROWTH,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=["ToolArgumentError", "WorkspaceError"],
)
# Cancelling a run waits for run_command to kill its process group before the run closes.
TOOL_CANCELLATION = ActivityCancellationType.WAIT_CANCELLATION_COMPLETED

DEFAULT_COMMAND_TIMEOUT_S = 120.0


def tool_start_to_close(tool: str, timeout_s: float | None) -> timedelta:
    if tool != "run_command":
        return TOOL_START_TO_CLOSE
    return timedelta(seconds=timeout_s or DEFAULT_COMMAND_TIMEOUT_S) + COMMAND_GRACE
