"""The durable contract: every workflow and activity input and output.

Imported by workflows, activities, the worker, the CLI and the tests; no I/O at import.
Payloads recorded in history are decoded with the *current* models, so fields are only
ever added, with defaults (an old history must still decode).
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

if TYPE_CHECKING:
    from workflows.state import Carry, ContextStatus

from workflows.done import CriterionResult
from workflows.plan import PlanItem
from workflows.quota import Quota
from workflows.snapshots import SnapshotRequest, SnapshotTaken
from workflows.summary import StructuredSummary

TASK_QUEUE = "durable-agent"
WORKFLOW_TYPE = "AgentWorkflow"

# Tools the product ships. The workflow validates names against this list.
ALL_TOOLS: tuple[str, ...] = (
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "search_files",
    "run_command",
    "recall",
    "load_skill",
    "delegate",
    "plan",
)

RunState = Literal[
    "running",
    "paused",
    "awaiting_approval",
    "needs_attention",
    "completed",
    "stopped",
    "cancelled",
    "terminated",
]
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "stopped", "cancelled", "terminated"})

StopReason = Literal[
    "final_answer",
    "hard_step_limit",
    "token_budget",
    "cost_budget",
    "model_call_budget",
    "tool_call_budget",
    "time_limit",
    "wait_limit",
    "cancelled",
    "terminated",
]


class _Strict(BaseModel):
    """Inputs reject unknown fields: a typo such as `limit` must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


# --- input -------------------------------------------------------------------------


# Upper bounds of every count and duration a caller sets (input, `raise_limits`). Far above
# any real run, far below what breaks the workflow: a timer or a search attribute of
# 1e15 s or 10**30 overflowed (timedelta, int64) and failed the workflow task for good.
MAX_COUNT = 1_000_000
MAX_TOKENS = 10**12
MAX_COST_USD = 1_000_000.0
MAX_DURATION_S = 366 * 86_400.0
MAX_WAIT_S = 30 * 86_400.0
MAX_OUTPUT_CHARS = 10_000_000


PRESETS: dict[str, dict[str, float]] = {
    "simple_qa": {"max_model_calls": 3, "max_tokens": 5_000, "max_tool_calls": 1, "max_duration_s": 10},
    "data_analysis": {"max_model_calls": 30, "max_tokens": 80_000, "max_tool_calls": 15, "max_duration_s": 300},
    "report": {"max_model_calls": 50, "max_tokens": 150_000, "max_tool_calls": 30, "max_duration_s": 900},
    "orchestration": {"max_model_calls": 100, "max_tokens": 300_000, "max_tool_calls": 60, "max_duration_s": 1800},
}


