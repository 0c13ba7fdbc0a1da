"""Timeouts and retry policies for every activity the agent runs, with the reasons.

Crash recovery speed is set here and by the 1.5 s workflow task timeout (durable_agent/runs.py).
`call_model`, `run_command` and the file tools of runs recorded before they became local
are regular activities: when a worker is SIGKILLed mid-call, the server notices a missed
heartbeat (a command's timeout is 5 s, a model call's 10 s; calls beat three times per
timeout, the first a third of it after the start, and the worker sends at most one beat
per 0.5 s, see worker.py) and a 0.1 s first
retry puts the call on a new worker soon after; at once when a replacement worker on the
same machine sees, at its start, that the call's worker is gone (durable_agent/takeover.py). The file tools are local
activities, run inside a workflow task: a worker killed mid-task loses that task, which
times out after 1.5 s and goes to the next worker.
Start-to-close timeouts only bound hung calls.

Why the model call is a regular activity: a model answers in seconds to a minute. As a
local activity it held its run's workflow task all that time, so the worker extended the
task every 1.2 s (three events and a server round trip each), at most 100 ran at once per
worker, a task that expired under load was replayed and repeated the call, and a run
started with the server's default 10 s task timeout stalled that long after a kill. As a
regular activity it waits without holding anything; its input names the context instead
of carrying it (activities/model_context.py), so history still records only the reply.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

HEARTBEAT_TIMEOUT = timedelta(seconds=5)
"""For `run_command` (and file tools recorded as regular activities). The timeout also runs
from the moment the server hands a call to a worker, before its first beat, so it must
cover a loaded worker's delay in starting one: with 200 agents in step on one 2-core
worker, a command took 1.0 s median and 4.1 s at worst from being scheduled to its result
(`python -m bench fleet`), and at 1.5 s a fifth of the commands were retried while they
still ran. Such a retry waits for the running command when it lands on the same worker
(activities/tools/__init__.py). A worker that dies mid-command is found at once by a
replacement on the same machine (durable_agent/takeover.py), otherwise after these 5 s."""

MODEL_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""Longer than a command's: a model call waits for seconds to a minute, and each beat is a
server round trip and a write of the run's state (~1-3 ms of server CPU). Beating every
3.3 s, a call answered within that sends none (at 5 s, every call of a 3 s model sent one;
at 1.5 s, 200 agents waiting on it sent 400 a second). A worker that dies mid-call is found
at once by a replacement on the same machine (durable_agent/takeover.py) and otherwise
after these 10 s. A spurious timeout would repeat a model call (`python -m bench chaos`
and `python -m bench fleet` count model calls beyond steps)."""

RETRY_FIRST = timedelta(milliseconds=100)
"""The first retry is the one after a crash: the heartbeat timeout has already passed
and a replacement worker is usually polling by then, so every 100 ms here is 100 ms of
recovery. Real failures then back off fast."""
RETRY_GROWTH = 4.0
"""From 0.1 s, x4 spaces retries 0.1, 0.4, 1.6, 6.4, 25.6 s: the model gets ~34 s in all
before a person is asked, tools 8.5 s."""

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
COUNTED_MODEL_RETRY = RetryPolicy(
    initial_interval=MODEL_RETRY.initial_interval,
    backoff_coefficient=MODEL_RETRY.backoff_coefficient,
    maximum_interval=MODEL_RETRY.maximum_interval,
    maximum_attempts=MODEL_RETRY.maximum_attempts + 10,
    non_retryable_error_types=MODEL_RETRY.non_retryable_error_types,
)
"""Runs on `LIMITS_PATCH`: the call counts its own failures (MODEL_RETRY's attempts, the
`attempts` of its input) and ends itself after them; these 10 more attempts are for workers
that die under it. A call that keeps killing its worker still reaches a person."""
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=1.5)
"""The task timeout of every run: `start_agent` sets it, and a run started with a longer one
continues as new with it at its first task (see durable_agent/runs.py for the measurements)."""
TASK_TIMEOUT_PATCH = "short-task-timeout"
"""`workflow.patched` id: runs recorded before a long task timeout was shortened replay so."""
MODEL_ACTIVITY_PATCH = "model-call-activity"
"""`workflow.patched` id: runs recorded while the model call was a local activity replay so."""
LOCAL_RETRY_THRESHOLD = timedelta(seconds=2)
"""For local activities (the file tools, and the model call of older runs): back-offs up
to this wait in the worker's memory; longer ones (the 6.4 s and 25.6 s retries, a long Retry-After) on a
durable timer, so they survive the worker and show in history instead of holding its
workflow task open."""

