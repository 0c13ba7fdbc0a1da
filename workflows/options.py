"""Timeouts and retry policies for every activity the agent runs, with the reasons.

Crash recovery speed is set here. When a worker is SIGKILLed mid-activity, the server
notices only when a heartbeat is missed: a 2 s heartbeat timeout (activities beat every
0.5 s; the SDK sends at most every 1.6 s) plus a 0.5 s first retry interval puts the call
on a new worker within ~2.5 s. Start-to-close timeouts only bound hung calls.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

HEARTBEAT_TIMEOUT = timedelta(seconds=2)

MODEL_START_TO_CLOSE = timedelta(seconds=120)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    # Bounded: after ~30 s of failures a person decides (needs_attention), not a retry loop.
    maximum_attempts=6,
    non_retryable_error_types=["ModelRequestRejected", "ModelNotConfigured", "StaleContext"],
)

TOOL_START_TO_CLOSE = timedelta(seconds=120)
COMMAND_GRACE = timedelta(seconds=30)
"""run_command's start-to-close is its own timeout plus this, so the tool reports the timeout."""
TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
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