class Limits(_Strict):
    """Step limits and budgets. Soft tiers warn and degrade; hard tiers stop the run cleanly."""

    preset: Literal["simple_qa", "data_analysis", "report", "orchestration"] | None = None
    soft_steps: int = Field(default=40, ge=1, le=MAX_COUNT)
    hard_steps: int = Field(default=50, ge=1, le=MAX_COUNT)
    max_tokens: int = Field(default=500_000, ge=1, le=MAX_TOKENS)
    max_cost_usd: float = Field(default=5.0, ge=0, le=MAX_COST_USD, allow_inf_nan=False)
    max_model_calls: int = Field(default=100, ge=1, le=MAX_COUNT)
    max_tool_calls: int = Field(default=300, ge=0, le=MAX_COUNT)
    max_duration_s: float = Field(default=3600, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    soft_ratio: float = Field(default=0.8, gt=0, le=1, allow_inf_nan=False)
    """Fraction of each budget at which its soft tier begins."""
    max_done_checks: int = Field(default=3, ge=1, le=MAX_COUNT)
    """Checks of the success criteria (workflows/done.py) before a final answer is taken as it is."""
    host_wait_s: float = Field(default=1800, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    """How long a run pinned to a host waits for that host's worker before it needs attention."""
    max_wait_s: float = Field(default=7 * 86_400, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)
    """The longest one wait for a person (paused, an approval, needs attention) may last;
    waits are outside `max_duration_s`, and past this the run stops (`wait_limit`)."""
    outage_wait_s: float = Field(default=1_800, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)
    """How long the run waits for a model endpoint that keeps failing with transient errors
    to answer again, before it needs attention."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        # A preset fills in what the caller did not say; explicit fields always win.
        if not isinstance(data, dict) or not data.get("preset"):
            return data
        preset = PRESETS.get(data["preset"])
        if preset is None:
            return data  # the Literal check reports the bad name
        merged: dict[str, Any] = {k: v for k, v in preset.items()}
        calls = int(preset["max_model_calls"])
        merged.setdefault("hard_steps", calls)
        merged.setdefault("soft_steps", max(1, int(calls * 0.8)))
        merged.update(data)
        return merged

    @model_validator(mode="before")
    @classmethod
    def _soft_follows_hard(cls, data: Any) -> Any:
        # `{"hard_steps": 10}` alone must just work: the default soft limit (40) would be
        # above it, so the soft limit follows at 80 % of the hard one.
        if not isinstance(data, dict) or "soft_steps" in data or not isinstance(data.get("hard_steps"), int):
            return data
        default_soft = cls.model_fields["soft_steps"].default
        if data["hard_steps"] >= default_soft:
            return data
        return {**data, "soft_steps": max(1, int(data["hard_steps"] * 0.8))}

    @model_validator(mode="after")
    def _hard_not_below_soft(self) -> Limits:
        if self.hard_steps < self.soft_steps:
            raise ValueError(f"hard_steps ({self.hard_steps}) must be >= soft_steps ({self.soft_steps})")
        return self


class LimitsPatch(_Strict):
    """Payload of `raise_limits`: any subset of `limits`."""

    soft_steps: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    hard_steps: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_cost_usd: float | None = Field(default=None, ge=0, le=MAX_COST_USD, allow_inf_nan=False)
    max_model_calls: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_tool_calls: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    max_duration_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    soft_ratio: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    max_done_checks: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    host_wait_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    max_wait_s: float | None = Field(default=None, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)
    outage_wait_s: float | None = Field(default=None, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)

    def apply_to(self, limits: Limits) -> Limits:
        """The new limits; raises ValueError when the result is inconsistent (hard < soft)."""
        changes = self.model_dump(exclude_none=True)
        return Limits.model_validate({**limits.model_dump(exclude={"preset"}), **changes})


class Approval(_Strict):
    tools: list[str] = Field(default_factory=list)
    """Tools whose every call waits for a person."""
    commands: list[str] = Field(default_factory=list)
    """Regexes: a `run_command` whose command matches one waits for a person."""
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)
    """How long a pending approval may wait; None waits forever."""
    on_timeout: Literal["deny", "pause"] = "deny"

    @field_validator("commands")
    @classmethod
    def _regexes_compile(cls, patterns: list[str]) -> list[str]:
        return _compiled("approval.commands", patterns)


class CommandSettings(_Strict):
    """What happens to a `run_command` whose worker died under it (the command may have partly run)."""

    on_interrupt: Literal["tell_model", "rerun", "ask"] = "tell_model"
    """`tell_model`: the model gets the interruption (and the output seen until then) as the
    call's error. `rerun`: a command matching `rerun_patterns` is run again; any other is told
    to the model. `ask`: the run needs attention with the command and its output so far;
    `resolve retry` runs it again, `skip` tells the model."""
    rerun_patterns: list[str] = Field(default_factory=list)
    """Regexes (searched in the command): the commands safe to run twice, for `rerun`."""

    @field_validator("rerun_patterns")
    @classmethod
    def _regexes_compile(cls, patterns: list[str]) -> list[str]:
        return _compiled("commands.rerun_patterns", patterns)


def _compiled(field: str, patterns: list[str]) -> list[str]:
    """`patterns`, each a valid regex, or a ValueError naming the first that is not."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"{field}: {pattern!r} is not a valid regex: {e}") from e
    return patterns


class ContextSettings(_Strict):
    max_context_tokens: int = Field(default=100_000, ge=1_000, le=MAX_TOKENS)
    keep_recent_steps: int = Field(default=6, ge=1, le=MAX_COUNT)
    tool_output_chars: int = Field(default=8_000, ge=500, le=MAX_OUTPUT_CHARS)
    """Tool output longer than this is truncated in context; the whole is kept by reference."""


MAX_CRITERIA = 50
MAX_CRITERION_CHARS = 2_000
"""Bounds of `success_criteria` and `check_command`: every check sends them to the judge."""

MAX_GOAL_CHARS = 100_000
"""About 25,000 tokens. The goal is carried twice at each continue-as-new (as the input's
goal and in the transcript), and Temporal refuses an input over 2 MB."""


class DelegationSettings(_Strict):
    max_depth: int = Field(default=3, ge=0, le=MAX_COUNT)
    """Levels of delegates below the root run (0: `delegate` is refused)."""
    max_children: int = Field(default=8, ge=0, le=MAX_COUNT)
    """Delegates one run may have running at once."""
    stall_after_s: float = Field(default=600, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)
    """A run that waits this long on a delegate which itself waits (for a person, or on its own
    delegate), with no step or spend in between, needs attention with the wait chain."""


class ParentLink(_Strict):
    """Set by a parent run in its delegate's input."""

    workflow_id: str
    depth: int = Field(ge=1)


class SandboxSettings(_Strict):
    """How `run_command` is confined; the default is the strictest."""

    network: bool = False
    """Let commands reach the network (and with it any service the worker's host can reach)."""


class ShellState(BaseModel):
    """The durable shell of a run's commands (`shell: persistent`): where the next command
    starts and the exported variables it has beyond the sandbox's own environment. Each
    `run_command` outcome records the state its command left; the next call carries it, so a
    new sandbox (another worker, a crash, an idle timeout) starts from it."""

    cwd: str = ""
    """The directory the last command ended in (a path inside the sandbox); empty: the workspace."""
    env: dict[str, str | None] = Field(default_factory=dict)
    """Variables set (a value) or unset (None) against the sandbox's environment. A value holding
    a secret of the worker is never recorded (activities/tools/run_sandbox.py)."""


AGENT_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""An agent's name is its file's name without `.md`: lowercase letters, digits, `.`, `_`, `-`."""

HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""A host's name (`DURABLE_AGENT_HOST`): it ends the name of the host's task queue."""

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("TEMPORAL_", "DURABLE_AGENT_", "OPENAI_")
"""The worker's own connection settings and secrets: no run may pass them to its commands."""


Effect = Literal["read", "write", "idempotent"]
"""How a tool call is handled: `read` retried freely; `idempotent` retried with the same
idempotency key; `write` never run twice: one whose worker died is reported to the model as
of unknown outcome."""
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What the OpenAI API accepts as a function name."""


def check_tool_name(name: str) -> str:
    if not TOOL_NAME.fullmatch(name):
        raise ValueError(f"tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
    return name


class ActivityTool(BaseModel):
    """An `activity_tools` entry: a tool served as a Temporal activity by another worker, any language."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    task_queue: str = Field(min_length=1)
    activity: str | None = None
    effect: Effect = "read"
    timeout_s: float | None = Field(default=None, gt=0)
    approval: bool = False
    cost_usd: float = Field(default=0.0, ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_tool_name(name)


class AgentInput(_Strict):
    """The workflow's single input. Everything but goal and workspace has a default."""

    goal: str = Field(min_length=1)
    workspace: str = Field(min_length=1)
    model: str = "gpt-4.1-mini"
    fallback_model: str | None = None
    system_prompt: str | None = None
    tools: list[str] | None = None
    limits: Limits = Field(default_factory=Limits)
    approval: Approval = Field(default_factory=Approval)
    context: ContextSettings = Field(default_factory=ContextSettings)
    continue_as_new_every: int = Field(default=50, ge=10, le=MAX_COUNT)
    """Steps per run before continue-as-new, even if the server has not suggested it yet.
    50 keeps a new worker's full replay of a run well inside the 1.5 s workflow task
    timeout that fast crash recovery relies on (see durable_agent/runs.py)."""
    delegation: DelegationSettings = Field(default_factory=DelegationSettings)
    parent: ParentLink | None = None
    """Set only by a parent run, for a delegate (the `delegate` tool)."""
    carry: Carry | None = None
    """Set only by the workflow itself when it continues as new."""
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    commands: CommandSettings = Field(default_factory=CommandSettings)
    env_allow: list[str] = Field(default_factory=list)
    """Names of worker environment variables that commands may see, besides PATH, the locale,
    TERM, HOME and TMPDIR (which are the sandbox's own)."""
    shell: Literal["persistent", "fresh"] = "persistent"
    """persistent: the run's commands share one sandbox and a shell's working directory and
    exported variables, recorded per command (ShellState); fresh: each command in a sandbox
    of its own, from the workspace, with the sandbox's environment."""
    agent: str | None = Field(default=None, pattern=AGENT_NAME)
    """An agent file's name (`agents/<name>.md`, workflows/agents.py): its fields fill in what
    this input does not give. The run's first activity reads it; the run then carries the result."""
    mcp_servers: list[str] = Field(default_factory=list)
    """MCP servers configured on the workers (DESIGN.md §5c, docs/mcp.md): their tools, listed at
    the run's start, are offered as `mcp__<server>__<tool>`."""
    success_criteria: str | list[str] | None = None
    """Statements a final answer must meet, judged against the transcript by one model call
    (workflows/done.py); unmet ones go back to the model, at most `limits.max_done_checks` times."""
    check_command: str | None = Field(default=None, min_length=1, max_length=MAX_CRITERION_CHARS)
    """A command run in the command sandbox when the model answers: exit code 0 means done."""
    activity_tools: list[ActivityTool] = Field(default_factory=list)
    """Tools served as Temporal activities by other workers; the model may use them all."""
    host: str | None = Field(default=None, pattern=HOST_NAME)
    """The host whose worker (`DURABLE_AGENT_HOST`) holds the workspace: the run's
    workspace-bound activities go to its own task queue (workflows/hosts.py). None: any worker."""
    snapshot_exclude: list[str] = Field(default_factory=list)
    """Names (glob patterns, e.g. `node_modules`, `*.log`) of files and folders the step
    snapshots leave out, at any depth (`.durable-agent/` always is)."""

    @field_validator("success_criteria")
    @classmethod
    def _criteria_bounded(cls, value: str | list[str] | None) -> str | list[str] | None:
        # Each check sends them all to the judge: a few dozen lines, not a document.
        items = [value] if isinstance(value, str) else value or []
        if len(items) > MAX_CRITERIA or any(len(item) > MAX_CRITERION_CHARS for item in items):
            raise ValueError(f"at most {MAX_CRITERIA} criteria of at most {MAX_CRITERION_CHARS:,} characters each")
        return value

    @field_validator("env_allow")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not ENV_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"env_allow: not environment variable names: {bad}")
        reserved = [n for n in names if n.upper().startswith(RESERVED_ENV_PREFIXES)]
        if reserved:
            raise ValueError(f"env_allow: {reserved} belong to the worker and are never passed to commands")
        return names

    @field_validator("goal")
    @classmethod
    def _goal_fits(cls, goal: str) -> str:
        if len(goal) > MAX_GOAL_CHARS:
            raise ValueError(
                f"goal is {len(goal):,} characters, over the {MAX_GOAL_CHARS:,} limit; put long material "
                "in a workspace file and name it in the goal"
            )
        if not goal.strip():
            raise ValueError("the goal is blank: say what the agent should do")
        return goal

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"workspace must be an absolute path, got {path!r}")
        return path.rstrip("/") or "/"

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, tools: list[str] | None) -> list[str] | None:
        # Tools beyond the built-ins are resolved by the workers at the run's start.
        for name in tools or []:
            check_tool_name(name)
        return tools

    @model_validator(mode="after")
    def _approval_tools_known(self) -> AgentInput:
        known = {*ALL_TOOLS, *(self.tools or []), *(t.name for t in self.activity_tools)}
        unknown = [t for t in self.approval.tools if t not in known]
        if unknown:
            raise ValueError(f"approval.tools names unknown tool(s) {unknown}")
        return self

    def enabled_tools(self) -> list[str]:
        named = list(ALL_TOOLS) if self.tools is None else list(self.tools)
        return named + [t.name for t in self.activity_tools if t.name not in named]

    def tools_to_resolve(self) -> list[str]:
        """The named tools that are neither built in nor given as `activity_tools`."""
        given = {t.name for t in self.activity_tools}
        return [t for t in self.tools or [] if t not in ALL_TOOLS and t not in given]


