"""The agent run's messages: the contract's signals, updates and queries (DESIGN.md section 4)
and the internal `child_report` and `model_context`. A part of `AgentWorkflow`
(workflows/agent.py), whose state they read and change.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from workflows import compaction, context_handoff, limits
    from workflows.state import ContextStatus
    from workflows.types import (
        AgentStatus,
        ApprovalDecision,
        ChildReport,
        Limits,
        LimitsPatch,
        Message,
        ModelContext,
        ModelContextRequest,
        PauseRequest,
        Resolution,
        TranscriptRequest,
        UserMessage,
        WaitLink,
        WatchRequest,
    )
    from workflows.validation_text import validation_text
    from workflows.wait_graph import wait_chains


_M = TypeVar("_M", bound=BaseModel)

SIGNALS = ("pause", "resume", "add_message")
"""The signals a person sends; `watch` (from `run` and `watch`) and `child_report` are the tools' own."""
IGNORED_SIGNALS_KEPT = 10


class RunControl:
    """Signals, updates and queries of `AgentWorkflow`."""

    # Signals take the raw payload and decode it here: a malformed one from the Temporal
    # CLI (which reports success either way) is recorded in `status`, never dropped unseen.

    @workflow.signal(name="pause")
    def pause(self, raw: Any = None) -> None:
        reason = None
        try:
            reason = PauseRequest.model_validate({"reason": raw} if isinstance(raw, str) else raw or {}).reason
        except ValidationError as e:
            self._ignore_signal(f"pause: payload not understood ({validation_text(e)}); paused without a reason")
        reason = reason or "paused by a person"
        self._pause(reason)
        self._delegates.forward("pause", PauseRequest(reason=f"parent {workflow.info().workflow_id} paused: {reason}"))

    @workflow.signal(name="resume")
    def resume(self, raw: Any = None) -> None:
        self._carry.paused = False
        self._carry.paused_reason = None
        self._publish()
        self._delegates.forward("resume")

    @workflow.signal(name="child_report")
    def child_report(self, raw: Any = None) -> None:
        """Sent by this run's delegates (workflows/delegation.py) when they change."""
        try:
            report = ChildReport.model_validate(raw)
        except ValidationError as e:
            self._ignore_signal(f"child_report ignored: {validation_text(e)}")
            return
        self._delegates.receive(report)
        self._publish()

    @workflow.signal(name="add_message")
    def add_message(self, raw: Any = None) -> None:
        try:
            message = UserMessage.model_validate({"text": raw} if isinstance(raw, str) else raw)
        except ValidationError as e:
            self._ignore_signal(f'add_message ignored: {validation_text(e)} (expected {{"text": "..."}})')
            return
        self._carry.pending_user_messages.append(message.text)

    @workflow.signal(name="watch")
    def watch(self, raw: Any = None) -> None:
        """Sent by `durable-agent run` and `watch` while they follow the run (not recorded
        beyond the signal itself: the lease is not carried across continue-as-new)."""
        try:
            lease = WatchRequest.model_validate(raw or {})
        except ValidationError as e:
            self._ignore_signal(f'watch ignored: {validation_text(e)} (expected {{"for_s": 1-3600}})')
            return
        self._watched_until = workflow.now() + timedelta(seconds=lease.for_s)

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._ignore_signal(f"unknown signal {name!r} ignored; this run takes {', '.join(SIGNALS)}")

    def _ignore_signal(self, note: str) -> None:
        workflow.logger.warning(note)
        self._ignored_signals = [*self._ignored_signals, note][-IGNORED_SIGNALS_KEPT:]

    # Updates take the raw payload and decode it in the validator: a malformed payload from
    # the Temporal CLI is then rejected with pydantic's message, not "failed decoding".

    @workflow.update(name="approve")
    def approve(self, raw: Any) -> str:
        decision = ApprovalDecision.model_validate(raw)
        self._decisions[decision.call_id] = decision
        return f"{decision.call_id} {'approved' if decision.approved else 'denied'}"

    @approve.validator
    def _validate_approve(self, raw: Any) -> None:
        decision = _decode(ApprovalDecision, raw)
        if decision.call_id not in self._pending_approvals:
            pending = ", ".join(self._pending_approvals) or "none"
            raise ValueError(f"no pending approval {decision.call_id!r}; pending: {pending}")
        if decision.call_id in self._decisions:
            raise ValueError(f"approval {decision.call_id!r} was already decided")

    @workflow.update(name="raise_limits")
    def raise_limits(self, raw: Any) -> Limits:
        self._limits = LimitsPatch.model_validate(raw or {}).apply_to(self._limits)
        self._carry.warned = [b for b in self._carry.warned if b in limits.soft_tier(self._spend(), self._limits)]
        self._publish()
        return self._limits

    @raise_limits.validator
    def _validate_raise_limits(self, raw: Any) -> None:
        patch = _decode(LimitsPatch, raw or {})
        try:
            patch.apply_to(self._limits)
        except ValidationError as e:
            raise ValueError(validation_text(e)) from None

    @workflow.update(name="resolve")
    def resolve(self, raw: Any) -> str:
        resolution = Resolution.model_validate(raw)
        calls = [resolution.call_id] if resolution.call_id else self._unresolved()
        for call_id in calls:
            self._resolutions[call_id] = resolution
        return f"resolved {', '.join(calls)} with {resolution.action}"

    @resolve.validator
    def _validate_resolve(self, raw: Any) -> None:
        resolution = _decode(Resolution, raw)
        if not self._attention:
            raise ValueError(f"the run does not need attention (state: {self._state()})")
        open_reports = self._unresolved()
        if resolution.call_id is None and not open_reports:
            raise ValueError("every attention report was already resolved")
        if resolution.call_id is not None and resolution.call_id not in open_reports:
            known = ", ".join(open_reports) or "none"
            raise ValueError(f"no open attention report for call {resolution.call_id!r}; open: {known}")

    def _unresolved(self) -> list[str]:
        return [call_id for call_id in self._attention if call_id not in self._resolutions]

    @workflow.query(name="status")
    def status(self) -> AgentStatus:
        # Live: workflow.now() stands still between workflow tasks (during a model call, a
        # command, a wait). A query changes nothing, so reading the clock here is safe.
        with workflow.unsafe.sandbox_unrestricted():
            now = datetime.now(UTC)
        return self._status(max(now, workflow.now()))

    def _status(self, now: datetime | None = None) -> AgentStatus:
        spend = self._spend(now) if self._input else limits.Spend(0, self._carry.usage, 0.0)
        return AgentStatus(
            state=self._state() if self._input else "starting",
            step=self._carry.step,
            model=self._carry.model,
            agent=self._agent_label(),
            usage=self._result.usage if self._result else spend.usage,
            limits=self._limits,
            pending_approvals=list(self._pending_approvals.values()),
            attention=next(iter(self._attention.values()), None),
            attention_reports=list(self._attention.values()),
            paused_reason=self._carry.paused_reason if self._carry.paused else None,
            degradations=self._carry.degradations,
            soft_tier=limits.soft_tier(spend, self._limits) if self._input else [],
            runway=limits.runway(spend, self._limits),
            activity=self._activity(),
            ignored_signals=self._ignored_signals,
            result=self._result,
            context=self._context_status() if self._input else None,
            children=list(self._delegates.running.values()),
            wait_chains=self._wait_chains() if self._input else [],
            tool_waits=[f"waiting for a worker with tool {t} since {since}" for t, since in self._tool_waits.items()],
            plan=self._carry.plan,
            quota=self._carry.quota,
            host=self._input.host if self._input else None,
            host_wait=self._host_wait_text() if self._input else None,
            host_moves=self._moves,
        )

    def _agent_label(self) -> str | None:
        """`name (file)` once the agent file is read; its bare name until then."""
        name = self._input.agent if self._input else None
        return f"{name} ({self._carry.agent_file})" if name and self._carry.agent_file else name

    def _wait_chains(self) -> list[list[WaitLink]]:
        return wait_chains(
            workflow.info().workflow_id,
            self._state(),
            list(self._pending_approvals.values()),
            list(self._attention.values()),
            self._carry.paused_reason if self._carry.paused else None,
            list(self._delegates.running.values()),
        )

    @workflow.query(name="transcript")
    def transcript(self, request: TranscriptRequest | None = None) -> list[Message]:
        """Every message by step. Steps folded in earlier runs of the chain are in the archive:
        one `archived` entry says where (`durable-agent export` puts them back in place)."""
        from_step = request.from_step if request else 0
        view = self._carry.view
        first_here = self._folded[0].step if self._folded else compaction.first_unfolded(view)
        earlier = compaction.archived_note(self._carry.archive_dir, first_here - 1)
        messages = [*view.session, *([earlier] if earlier else []), *self._folded, *view.messages]
        return [m for m in messages if m.step >= from_step]

    def _context_status(self) -> ContextStatus:
        view, settings = self._carry.view, self._agent.context
        return ContextStatus(
            max_context_tokens=settings.max_context_tokens,
            request_tokens=self._request_tokens(),
            last_request_tokens=self._carry.last_input_tokens,
            last_request_estimate=self._carry.last_estimate,
            layer_tokens=compaction.layer_tokens(view, self._carry.step, settings.keep_recent_steps),
            summary=view.summary,
            index=view.index,
            compactions=self._carry.compactions,
            counters=self._carry.context,
            archive_dir=self._carry.archive_dir,
            archive_path=f"{self._agent.workspace}/{self._carry.archive_dir}",
        )

    @workflow.query(name=context_handoff.MODEL_CONTEXT_QUERY)
    def in_flight_context(self, raw: Any) -> ModelContext:
        """The in-flight model call's messages, for a `call_model` attempt that did not find
        them in its worker's cache: a page at a time, as a query's answer is refused over 2 MB.
        The argument is decoded here, so that a malformed one says what is wrong."""
        request = _decode(ModelContextRequest, raw)
        if self._in_flight is None or self._in_flight.ref != request.call():
            raise ValueError("no model call with this context is in flight")
        if request.first_message is None:
            return self._in_flight
        page, next_message = context_handoff.context_page(self._in_flight.messages, request.first_message)
        return ModelContext(ref=self._in_flight.ref, messages=page, next_message=next_message)


def _decode(model: type[_M], raw: Any) -> _M:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ValueError(validation_text(e)) from None
