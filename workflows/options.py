"""Timeouts and retry policies for every activity the agent runs, with the reasons.

Crash recovery speed is set here and by the 1.5 s workflow task timeout (durable_agent/runs.py).
Tools are regular activities: when a worker is SIGKILLed mid-tool, the server notices a
missed heartbeat (1.5 s timeout; tools beat every 0.5 s and the worker sends at most one
per 0.5 s, see worker.py) and a 0.1 s first retry puts the call on a new worker ~1.6 s after
it last beat; sooner when a replacement worker on the same machine sees, at its start, that
the call's worker is gone (durable_agent/takeover.py). `call_model` is a local activity, run
inside the workflow task: a worker killed mid-call loses that task, which times out after
1.5 s and goes to the next worker.
Start-to-close timeouts only bound hung calls.

Why the model call is local: it is the one activity of every step, and as a regular
activity it cost a task round trip through the server plus a query for its context
(~45 ms of the ~120 ms a zero-latency step took, and most of the server's CPU per step).
Local, its input never enters history, it needs no query, and its reply is recorded in
the same workflow task that schedules the step's tools. The price: while a call runs
longer than 1.2 s (80 % of the task timeout) the worker extends its workflow task, three
small events every 1.2 s, and signals and updates wait for the next extension.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

HEARTBEAT_TIMEOUT = timedelta(seconds=1.5)
"""Tools only (the model call is local). The timeout also runs from the moment the server
hands a tool call to a worker, before its first beat, so it must cover a loaded worker's
delay in starting one: at 2 s, with the model call still a heartbeating activity and 50
agents on 2 cores, a few calls were retried spuriously; with the model call local the
worker runs far fewer tasks. At 1.5 s a crashed worker's tool call runs again ~1.6 s
after its last beat. A spurious retry is safe (the journal reports the first attempt's
outcome) but costs a "command interrupted" answer to the model."""

RETRY_FIRST = timedelta(milliseconds=100)
"""The first retry is the one after a crash: the heartbeat timeout has already waited 1.5 s
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
    non_retryable_error_types=["ModelRequestRejected", "ModelNotConfigured"],
)
LOCAL_RETRY_THRESHOLD = timedelta(seconds=2)
"""For local activities (the model call, the file tools): back-offs up to this wait in the
worker's memory; longer ones (the 6.4 s and 25.6 s retries, a long Retry-After) on a
durable timer, so they survive the worker and show in history instead of holding its
workflow task open."""

TOOL_START_TO_CLOSE = timedelta(seconds=120)

LOCAL_TOOLS = frozenset({"read_file", "write_file", "edit_file", "list_files", "search_files"})
"""The file tools run as local activities, inside the workflow task that asked for them,
like the model call. As regular activities each cost a task round trip through the server
and, when it finished, a workflow task of its own that only recorded it: a zero-latency
benchmark step (one model call, `write_file`, `run_command`) made three workflow tasks
and ~17 events; now one task and ~9 (see README, "Benchmarks"). They take milliseconds, so
the workflow task is held no longer than a model call holds it; a slow one (a search of
a huge tree) makes the worker extend its task as for a slow model. Crash safety is the
journal's, as before: a local activity whose worker dies before its task completes runs
again on the next worker, and `write_file` and `edit_file` find their recorded outcome
there instead of acting twice; the others only read. In the Web UI (2.54, checked in
Chromium) each is a "Local Activity" row with its summary (`write_file: notes.md`) in the
event history, and a point labelled with the tool name on the Timeline; a regular
activity would show its summary there too, and show as pending while it runs.
`run_command` stays a regular activity: it runs for seconds to minutes, heartbeats, and
is what a replacement worker takes over (durable_agent/takeover.py)."""
LOCAL_TOOLS_PATCH = "file-tools-local"
"""`workflow.patched` id: runs recorded before the change replay with regular activities."""
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