TOOL_START_TO_CLOSE = timedelta(seconds=120)

# load_skill reads one small file, like the file tools.
LOCAL_TOOLS = frozenset({"read_file", "write_file", "edit_file", "list_files", "search_files", "load_skill"})
"""The file tools run as local activities, inside the workflow task that asked for them.
As regular activities each cost a task round trip through the server and, when it
finished, a workflow task of its own that only recorded it. They take milliseconds; a
slow one (a search of a huge tree) makes the worker extend its task. Crash safety is the
journal's: a local activity whose worker dies before its task completes runs
again on the next worker, and `write_file` and `edit_file` find their recorded outcome
there instead of acting twice; the others only read. In the Web UI (2.54, checked in
Chromium) each is a "Local Activity" row with its summary (`write_file: notes.md`) in the
event history, and a point labelled with the tool name on the Timeline; a regular
activity would show its summary there too, and show as pending while it runs.
`run_command` stays a regular activity: it runs for seconds to minutes, heartbeats, and
is what a replacement worker takes over (durable_agent/takeover.py). Beside a command that
takes its step's snapshot, the step's file calls run inside the command's activity instead
(FILE_CALLS_WITH_COMMAND_PATCH)."""
SKILLS_PATCH = "skills-catalog"
"""`workflow.patched` id: runs recorded before skills existed list none at their start."""
SKILLS_TIMEOUT = timedelta(seconds=30)
"""Listing the skill folders at a run's start."""
AGENT_FILE_TIMEOUT = timedelta(seconds=30)
"""Reading the input's agent file at a run's start (a local activity: one small file)."""
LOCAL_TOOLS_PATCH = "file-tools-local"
"""`workflow.patched` id: runs recorded before the change replay with regular activities."""
WAITS_NOT_TIMED_PATCH = "waits-not-timed"
"""`workflow.patched` id: time waiting for a person is left out of `elapsed_s`."""
CLOSED_RUN_STATE_PATCH = "closed-run-state"
"""`workflow.patched` id: a run clears its AgentState before it continues as new."""
LIVELOCK_ACROSS_STEPS_PATCH = "livelock-across-steps"
"""`workflow.patched` id: runs recorded before it count identical calls of one reply as repeats."""
WORKSPACE_CHECK_PATCH = "workspace-roots-check"
"""`workflow.patched` id: runs recorded before the check replay without it."""
WORKSPACE_CHECK_TIMEOUT = timedelta(seconds=10)
"""`check_workspace`: a `stat` or two, once at a run's start."""
RUN_FILES_PATCH = "run-files"
"""`workflow.patched` id: runs recorded before per-chain journal and output folders replay
with the shared ones, and close without `clean_up_run`."""
CLEANUP_TIMEOUT = timedelta(seconds=60)
CLEANUP_RETRY = RetryPolicy(
    initial_interval=RETRY_FIRST,
    backoff_coefficient=RETRY_GROWTH,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
    non_retryable_error_types=["HostileLayout", "WorkspaceError"],
)
"""A cleanup that keeps failing is reported in the result; `durable-agent gc` finishes it."""
COMMAND_GRACE = timedelta(seconds=30)
"""run_command's start-to-close is its own timeout plus this, so the tool reports the timeout."""
TOOL_RETRY = RetryPolicy(
    initial_interval=RETRY_FIRST,
    backoff_coefficient=RETRY_GROWTH,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=["ToolArgumentError"],
)
# Cancelling a run waits for run_command to kill its process group before the run closes.
TOOL_CANCELLATION = ActivityCancellationType.WAIT_CANCELLATION_COMPLETED