# --- conversation ------------------------------------------------------------------


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str
    """Raw JSON text as the model produced it; parsed (and possibly rejected) by the workflow."""


class Message(BaseModel):
    """One chat message, tagged with the step that produced it."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    step: int = 0
    kind: str | None = None
    """What produced a non-model message: system_prompt, goal, skill, user, warning,
    degradation, attention, resolution, tool_result, summary (the folded steps, as sent),
    compaction (a compaction, for people), archived (steps folded in earlier runs, for
    people). (Transcripts written before `tool_name` existed hold the tool's name here for
    tool results.)"""
    tool_name: str | None = None
    """For a tool result: the tool that produced it."""


# --- model call --------------------------------------------------------------------


class ModelContextRef(BaseModel):
    """Names the context of one model call without holding it: the run that makes the call,
    how many messages it sends and a digest of them (activities/model_context.py)."""

    run_id: str
    message_count: int
    digest: str


class ModelCallInput(BaseModel):
    """What one model call sends. `call_model` is a regular activity whose input is recorded
    in history, so the context travels by reference (`context`): re-sending the transcript
    in every call's input would make history grow with the square of the steps. Runs
    recorded while `call_model` was a local activity carry the messages themselves."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The context in the chat-completions wire format, when it is not sent by reference."""
    context: ModelContextRef | None = None
    """The context by reference: the activity reads it from its worker's cache or asks the
    workflow for it (the `model_context` query)."""
    tools: list[str]
    model: str
    live: bool = False
    """Someone follows the run (the `watch` signal's lease): the call serves the reply so far to
    a follower on its machine, or beats within a second of each new line with it, for their
    live view (activities/live_replies.py); otherwise its beats carry counts."""
    tool_schemas: list[dict[str, Any]] = Field(default_factory=list)
    """The OpenAI schemas of the tools in `tools` that are not built in, from the run's catalog."""
    max_tokens: int | None = None
    """The reply's cap: the run's step quota while a spike has shrunk it (workflows/quota.py)."""
    attempts: int | None = None
    """The call's own failures before its run is told (activities/model_attempts.py): a
    worker's death is not one. None: Temporal's retry policy counts every attempt."""
    outage_wait: bool = False
    """The run waits out an outage of the endpoint (workflows/outages.py): the call fails at
    once with `ModelEndpointDown` while its worker knows the endpoint is down."""


