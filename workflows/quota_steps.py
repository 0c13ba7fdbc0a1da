"""Adaptive quotas on the run's state (workflows/quota.py says how they move).

A part of `AgentWorkflow` (workflows/agent.py): each step's end moves the quota and the
compaction level; the model call and the tool calls read them (`Carry.quota`).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options, quota


class QuotaSteps:
    """The step quota and the compaction level, as `AgentWorkflow` moves them."""

    def _adapt_quota(self, step_tokens: int, spike: bool) -> None:
        """After a step: shrink after a spike, loosen after cheap steps, raise the compaction level."""
        step, window = self._carry.step, self._carry.tokens_per_step
        moved = quota.after_step(self._carry.quota, step, step_tokens, window, spike)
        level = quota.compaction_level(self._carry.usage.tokens, self._limits.max_tokens)
        self._carry.quota = quota.with_level(moved, step, level)

    def _compaction_level(self) -> int:
        """The level a compaction runs at now (0 in runs recorded before levels existed)."""
        level = self._carry.quota.compaction_level
        return level if level and self._patched(options.QUOTA_LEVELS_PATCH) else 0