DEFAULT_COMMAND_TIMEOUT_S = 120.0


RIDING_MAX_CHARS = 256_000
"""The most arguments (in characters, the command's own counted) the file calls riding with a
command may bring into its activity's input: a server refuses a payload over 2 MB, and a
workflow task whose command it refuses fails; past it, a file call runs alone."""
RIDING_CALL_TIME = timedelta(seconds=30)
"""What each file call riding with a command adds to the command activity's start-to-close:
the most a file call may take (FILE_TOOL_TIME_LIMIT_S, activities/tools/__init__.py)."""


def tool_start_to_close(tool: str, timeout_s: float | None) -> timedelta:
    if tool != "run_command":
        return TOOL_START_TO_CLOSE
    return timedelta(seconds=timeout_s or DEFAULT_COMMAND_TIMEOUT_S) + COMMAND_GRACE


ARCHIVE_AT_END_PATCH = "archive-at-end"
"""`workflow.patched` id: runs recorded before the archive existed end without writing it."""

SEARCH_ATTRIBUTES_REFRESH = timedelta(seconds=10)
"""How stale `AgentStep`, `AgentTokens` and `AgentCostUsd` may be while a run stays in one
state: each upsert is a write to the server's visibility store, and one per step was the
largest server cost of a step after the model call (`python -m bench fleet`). `AgentState`
is written at every change, and the `status` query and the Web UI's current details are
always live."""
SEARCH_ATTRIBUTES_REFRESH_PATCH = "search-attributes-refresh"
"""`workflow.patched` id: runs recorded before the refresh interval wrote them every step."""

LOCAL_START_UP_PATCH = "local-start-up"
"""`workflow.patched` id: runs recorded before it checked the workspace and listed skills with
regular activities. They are local activities now, in the run's first workflow task: as
regular ones each cost a task round trip through the server and a workflow task of its
own, a fifth of a 4-step run's (`python -m bench fleet`). They used to be regular because
a local activity that outlasts 80 % of the task timeout has its result recorded in an
earlier workflow task than the commands after it, and a `workflow.patched` among those
then read differently on replay (a nondeterminism error). A run on the baseline patch
calls `workflow.patched` once, before them, and never after."""

LOCAL_CLEAN_UP_PATCH = "local-clean-up"
"""`workflow.patched` id: runs recorded before it removed their files at the close with a
regular activity. A local one (in the run's last workflow task) saves that task's round
trip; removing a run's journal takes milliseconds."""

BASELINE_PATCH = "baseline-1"
"""`workflow.patched` id that stands for every patch in `BASELINE_PATCHES` at once.

The SDK records each patch a run goes through as a marker and, with it, an upsert of the
`TemporalChangeVersion` search attribute: a write to the visibility store, one per patch
per run (four at every run's start before this). A run started on this code records this
one patch and then takes every listed behaviour; runs recorded with the individual patches
(and none) replay through them as before. The list of a released baseline never changes: a
patch added later is checked on its own until a new baseline id lists it too."""
BASELINE_PATCHES = frozenset(
    {
        TASK_TIMEOUT_PATCH,
        MODEL_ACTIVITY_PATCH,
        SKILLS_PATCH,
        LOCAL_TOOLS_PATCH,
        WAITS_NOT_TIMED_PATCH,
        CLOSED_RUN_STATE_PATCH,
        WORKSPACE_CHECK_PATCH,
        ARCHIVE_AT_END_PATCH,
        SEARCH_ATTRIBUTES_REFRESH_PATCH,
        LOCAL_START_UP_PATCH,
        RUN_FILES_PATCH,
        LOCAL_CLEAN_UP_PATCH,
    }
)

