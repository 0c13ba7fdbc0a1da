"""The `plan` tool: the run's task list, kept by the model, durable with the run.

Each call of `plan` with `items` replaces the list (the model sends it whole, as it sees
it); without `items` it returns the list as it stands. The list is workflow state (carried
across continue-as-new in `Carry.plan`, rebuilt on replay from the recorded calls): no
activity runs. Items are `required` (the task is not done without them) or optional; the
degradation ladder's skip rung (workflows/ladder.py, `soft_warning`) marks the optional
items still open `skipped` and tells the model to drop them, and the result's
`unfinished` lists each one skipped.

Pure and deterministic: imported by the workflow.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PlanItemStatus = Literal["pending", "in_progress", "done", "skipped"]
OPEN = ("pending", "in_progress")
MAX_PLAN_ITEMS = 50
"""A plan longer than this is refused: it is shown in every status and sent back whole."""
MAX_ITEM_CHARS = 500


class PlanEntry(BaseModel):
    """One item as the model writes it."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_ITEM_CHARS, description="What the item is, in a line.")
    required: bool = Field(default=True, description="False for optional work, dropped first when budgets run low.")
    status: PlanItemStatus = Field(default="pending", description="pending, in_progress, done or skipped.")


class PlanItem(PlanEntry):
    """One item as the run keeps it."""

    model_config = ConfigDict(extra="ignore")

    skipped_at_step: int | None = None
    """Set when the ladder's skip rung dropped the item (not when the model skipped it)."""


class PlanArgs(BaseModel):
    """The `plan` tool's arguments."""

    model_config = ConfigDict(extra="forbid")

    items: list[PlanEntry] | None = Field(
        default=None,
        max_length=MAX_PLAN_ITEMS,
        description="The whole task list, replacing the previous one; omit to read the list.",
    )


def replaced(current: list[PlanItem], entries: list[PlanEntry]) -> list[PlanItem]:
    """The new list; an item the skip rung dropped keeps that mark while the model leaves it skipped."""
    dropped = {item.text: item.skipped_at_step for item in current if item.skipped_at_step is not None}
    return [
        PlanItem(**entry.model_dump(), skipped_at_step=dropped.get(entry.text) if entry.status == "skipped" else None)
        for entry in entries
    ]


def plan_text(plan: list[PlanItem]) -> str:
    """The list as the model (and `status`) reads it."""
    if not plan:
        return "The plan is empty."
    done = sum(item.status == "done" for item in plan)
    lines = [f"Plan ({len(plan)} items, {done} done):"]
    for number, item in enumerate(plan, 1):
        kind = "required" if item.required else "optional"
        lines.append(f"{number}. [{item.status}] {item.text} ({kind})")
    return "\n".join(lines)


def drop_optional(plan: list[PlanItem], step: int) -> tuple[list[PlanItem], list[PlanItem]]:
    """The plan with its open optional items skipped, and those items."""
    dropped: list[PlanItem] = []
    kept: list[PlanItem] = []
    for item in plan:
        if not item.required and item.status in OPEN:
            item = item.model_copy(update={"status": "skipped", "skipped_at_step": step})
            dropped.append(item)
        kept.append(item)
    return kept, dropped


def skip_text(dropped: list[PlanItem]) -> str:
    """What the model is told at the skip rung."""
    items = "\n".join(f"- {item.text}" for item in dropped)
    return (
        "Budgets are running low: drop the optional work still open in your plan. These items are now "
        f"marked skipped:\n{items}\nFinish the required items, then answer."
    )


def unfinished_lines(plan: list[PlanItem], completed: bool) -> list[str]:
    """The result's `unfinished`: each item skipped, and, when the run did not complete, each
    required item not done."""
    lines = [
        f"plan item skipped ({'required' if i.required else 'optional'}): {i.text}"
        for i in plan
        if i.status == "skipped"
    ]
    if not completed:
        lines += [f"plan item not done (required): {i.text}" for i in plan if i.required and i.status in OPEN]
    return lines
