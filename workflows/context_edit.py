"""Update `edit_context` (seed §4.3, DESIGN.md §4b): a person changes what the model will be
sent, on a paused or needs-attention run. A part of `AgentWorkflow` (workflows/agent.py).

Drop an unfolded step (its reply and tool results go together: the API wants each tool
result after the call that asked for it), replace the text of one unfolded message (a
poisoned tool output, a wrong instruction), or force a compaction. The update and its payload
(who, what) are in history; a user message of kind `edit` says what was done, to the model
and in `export`, without repeating the removed text.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError, model_validator
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.types import Message
    from workflows.validation_text import validation_text

EDIT_KIND = "edit"
EDITABLE_STATES = ("paused", "needs_attention")


class ContextEdit(BaseModel):
    drop_step: int | None = None
    replace_message: int | None = None
    """0-based index among the unfolded messages (the session layer, summary and index not counted)."""
    text: str | None = None
    compact: bool = False
    by: str = "a person"

    @model_validator(mode="after")
    def _one_action(self) -> ContextEdit:
        actions = [self.drop_step is not None, self.replace_message is not None, self.compact]
        if sum(actions) != 1:
            raise ValueError("give exactly one of drop_step, replace_message (with text), compact")
        if self.replace_message is not None and self.text is None:
            raise ValueError("replace_message needs text")
        return self


class ContextEditing:
    @workflow.update(name="edit_context")
    async def edit_context(self, raw: Any) -> str:
        edit = ContextEdit.model_validate(raw)
        messages = self._carry.view.messages
        if edit.compact:
            folded_before = self._carry.context.folded_steps
            await self._compact("person")
            done = f"forced a compaction ({self._carry.context.folded_steps - folded_before} step(s) folded)"
        elif edit.drop_step is not None:
            dropped = lambda m: m.step == edit.drop_step and m.role in ("assistant", "tool")  # noqa: E731
            self._carry.view.messages = [m for m in messages if not dropped(m)]
            done = f"dropped step {edit.drop_step} (its reply and tool results)"
        else:
            target = messages[edit.replace_message]
            messages[edit.replace_message] = target.model_copy(update={"content": edit.text})
            done = f"replaced message {edit.replace_message} ({target.role}, step {target.step}) with its text"
        self._add_message("user", f"{edit.by} edited the context: {done}.", kind=EDIT_KIND)
        self._publish()
        return done

    @edit_context.validator
    def _validate_edit_context(self, raw: Any) -> None:
        try:
            edit = ContextEdit.model_validate(raw)
        except ValidationError as e:
            raise ValueError(validation_text(e)) from None
        if self._input is None or self._state() not in EDITABLE_STATES:
            raise ValueError(f"the context is edited on a paused or needs-attention run (state: {self._state()})")
        if not self._waiting:  # paused, but its step's tool calls still run: their results are yet to come
            raise ValueError(f"step {self._carry.step} is still running; edit once the run waits before the next step")
        messages: list[Message] = self._carry.view.messages
        if edit.drop_step is not None and not any(m.step == edit.drop_step and m.role == "assistant" for m in messages):
            unfolded = sorted({m.step for m in messages if m.role == "assistant"})
            raise ValueError(f"step {edit.drop_step} is not an unfolded step; unfolded: {unfolded or 'none'}")
        if edit.replace_message is not None and not 0 <= edit.replace_message < len(messages):
            raise ValueError(f"no unfolded message {edit.replace_message}; there are {len(messages)} (0-based)")