SNAPSHOT_PATCH = "workspace-snapshots"
"""`workflow.patched` id: runs recorded before step snapshots existed take none (workflows/snapshots.py)."""
BASELINE_2_PATCH = "baseline-2"
"""Baseline 1's patches and the two added since; runs started on this code record only it."""
BASELINE_2_PATCHES = BASELINE_PATCHES | {SNAPSHOT_PATCH, LIVELOCK_ACROSS_STEPS_PATCH}
LIMITS_PATCH = "limits-time-cap-outages"
"""`workflow.patched` id: runs recorded before it have no watcher on their time (workflows/time_cap.py),
calls not clipped to the time left, no waits for a failing model endpoint (workflows/outages.py),
and the server counts every attempt of a model call."""
BASELINE_3_PATCH = "baseline-3"
"""Baseline 2's patches and the limits patch (runs recorded in tests/histories have it)."""
BASELINE_3_PATCHES = BASELINE_2_PATCHES | {LIMITS_PATCH}
SHELL_PATCH = "cheap-durable-shell"
"""`workflow.patched` id: runs recorded before the durable shell send commands without a
shell state and describe run_command as they did (workflows/shell.py)."""
DONE_PATCH = "done-checks"
"""`workflow.patched` id, asked only by runs with criteria: a run recorded before checks existed
took its first answer."""
QUOTA_LEVELS_PATCH = "quota-compaction-levels"
"""`workflow.patched` id, asked only when a compaction would run at a level above 0: it keeps
fewer steps, which changes what a compaction folds (and so its commands)."""
APPROVAL_DIFF_PATCH = "left2-approval-diff"
"""`workflow.patched` id: runs recorded before the diff existed ask for approval without it."""
ACTIVITY_TOOL_REDACTION_PATCH = "left1-activity-tool-redaction"
"""`workflow.patched` id: runs recorded before it took an activity tool's answer as it came
(capped, token shapes redacted); since, the answer also goes through a local activity that
redacts the worker's own secrets before the run records it (its marker is a new command)."""
LOCAL_PYTHON_TOOLS_PATCH = "left1-local-python-tools"
"""`workflow.patched` id: runs recorded before it called every Python tool as a regular
activity on its tool's queue; since, a tool with a short `timeout_s` (`LOCAL_TOOL_MAX_S`) runs
as a local activity of the worker running the run (`run_tool_here`) when that worker has it."""
BASELINE_4_PATCH = "baseline-4"
"""Baseline 3's patches and the six added beside it; runs started on this code record only it
(one TemporalChangeVersion write per run, not one per patch)."""
BASELINE_4_PATCHES = BASELINE_3_PATCHES | {
    SHELL_PATCH,
    DONE_PATCH,
    QUOTA_LEVELS_PATCH,
    APPROVAL_DIFF_PATCH,
    ACTIVITY_TOOL_REDACTION_PATCH,
    LOCAL_PYTHON_TOOLS_PATCH,
}
HOSTS_PROBE_PATCH = "hosts-first-call-probe"
"""`workflow.patched` id, asked only by runs pinned to a host: runs recorded before it made their
first call there without asking whether any worker of the host had polled (workflows/hosts.py)."""
HOSTS_LOCAL_PATCH = "hosts-local-on-host"
"""`workflow.patched` id, asked only by runs pinned to a host: runs recorded before it called
every workspace-bound activity on the host's queue; since, the ones a run without a host runs
locally are first tried as local activities, which only the host's own worker serves
(workflows/hosts.py, `_here_or_on_host`)."""
BASELINE_5_PATCH = "baseline-5"
"""Baseline 4's patches and those added since; runs started on this code record only it."""
BASELINE_5_PATCHES = BASELINE_4_PATCHES | {HOSTS_PROBE_PATCH, HOSTS_LOCAL_PATCH}
SNAPSHOT_WITH_TOOLS_PATCH = "snapshot-with-tools"
"""`workflow.patched` id: runs recorded before it took every step's snapshot in a local activity
of its own; since, a step of built-in tools with at most one command takes it in its last
call's activity, that call run after the others (workflows/snapshot_steps.py)."""
BASELINE_6_PATCH = "baseline-6"
"""Baseline 5's patches and the one added since; runs started on this code record only it."""
BASELINE_6_PATCHES = BASELINE_5_PATCHES | {SNAPSHOT_WITH_TOOLS_PATCH}
FILE_CALLS_WITH_COMMAND_PATCH = "file-calls-with-command"
"""`workflow.patched` id: runs recorded before it ran a step's file calls as local activities
before its command; since, where the command takes the step's snapshot, they run inside the
command's activity, before it (workflows/tool_steps.py, `_riders`)."""
BASELINE_7_PATCH = "baseline-7"
"""Baseline 6's patches and the one added since; runs started on this code record only it."""
BASELINE_7_PATCHES = BASELINE_6_PATCHES | {FILE_CALLS_WITH_COMMAND_PATCH}
OPEN_RUN_PATCH = "open-run"
"""`workflow.patched` id: runs recorded before it checked the workspace, took step 0's snapshot
and listed skills in three local activities; since, one (`open_run`, workflows/run_opening.py)
where nothing runs between them and the run has no host."""
BASELINE_8_PATCH = "baseline-8"
"""Baseline 7's patches and the one added since; runs started on this code record only it."""
BASELINE_8_PATCHES = BASELINE_7_PATCHES | {OPEN_RUN_PATCH}
CAP_FIRED_FIRST_PATCH = "cap-fired-first"
"""`workflow.patched` id, asked only when the cap's timer fires in the activation where a wait
for a person begins or ends: runs recorded before it timed the new state (a 7-day `max_wait_s`
timer after the cap's); since, the time is up (workflows/time_cap.py). Checked on its own, so
only runs that meet the case record it."""
MCP_CLOSE_UNLISTED_PATCH = "mcp-close-unlisted"
"""`workflow.patched` id, asked only when a run with MCP servers closes before its tools were
listed (cancelled while its servers started): runs recorded before it skipped `mcp_close`
then; since, it runs, and stops a start still going (activities/mcp_sessions.py)."""
BASELINES = (
    (BASELINE_8_PATCH, BASELINE_8_PATCHES),
    (BASELINE_7_PATCH, BASELINE_7_PATCHES),
    (BASELINE_6_PATCH, BASELINE_6_PATCHES),
    (BASELINE_5_PATCH, BASELINE_5_PATCHES),
    (BASELINE_4_PATCH, BASELINE_4_PATCHES),
    (BASELINE_3_PATCH, BASELINE_3_PATCHES),
    (BASELINE_2_PATCH, BASELINE_2_PATCHES),
    (BASELINE_PATCH, BASELINE_PATCHES),
)
"""Newest first: a run takes the newest baseline its history has (a new run: the newest)."""

