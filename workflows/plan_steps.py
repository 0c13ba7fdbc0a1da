"""The `plan` tool and the skip rung, on the run's state (workflows/plan.py says what they do).

A part of `AgentWorkflow` (workflows/agent.py): the tool is answered in the workflow from
its own state, with no activity, so the plan is exactly what the recorded calls made it.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.plan import PlanArgs, drop_optional, plan_text, replaced, skip_text
    from workflows.types import Degradation, ToolOutcome


class PlanSteps:
    """The run's task list, as `AgentWorkflow` keeps it."""

    def _plan_tool(self, args: dict[str, Any]) -> ToolOutcome:
        request = PlanArgs.model_validate(args)  # validated already: the tool's arguments
        if request.items is not None:
            self._carry.plan = replaced(self._carry.plan, request.items)
            self._publish()
        return ToolOutcome(ok=True, output=plan_text(self._carry.plan))

    def _skip_optional(self) -> None:
        """The ladder's skip rung (with its wrap-up warning): the open optional items are dropped."""
        self._carry.plan, dropped = drop_optional(self._carry.plan, self._carry.step)
        if not dropped:
            return
        self._add_message("system", skip_text(dropped), kind="warning")  # sent to the model
        detail = "dropped: " + "; ".join(item.text for item in dropped)
        self._carry.degradations.append(Degradation(step=self._carry.step, kind="skip_optional", detail=detail[:500]))
