"""Adaptive quotas: how much one step may spend, from the run's own moving average.

A run's per-step quota (tokens a step may add: the model's reply and the tool output that
goes back into the context) starts at `DEFAULT_STEP_QUOTA`. A step that costs more than
twice the moving average of the steps before it (limits.is_spike) shrinks the quota of the
next steps in proportion to the excess: quota × (2 × average / step's tokens). Three steps
in a row under the average loosen it halfway back toward the default. The quota is applied
as the model call's `max_tokens` (sent only while below the default) and as the tool output
cap (the context's `tool_output_chars`, scaled by quota / default).

Compaction gets harder as the run's tokens run out: at 50 %, 25 % and 10 % of
`limits.max_tokens` left (levels 1-3) a compaction keeps fewer recent steps and writes a
shorter summary.

Every change is recorded (`QuotaChange`, the latest `CHANGES_KEPT` carried across
continue-as-new) and shown in `status`. Pure and deterministic: imported by the workflow.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

DEFAULT_STEP_QUOTA = 4_000
"""Tokens per step before any spike: above any agent step's usual reply, so a run that
never spikes sends no `max_tokens` and keeps its full tool output cap."""
MIN_STEP_QUOTA = 256
"""The quota never shrinks below this: a reply must still fit a tool call or a short answer."""
MIN_OUTPUT_CHARS = 500
"""The smallest tool output cap (the context settings' own minimum)."""
CHEAP_STEPS_TO_LOOSEN = 3
SNAP_TO_DEFAULT = 0.95
"""A loosened quota this close to the default becomes the default."""
CHANGES_KEPT = 20

LEVELS: tuple[tuple[float, float, float], ...] = (
    (0.50, 0.5, 0.5),
    (0.25, 0.34, 0.25),
    (0.10, 0.17, 0.125),
)
"""(tokens left below this fraction, share of keep_recent_steps kept, share of the summary's
size), for compaction levels 1, 2 and 3."""


class QuotaChange(BaseModel):
    """One change of the step quota or of the compaction level, as status shows it."""

    step: int
    kind: Literal["shrunk", "loosened", "compaction_level"]
    quota: int
    """Tokens per step after the change (for a compaction level: the level, 1-3)."""
    step_tokens: int = 0
    average: int = 0
    """The moving average the step was compared with."""


class Quota(BaseModel):
    """The run's quota state, carried across continue-as-new."""

    tokens_per_step: int = DEFAULT_STEP_QUOTA
    cheap_streak: int = 0
    """Steps in a row under the moving average since the last change."""
    compaction_level: int = Field(default=0, ge=0, le=len(LEVELS))
    changes: list[QuotaChange] = Field(default_factory=list)
    """The latest changes, oldest first (at most `CHANGES_KEPT`)."""

    def max_tokens(self) -> int | None:
        """The model call's `max_tokens`: None (the endpoint's own) until the quota shrinks."""
        return self.tokens_per_step if self.tokens_per_step < DEFAULT_STEP_QUOTA else None

    def output_chars(self, configured: int) -> int:
        """The tool output cap for the current quota."""
        return max(MIN_OUTPUT_CHARS, min(configured, configured * self.tokens_per_step // DEFAULT_STEP_QUOTA))

    def text(self) -> str | None:
        """`quota: 2,400 tokens/step, shrunk at step 31`; None while it never changed."""
        moves = [c for c in self.changes if c.kind != "compaction_level"]
        if not moves:
            return None
        return f"quota: {self.tokens_per_step:,} tokens/step, {moves[-1].kind} at step {moves[-1].step}"


def after_step(quota: Quota, step: int, step_tokens: int, previous: list[int], spike: bool) -> Quota:
    """The quota after a step that cost `step_tokens`; `previous`: the steps before it (the
    moving window), `spike`: it cost over twice their average (limits.is_spike)."""
    if not previous:
        return quota
    average = sum(previous) / len(previous)
    if spike:
        shrunk = max(MIN_STEP_QUOTA, math.floor(quota.tokens_per_step * 2 * average / step_tokens))
        if shrunk < quota.tokens_per_step:  # at the floor already: nothing changes, nothing recorded
            return _changed(quota, step, "shrunk", shrunk, step_tokens, average)
        return quota.model_copy(update={"cheap_streak": 0})
    if step_tokens >= average or quota.tokens_per_step >= DEFAULT_STEP_QUOTA:
        return quota.model_copy(update={"cheap_streak": 0})
    streak = quota.cheap_streak + 1
    if streak < CHEAP_STEPS_TO_LOOSEN:
        return quota.model_copy(update={"cheap_streak": streak})
    loosened = quota.tokens_per_step + (DEFAULT_STEP_QUOTA - quota.tokens_per_step) // 2
    if loosened >= DEFAULT_STEP_QUOTA * SNAP_TO_DEFAULT:
        loosened = DEFAULT_STEP_QUOTA
    return _changed(quota, step, "loosened", loosened, step_tokens, average)


def _changed(quota: Quota, step: int, kind: str, value: int, step_tokens: int, average: float) -> Quota:
    change = QuotaChange(step=step, kind=kind, quota=value, step_tokens=step_tokens, average=round(average))
    changes = [*quota.changes, change][-CHANGES_KEPT:]
    return quota.model_copy(update={"tokens_per_step": value, "cheap_streak": 0, "changes": changes})


def compaction_level(tokens_used: int, max_tokens: int) -> int:
    """0 while more than half the token budget is left; 1-3 as it falls (`LEVELS`)."""
    left = max(0.0, 1 - tokens_used / max_tokens)
    return sum(1 for threshold, _, _ in LEVELS if left < threshold)


def with_level(quota: Quota, step: int, level: int) -> Quota:
    """The quota with a higher compaction level, recorded; levels never go back down."""
    if level <= quota.compaction_level:
        return quota
    change = QuotaChange(step=step, kind="compaction_level", quota=level)
    changes = [*quota.changes, change][-CHANGES_KEPT:]
    return quota.model_copy(update={"compaction_level": level, "changes": changes})


def keep_recent(keep_recent_steps: int, level: int) -> int:
    """Recent steps a compaction keeps verbatim at `level`."""
    if level == 0:
        return keep_recent_steps
    return max(1, math.floor(keep_recent_steps * LEVELS[level - 1][1]))


def summary_share(level: int) -> float:
    """The share of the summary's usual size it may take at `level`."""
    return 1.0 if level == 0 else LEVELS[level - 1][2]
