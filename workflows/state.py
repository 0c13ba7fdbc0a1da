"""A run's state, in three parts: the durable counters, the model's view, the archive.

* `Carry` is what crosses continue-as-new: the counters and flags (steps, usage, limits'
  bookkeeping, degradations), the model's view and where the archive is. It stays bounded
  however long the run: the view holds the session layer, one structured summary, a
  bounded index and the unfolded steps; everything folded lives in the archive.
* `ModelView` is what the model is sent, by layer: the session (system prompt, goal,
  loaded skills: never folded), the running summary and the index of what was folded,
  then the unfolded steps verbatim (the task layer, older steps that the next compaction
  folds, and the step layer, the last `keep_recent_steps`).
* The archive is a folder of JSONL files under the workspace's `.durable-agent/archive/`,
  written by the `archive_steps` activity when steps are folded and when the run ends:
  the `recall` tool and `durable-agent export` read it, so folded steps survive
  continue-as-new and the retention of old runs' histories.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, field_serializer, field_validator, model_validator

from workflows.done import CriterionResult
from workflows.livelock import LivelockTracker
from workflows.plan import PlanItem
from workflows.quota import Quota
from workflows.summary import StructuredSummary
from workflows.tool_catalog import ToolSpec
from workflows.types import (
    AgentInput,
    AgentStatus,
    Degradation,
    Message,
    Price,
    ShellState,
    Usage,
    pack_messages,
    unpack_messages,
)

SESSION_KINDS = frozenset({"system_prompt", "goal", "skills", "skill"})
"""Messages of the session layer, never folded: the skills listed at the start ("skills")
and each skill `load_skill` loaded ("skill"), see workflows/skills.py."""


class CommandRun(BaseModel):
    command: str
    exit_code: int | None = None
    """None when the command did not report one (a timeout, an error before it ran)."""


class FoldedStep(BaseModel):
    """One folded step in the index: what it did, in a line."""

    step: int
    tools: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    commands: list[CommandRun] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


class IndexDigest(BaseModel):
    """Folded steps too old for a line of their own, counted: the archive has each in full."""

    first_step: int
    last_step: int
    tool_counts: dict[str, int] = Field(default_factory=dict)
    files: list[str] = Field(default_factory=list)
    """The most recently touched files, at most `compaction.INDEX_FILES`."""
    commands: int = 0
    failed_commands: int = 0
    errors: int = 0


class FoldIndex(BaseModel):
    """Every folded step: the latest each with a line, the older ones as one digest."""

    digest: IndexDigest | None = None
    steps: list[FoldedStep] = Field(default_factory=list)

    @property
    def folded_through(self) -> int:
        if self.steps:
            return self.steps[-1].step
        return self.digest.last_step if self.digest else 0


class Compaction(BaseModel):
    """One compaction, as status, transcript and the Web UI show it."""

    step: int
    first_step: int
    last_step: int
    trigger: Literal["size", "soft_tier", "person"]
    summary_source: Literal["model", "model_retry", "extractive"]
    """Who wrote the summary: the model, the model on its second try, or the deterministic
    extractive fallback after two malformed replies."""
    tokens_before: int
    tokens_after: int
    summary_tokens: int = 0
    """Tokens the summarising model calls used (their reported usage)."""


class ContextCounters(BaseModel):
    compactions: int = 0
    folded_steps: int = 0
    summary_tokens: int = 0
    extractive_summaries: int = 0


class ModelView(BaseModel):
    """What the model is sent, by layer; see the module docstring."""

    session: list[Message] = Field(default_factory=list)
    summary: StructuredSummary | None = None
    index: FoldIndex = Field(default_factory=FoldIndex)
    messages: list[Message] = Field(default_factory=list)
    """The unfolded steps, verbatim, with the record-only notes of those steps (kept for
    the transcript, never sent). Packed in the continue-as-new input, like before."""

    @field_serializer("messages", when_used="json")
    def _pack(self, messages: list[Message]) -> str:
        return pack_messages(messages)

    @field_validator("messages", mode="before")
    @classmethod
    def _unpack(cls, value: Any) -> Any:
        return unpack_messages(value)


class Carry(BaseModel):
    """A run's durable state: what the workflow keeps and hands on at continue-as-new."""

    step: int = 0
    usage: Usage = Field(default_factory=Usage)
    view: ModelView = Field(default_factory=ModelView)
    archive_dir: str = ""
    """Workspace-relative folder of this chain's archive (`.durable-agent/archive/...`)."""
    archived_through: int = 0
    """Every step up to this one is in the archive."""
    compactions: list[Compaction] = Field(default_factory=list)
    """The latest compactions (at most `compaction.COMPACTIONS_SHOWN`); counters has them all."""
    context: ContextCounters = Field(default_factory=ContextCounters)
    elapsed_before_s: float = 0.0
    """Wall time spent in earlier runs of the chain."""
    model: str = ""
    degradations: list[Degradation] = Field(default_factory=list)
    ladder: list[str] = Field(default_factory=list)
    """Rungs of the degradation ladder climbed so far, in order (workflows/ladder.py)."""
    early_soft_tier: bool = False
    """A token spike put the run on the ladder before any budget reached its soft tier."""
    warned: list[str] = Field(default_factory=list)
    """Budgets whose soft-tier warning the model already got."""
    pending_user_messages: list[str] = Field(default_factory=list)
    paused_reason: str | None = None
    paused: bool = False
    tokens_per_step: list[int] = Field(default_factory=list)
    recent_output_tokens: list[int] = Field(
        default_factory=list, validation_alias=AliasChoices("recent_output_tokens", "output_tokens")
    )
    """The last model replies' output token counts (a moving window): the next reply's expected
    size. Read from `output_tokens` in carries written before the rename."""
    last_price: Price | None = None
    last_input_tokens: int = 0
    last_estimate: int = 0
    """The offline estimate of the last request, to compare with its reported input tokens."""
    livelock: LivelockTracker = Field(default_factory=LivelockTracker)
    first_run_id: str = ""
    agent_file: str = ""
    """The agent file read at the chain's start and laid under its input (workflows/agents.py);
    empty until then, or without one."""
    skills_listed: bool = False
    """The skills were listed (once per chain, at its first run that reaches its loop)."""
    loaded_skills: list[str] = Field(default_factory=list)
    """Skills loaded so far; their bodies are `skill` messages in the session layer."""
    catalog: list[ToolSpec] | None = None
    """The run's tools beyond the built-ins, as its workers offered them at the chain's start
    (`tool_catalog`, recorded once); None: not resolved (a run of built-in tools only)."""
    snapshot: str | None = None
    """The digest of the workspace's latest snapshot (workflows/snapshots.py)."""
    done_checks: int = 0
    """Checks of the success criteria made so far (workflows/done_steps.py)."""
    criteria: list[CriterionResult] = Field(default_factory=list)
    """The criteria as the last check found them."""
    plan: list[PlanItem] = Field(default_factory=list)
    """The run's task list (the `plan` tool, workflows/plan.py)."""
    quota: Quota = Field(default_factory=Quota)
    """The per-step token quota and the compaction level, with their changes (workflows/quota.py)."""
    shell: ShellState | None = None
    """The durable shell's state after the run's last command (workflows/shell.py)."""

    @model_validator(mode="before")
    @classmethod
    def _from_whole_transcript(cls, data: Any) -> Any:
        # Runs of earlier versions carried every message as `messages`; they become the view.
        if not isinstance(data, dict) or "messages" not in data:
            return data
        data = dict(data)
        messages = unpack_messages(data.pop("messages"))
        messages = [Message.model_validate(m) for m in messages]
        data["view"] = {
            "session": [m for m in messages if m.kind in SESSION_KINDS],
            "messages": [m for m in messages if m.kind not in SESSION_KINDS],
        }
        return data


class ContextStatus(BaseModel):
    """The model's context as `status` reports it (and the Web UI and the CLI show it)."""

    max_context_tokens: int
    request_tokens: int
    """The offline estimate of the next request's input tokens."""
    last_request_tokens: int
    """The last model call's input tokens as the provider reported them."""
    last_request_estimate: int
    """What the offline estimate said before that call."""
    layer_tokens: dict[str, int] = Field(default_factory=dict)
    """Estimated tokens per layer: session, summary (with the index), task, step."""
    summary: StructuredSummary | None = None
    index: FoldIndex = Field(default_factory=FoldIndex)
    compactions: list[Compaction] = Field(default_factory=list)
    counters: ContextCounters = Field(default_factory=ContextCounters)
    archive_dir: str = ""
    """Workspace-relative."""
    archive_path: str = ""
    """The same folder as an absolute path on the workers' hosts."""


AgentInput.model_rebuild(_types_namespace={"Carry": Carry})
AgentStatus.model_rebuild(_types_namespace={"ContextStatus": ContextStatus})
