"""The agent run's context steps: fitting the context, compaction into a summary and an
index, the archive of folded steps, and `recall`. A part of `AgentWorkflow`
(workflows/agent.py), whose state it works on; the policies are in workflows/compaction.py.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import compaction, options, quota
    from workflows.context import (
        calibrated,
        estimate_tokens,
    )
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled
    from workflows.state import Compaction, StructuredSummary
    from workflows.tool_specs import RecallArgs, call_summary
    from workflows.types import (
        ArchiveWrite,
        ArchiveWritten,
        Degradation,
        Message,
        RecallInput,
        ToolOutcome,
    )


class ContextSteps:
    """Compaction and recall, as `AgentWorkflow` runs them."""

    def _request_tokens(self) -> int:
        """The next request's input tokens: the offline estimate, calibrated by the last report."""
        raw = estimate_tokens(compaction.request_messages(self._carry.view))
        return calibrated(raw, self._carry.last_estimate, self._carry.last_input_tokens)

    async def _fit_context(self) -> None:
        if compaction.should_compact(self._request_tokens(), self._agent.context.max_context_tokens):
            await self._compact("size")

    async def _compact(self, trigger: Any) -> None:
        """Fold older steps into the summary and the index, archive them, keep the rest."""
        view, settings = self._carry.view, self._agent.context
        before = self._request_tokens()
        recent = quota.keep_recent(settings.keep_recent_steps, self._compaction_level())  # fewer as tokens run out
        keep = compaction.steps_to_keep(view, self._carry.step, recent, settings.max_context_tokens)
        fold = compaction.plan_fold(view.messages, self._carry.step, keep)
        if not fold.steps:
            if trigger == "soft_tier":
                self._degrade("compaction", f"nothing to fold yet (~{before:,} tokens in context)")
            return
        self._doing = f"compacting steps {fold.steps[0]}-{fold.steps[-1]}"
        summary, source, spent = await self._summarize(fold.folded)
        if not await self._archive(fold.steps[0], fold.steps[-1], fold.folded):
            return
        view.summary = summary
        index_chars = compaction.index_chars(settings.max_context_tokens)
        view.index = compaction.add_to_index(view.index, compaction.index_steps(fold.folded), index_chars)
        view.messages = fold.kept
        self._folded += fold.folded
        record = Compaction(
            step=self._carry.step,
            first_step=fold.steps[0],
            last_step=fold.steps[-1],
            trigger=trigger,
            summary_source=source,
            tokens_before=before,
            tokens_after=self._request_tokens(),
            summary_tokens=spent,
        )
        self._carry.compactions = (self._carry.compactions + [record])[-compaction.COMPACTIONS_SHOWN :]
        counters = self._carry.context
        counters.compactions += 1
        counters.folded_steps += len(fold.steps)
        counters.summary_tokens += spent
        counters.extractive_summaries += source == "extractive"
        view.messages.append(compaction.compaction_note(record, view))
        if trigger == "soft_tier":
            self._carry.degradations.append(
                Degradation(step=self._carry.step, kind="compaction", detail=compaction.record_text(record))
            )

    async def _summarize(self, folded: list[Message]) -> tuple[StructuredSummary, Any, int]:
        """The model's merged 5-field summary; a malformed one is asked for once more, then
        replaced by the extractive summary. A failing model call also falls back."""
        previous = self._carry.view.summary
        request = compaction.summary_request(previous, folded, self._agent.goal)
        share = quota.summary_share(self._compaction_level())  # shorter as tokens run out
        max_chars = int(compaction.summary_chars(self._agent.context.max_context_tokens) * share)
        spent = 0
        for source in ("model", "model_retry"):
            try:
                reply = await self._execute_model_call(request, tools=[], summary="summarise folded steps")
            except ACTIVITY_FAILED as e:
                raise_if_cancelled(e)
                break
            self._charge(reply)
            spent += reply.input_tokens + reply.output_tokens
            try:
                return compaction.parse_summary(reply.content, max_chars), source, spent
            except ValueError as e:
                request = compaction.retry_request(request, reply.content, str(e))
        return compaction.extractive_summary(previous, folded, self._agent.goal, max_chars), "extractive", spent

    async def _archive(self, first_step: int, last_step: int, messages: list[Message]) -> bool:
        try:
            written = await self._on_host_or_local(
                "archive_steps",
                ArchiveWrite(
                    workspace=self._agent.workspace,
                    archive_dir=self._carry.archive_dir,
                    first_step=first_step,
                    last_step=last_step,
                    messages=messages,
                ),
                result_type=ArchiveWritten,
                start_to_close_timeout=options.TOOL_START_TO_CLOSE,
                retry_policy=options.TOOL_RETRY,
                local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                summary=f"archive_steps: {first_step}-{last_step}",
            )
        except ActivityError as e:
            raise_if_cancelled(e)
            self._degrade("compaction", f"not folded: the archive could not be written ({failure_message(e)})")
            return False
        self._carry.archived_through = max(self._carry.archived_through, last_step)
        if written.not_archived:
            self._degrade("compaction", written.not_archived)
        return written.messages == len(messages)

    async def _archive_rest(self) -> None:
        """At the end of a run that folded steps, the steps never folded join the archive:
        it then holds the whole transcript past the session layer, whatever retention later
        deletes. A run that never folded has its whole transcript in its last history."""
        rest = [m for m in self._carry.view.messages if m.step > self._carry.archived_through]
        if not self._carry.archived_through or not rest or not self._patched(options.ARCHIVE_AT_END_PATCH):
            return
        await self._archive(rest[0].step, self._carry.step, rest)

    async def _recall(self, args: RecallArgs) -> ToolOutcome:
        steps = args.step_range()
        request = RecallInput(
            workspace=self._agent.workspace,
            archive_dir=self._carry.archive_dir,
            first_step=steps[0] if steps else None,
            last_step=steps[1] if steps else None,
            query=args.query,
            in_context_from=self._carry.view.index.folded_through + 1,
            output_chars=compaction.recall_chars(self._agent.context),
        )
        return await self._on_host_or_local(
            "recall",
            request,
            result_type=ToolOutcome,
            start_to_close_timeout=options.TOOL_START_TO_CLOSE,
            retry_policy=options.TOOL_RETRY,
            local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
            summary=call_summary("recall", args.model_dump(exclude_none=True)),
        )