REDACTION_TIMEOUT = timedelta(seconds=10)

LOCAL_TOOL_MAX_S = 5.0
"""A local activity runs inside the run's workflow task: only calls this short may hold one.
Longer tools (and tools without `timeout_s`, 120 s) keep their own queue."""


TOOL_WORKER_WAIT = timedelta(seconds=10)
"""How long a user tool's call waits in its task queue for a worker before the run says it is
"waiting for a worker with tool X" (a schedule-to-start timeout, which Temporal never
retries); it is then scheduled again, and so on until a worker with the tool polls."""
CATALOG_TIMEOUT = timedelta(seconds=10)
MCP_CATALOG_TIMEOUT = timedelta(seconds=120)
"""With MCP servers: each starts (in its sandbox) and lists its tools (activities/mcp_sessions.py)."""
MCP_CLOSE_TIMEOUT = timedelta(seconds=30)
MCP_DOWN_RETRY = timedelta(seconds=30)
"""A run whose MCP server is down at its start tries again this often (after the catalog's own
retries, ~8.5 s): each try is a few events in its history."""
USER_TOOL_TIMEOUT_S = 120.0


def catalog_tool_retry(retries: int | None) -> RetryPolicy:
    """A write tool's retry (after its worker died) reads the call's journal instead of acting
    again (activities/user_tools.py): it is retried like the others."""
    attempts = retries or 3
    return RetryPolicy(
        initial_interval=RETRY_FIRST,
        backoff_coefficient=RETRY_GROWTH,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=attempts,
    )
