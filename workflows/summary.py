"""The five-field structured summary: goal, inputs, outputs, key decisions, open issues.

One model for every summary of work done: what compaction folds older steps into
(workflows/compaction.py) and what a finished run reports in its result, which is what a
delegate's parent receives (workflows/delegation.py). No imports: every module may use it.
"""

from __future__ import annotations

from pydantic import BaseModel


class StructuredSummary(BaseModel):
    """What steps amounted to: the five fields the model must fill."""

    goal: str
    inputs: list[str]
    outputs: list[str]
    key_decisions: list[str]
    open_issues: list[str]