class ModelContextRequest(ModelContextRef):
    """The `model_context` query's argument: the call's ref, and the first message to answer
    with (None: all of them in one answer, as workers asked before answers were paged)."""

    first_message: int | None = Field(default=None, ge=0)

    def call(self) -> ModelContextRef:
        return ModelContextRef(run_id=self.run_id, message_count=self.message_count, digest=self.digest)


class ModelContext(BaseModel):
    """The answer to the `model_context` query: the in-flight call's messages, in wire format,
    from the first asked for; `next_message` is where the next page starts (None: the last)."""

    ref: ModelContextRef
    messages: list[dict[str, Any]]
    next_message: int | None = None


class Price(BaseModel):
    input_per_million: float
    output_per_million: float


class ModelReply(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    model: str
    finish_reason: str | None = None
    price: Price | None = None
    """None when the model is not in the price table: its cost is unknown (counted as 0)."""
    usage_estimated: bool = False
    """The endpoint reported no usage: the tokens are estimated (about 4 characters a token)."""

    def cost_usd(self) -> float:
        if self.price is None:
            return 0.0
        return (
            self.input_tokens * self.price.input_per_million + self.output_tokens * self.price.output_per_million
        ) / 1_000_000


# --- tool calls --------------------------------------------------------------------


RUN_FOLDER_CHARS = r"^[A-Za-z0-9._-]*$"


def one_folder_name(value: str) -> str:
    """A run folder's name names one folder: never `.` or `..`."""
    if value in (".", ".."):
        raise ValueError(f"{value!r} is not a run folder's name")
    return value


class McpTarget(BaseModel):
    """An MCP tool as its server knows it (activities/mcp_tools.py), and its effect."""

    server: str
    tool: str
    effect: Effect = "write"


class ToolCallInput(BaseModel):
    """Input of every tool activity (activity type = tool name)."""

    call_id: str
    idempotency_key: str
    """Unique to this tool call across retries and continue-as-new: first run id + step + call id."""
    workspace: str
    arguments: dict[str, Any]
    """Already parsed and validated against the tool's argument model by the workflow."""
    output_chars: int = 8_000
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """run_command only, like `env_allow`: copied from the run's input."""
    env_allow: list[str] = Field(default_factory=list)
    shell: ShellState | None = None
    """run_command only: the shell state the command starts from, in the run's own sandbox;
    None: a sandbox of its own, from the workspace (`shell: fresh`, and runs recorded before)."""
    run_folder: str = Field(default="", pattern=RUN_FOLDER_CHARS)
    """The chain's folder name under `.durable-agent/journal/` and `outputs/`; empty (calls
    recorded before per-chain folders): the journal and outputs lie directly in those folders."""
    step: int = Field(default=0, ge=0)
    """The step the call belongs to: the journal keeps only the current step's entries."""
    mcp: McpTarget | None = None
    """`mcp_call` only: which server and tool (the activity type is the same for all)."""
    snapshot: SnapshotRequest | None = None
    """A built-in tool that is its step's last call: the step's snapshot, taken after the
    call in the same activity (workflows/snapshot_steps.py); the outcome carries it."""
    riding: list[RidingCall] = Field(default_factory=list)
    """run_command only: the step's file calls, run in order before the command in its activity
    (workflows/tool_steps.py, `_riders`); the outcome carries theirs in `riding`."""

    @field_validator("run_folder")
    @classmethod
    def _one_folder(cls, value: str) -> str:
        return one_folder_name(value)


class RidingCall(BaseModel):
    """A file tool's call that runs inside its step's `run_command` activity, before the command."""

    tool: str
    call: ToolCallInput


NOT_RUN = "not run: "
"""How the error of a tool call that never ran begins (arguments refused, over the per-reply
cap, denied or skipped by a person): summaries and the fold index do not count it as run."""


class ToolOutcome(BaseModel):
    ok: bool
    output: str = ""
    """What goes back to the model (truncated when large)."""
    error: str | None = None
    """Set when ok is False: a clear message for the model."""
    full_output_ref: str | None = None
    """Workspace-relative path of the whole output when `output` was truncated."""
    output_bytes: int = 0
    shell: ShellState | None = None
    """run_command in a persistent shell: the state its command left (ShellState)."""
    cached_from: str | None = None
    """A read tool's cached answer: when it was fetched (ISO time). The run records a degradation."""
    snapshot: SnapshotTaken | None = None
    """The step's snapshot, when the call's input asked for it and it could be taken."""
    riding: list[ToolOutcome] = Field(default_factory=list)
    """The outcomes of the input's `riding` calls, in their order."""
    interrupted: bool = False
    """A command whose worker died under it: it may have partly run, and was not run again here
    (the run's `commands.on_interrupt` decides what follows)."""


# --- archive -----------------------------------------------------------------------


class ArchiveWrite(BaseModel):
    """Input of `archive_steps`: folded steps, kept whole under the workspace's archive folder."""

    workspace: str
    archive_dir: str
    """Workspace-relative folder of the run's chain (`.durable-agent/archive/...`)."""
    first_step: int
    last_step: int
    messages: list[Message]


class ArchiveWritten(BaseModel):
    path: str
    """Workspace-relative path of the file written."""
    messages: int
    bytes: int
    not_archived: str | None = None
    """Set when the chain's archive is at its cap: the steps were folded but not archived."""


class RecallInput(BaseModel):
    """Input of the `recall` tool's activity: which folded steps to return."""

    workspace: str
    archive_dir: str
    first_step: int | None = None
    last_step: int | None = None
    query: str | None = None
    in_context_from: int
    """The first step still in the model's context, verbatim (not in the archive yet)."""
    output_chars: int = 8_000


# --- run files ---------------------------------------------------------------------


class RunFilesCleanup(BaseModel):
    """Input of `clean_up_run`, run once when a run chain closes."""

    workspace: str
    run_folder: str = Field(min_length=1, pattern=RUN_FOLDER_CHARS)

    @field_validator("run_folder")
    @classmethod
    def _one_folder(cls, value: str) -> str:
        return one_folder_name(value)


class RunFilesCleaned(BaseModel):
    removed_files: int = 0
    removed_bytes: int = 0
    kept_files: int = 0
    kept_bytes: int = 0
    note: str
    """One line for people: what was removed, what was kept and why."""


# --- status and result -------------------------------------------------------------


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    cost_known: bool = True
    """False once any model call had no price: cost_usd then undercounts."""
    tool_costs: dict[str, float] = Field(default_factory=dict)
    """USD spent per tool (its `cost_usd` a call); included in cost_usd."""
    estimated_calls: int = 0
    """Model calls whose endpoint reported no usage: their tokens (and cost) are estimated."""
    done_checks: int = 0
    """Checks of the success criteria; each check's command is also a tool call and its judge
    a model call."""

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class AgentResult(BaseModel):
    state: RunState
    stop_reason: StopReason
    output: str
    steps: int
    usage: Usage
    unfinished: list[str] = Field(default_factory=list)
    summary: StructuredSummary | None = None
    """What the run did, in five fields; what a delegate's parent receives with its output."""
    files: str | None = None
    """What closing the run removed from, and kept in, its workspace's `.durable-agent/`."""
    degraded: list[str] = Field(default_factory=list)
    """Answers the run went on with that may be inaccurate (a tool's cached result)."""
    criteria: list[CriterionResult] = Field(default_factory=list)
    """The success criteria as the last check found them; empty without criteria."""
    plan: list[PlanItem] = Field(default_factory=list)
    """The run's task list (the `plan` tool) at its close."""


PACKED_MESSAGES = "zlib+base64:"
"""How carried messages start in the continue-as-new input (see `ModelView.messages`)."""
MAX_UNPACKED_BYTES = 256 * 2**20
"""Far above any transcript a model could be sent whole; a bound against a crafted input."""
_MESSAGE_LIST = TypeAdapter(list[Message])


def pack_messages(messages: list[Message]) -> str:
    return PACKED_MESSAGES + base64.b64encode(zlib.compress(_MESSAGE_LIST.dump_json(messages))).decode()


def unpack_messages(value: Any) -> Any:
    """A packed transcript's messages; anything else (a plain list) as given, for pydantic."""
    if not (isinstance(value, str) and value.startswith(PACKED_MESSAGES)):
        return value
    try:
        inflater = zlib.decompressobj()
        data = inflater.decompress(base64.b64decode(value[len(PACKED_MESSAGES) :]), MAX_UNPACKED_BYTES)
    except (binascii.Error, zlib.error) as e:
        raise ValueError(f"the carried transcript is damaged: {e}") from None
    if inflater.unconsumed_tail:
        raise ValueError(f"the carried transcript unpacks to more than {MAX_UNPACKED_BYTES:,} bytes")
    return _MESSAGE_LIST.validate_json(data)


class Degradation(BaseModel):
    step: int
    kind: Literal[
        "soft_warning", "fallback_model", "compaction", "early_soft_tier", "stop", "cached_tool_result", "skip_optional"
    ]
    """The ladder's rungs in order: compaction, soft_warning (wrap up), fallback_model, stop."""
    detail: str


class PendingApproval(BaseModel):
    call_id: str
    tool: str
    summary: str
    """One line, cut at 120 characters: for lists."""
    step: int
    reason: str
    shown: str = ""
    """What the person approves, whole and escaped (workflows/approval.py `approval_view`):
    the command, the file's content. Empty in runs recorded before it existed."""


class ApprovalDecision(BaseModel):
    call_id: str
    approved: bool
    note: str | None = None


class AttentionReport(BaseModel):
    what_failed: str
    last_error: str
    attempts: int
    step: int
    suggested_actions: list[str]
    call_id: str | None = None
    """Which call failed: `model` for the model call, `<step>:<tool call id>` for a tool call.
    Name it in `resolve` when several calls need attention at once."""


class Resolution(BaseModel):
    action: Literal["retry", "skip", "terminate"]
    note: str | None = None
    call_id: str | None = None
    """The report to resolve; None resolves every open report with this action."""


class PauseRequest(_Strict):
    reason: str | None = None


class WatchRequest(_Strict):
    """The `watch` signal: someone follows the run live for the next `for_s` seconds (a lease
    the follower renews), so its model calls carry their reply so far in their heartbeats."""

    for_s: float = Field(default=120.0, ge=1.0, le=3600.0)


class UserMessage(_Strict):
    text: str = Field(min_length=1)


class TranscriptRequest(BaseModel):
    from_step: int = 0


class WaitLink(BaseModel):
    """One run in a chain of waits, what it waits for, and the command that unblocks it."""

    workflow_id: str
    waiting_for: str
    command: str | None = None


class ChildReport(BaseModel):
    """Payload of the `child_report` signal a delegate sends its parent when it changes."""

    workflow_id: str
    seq: int
    state: str
    step: int
    usage: Usage
    activity: str = ""
    wait_chains: list[list[WaitLink]] = Field(default_factory=list)


class ChildRun(BaseModel):
    """A running delegate as its parent sees it: what it was given and its last report."""

    workflow_id: str
    goal: str
    limits: Limits
    state: str = "starting"
    step: int = 0
    usage: Usage = Field(default_factory=Usage)
    """Its spend so far (live); charged to the parent when it ends."""
    activity: str = ""
    wait_chains: list[list[WaitLink]] = Field(default_factory=list)
    seq: int = 0


class Runway(BaseModel):
    """Steps left at the current rate for each budget (None: not measurable yet)."""

    steps: int | None = None
    tokens: int | None = None
    cost: int | None = None
    model_calls: int | None = None
    tool_calls: int | None = None
    time: int | None = None


class AgentStatus(BaseModel):
    state: RunState | Literal["starting"]
    step: int
    model: str
    agent: str | None = None
    """The agent file the run runs, as `name (path)`; None for a run without one."""
    usage: Usage
    limits: Limits
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    attention: AttentionReport | None = None
    """The first open report; `attention_reports` holds them all."""
    attention_reports: list[AttentionReport] = Field(default_factory=list)
    paused_reason: str | None = None
    degradations: list[Degradation] = Field(default_factory=list)
    soft_tier: list[str] = Field(default_factory=list)
    """Budgets currently in their soft tier."""
    runway: Runway = Field(default_factory=Runway)
    activity: str = ""
    """What the run is doing now, in words."""
    ignored_signals: list[str] = Field(default_factory=list)
    """Signals this run could not use (unknown name, malformed payload), newest last."""
    result: AgentResult | None = None
    context: ContextStatus | None = None
    """The model's context: its size, the summary, the index and each compaction."""
    children: list[ChildRun] = Field(default_factory=list)
    """Delegates running now, with their live spend and what they wait for."""
    wait_chains: list[list[WaitLink]] = Field(default_factory=list)
    """What this run waits for, through its delegates: `a → a/child → awaiting approval of call X`."""
    tool_waits: list[str] = Field(default_factory=list)
    """Tool calls waiting for a live worker: "waiting for a worker with tool X since T"."""
    plan: list[PlanItem] = Field(default_factory=list)
    """The run's task list, as the model keeps it with the `plan` tool."""
    quota: Quota = Field(default_factory=Quota)
    """The per-step token quota, the compaction level and their latest changes."""
    host: str | None = None
    """The host the run is pinned to (input `host`, or where `move` took it)."""
    host_wait: str | None = None
    """"waiting for host X since T" while its worker does not take the run's calls."""
    host_moves: list[str] = Field(default_factory=list)
    """The run's moves to another host (`durable-agent move`) in this run of its chain."""


import workflows.state  # noqa: E402, F401  (defines Carry and ContextStatus, and completes the models above)
