"""The agent run's tool calls: parsing, approval, execution as activities, livelock
detection, delegation, and their results in the context. A part of `AgentWorkflow`
(workflows/agent.py), whose state it works on.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import limits, options
    from workflows.approval import approval_reason, approval_view
    from workflows.delegation import WAIT_ACTIONS, ParentSide
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled
    from workflows.livelock import LIVELOCK_REPEATS, call_key
    from workflows.skills import (
        already_loaded,
        take_loaded_skill,
    )
    from workflows.tool_specs import RecallArgs, ToolArgumentError, call_summary, parse_tool_call
    from workflows.types import (
        NOT_RUN,
        ApprovalDecision,
        Message,
        PendingApproval,
        Resolution,
        ToolCall,
        ToolCallInput,
        ToolOutcome,
    )


class ToolSteps:
    """A step's tool calls, as `AgentWorkflow` runs them."""

    async def _run_tools(self, calls: list[ToolCall]) -> None:
        runnable = calls[: limits.MAX_TOOL_CALLS_PER_STEP]
        self._carry.usage.tool_calls += len(runnable)
        self._doing = f"running {len(runnable)} tool call(s) (step {self._carry.step})"
        outcomes = await asyncio.gather(*(self._run_tool(call) for call in runnable))
        not_run = ToolOutcome(
            ok=False,
            error=f"{NOT_RUN}a reply may ask for at most {limits.MAX_TOOL_CALLS_PER_STEP} tool calls; "
            f"this one asked for {len(calls):,}. Ask again for the ones you still need.",
        )
        outcomes += [not_run] * (len(calls) - len(runnable))
        skills: list[Message] = []
        for call, outcome in zip(calls, outcomes, strict=True):
            if call.name == "load_skill" and outcome.ok:
                outcome, skill = take_loaded_skill(self._carry.step, call.arguments, outcome, self._carry.loaded_skills)
                skills += [skill] if skill else []
            self._add_tool_result(call, outcome)
        self._carry.view.messages += skills  # after every tool result: the API wants those contiguous

    async def _run_tool(self, call: ToolCall) -> ToolOutcome:
        try:
            args = parse_tool_call(call.name, call.arguments, self._agent.enabled_tools()).model_dump(exclude_none=True)
        except ToolArgumentError as e:
            return ToolOutcome(ok=False, error=f"{NOT_RUN}{e}")
        if call.name == "load_skill" and (repeat := already_loaded(args["name"], self._carry.loaded_skills)):
            return repeat
        key = call_key(call.name, args)
        retry = 0
        while True:
            denial = await self._await_approval(call, args)
            if denial is not None:
                return denial
            outcome = await self._execute_tool(call, args, retry)
            # Identical calls of one reply ran side by side: only a repeat in a later step counts.
            step = self._carry.step if self._patched(options.LIVELOCK_ACROSS_STEPS_PATCH) else None
            streak = self._carry.livelock.record(key, None if outcome.ok else outcome.error, step)
            if streak < LIVELOCK_REPEATS:
                return outcome
            resolution = await self._needs_attention(
                f"{self._carry.step}:{call.id}",
                what=f"{call_summary(call.name, args)} failed {streak} times in a row",
                error=outcome.error or "",
                attempts=streak,
            )
            self._carry.livelock.clear(key)
            if resolution.action == "skip":
                return ToolOutcome(ok=False, error=f"{NOT_RUN}skipped by a person: {resolution.note or 'no note'}")
            retry += 1

    async def _execute_tool(self, call: ToolCall, args: dict[str, Any], retry: int) -> ToolOutcome:
        info = workflow.info()
        # Same key across Temporal's retries (the journal then reports a crashed attempt's
        # result); a new key when a person asks to retry, so the call really runs again.
        key = f"{info.workflow_id}/{self._carry.first_run_id}/{self._carry.step}/{call.id}" + (
            f"/retry-{retry}" if retry else ""
        )
        request = ToolCallInput(
            call_id=call.id,
            idempotency_key=key,
            workspace=self._agent.workspace,
            arguments=args,
            output_chars=self._agent.context.tool_output_chars,
        )
        if self._patched(options.RUN_FILES_PATCH):
            request = request.model_copy(update={"run_folder": self._run_folder(), "step": self._carry.step})
        if call.name == "delegate":
            return await self._delegate(f"{self._carry.step}:{call.id}", key, args)
        if call.name == "run_command":
            request = request.model_copy(update={"sandbox": self._agent.sandbox, "env_allow": self._agent.env_allow})
        try:
            if call.name == "recall":
                return await self._recall(RecallArgs.model_validate(args))
            if call.name in options.LOCAL_TOOLS and self._patched(options.LOCAL_TOOLS_PATCH):
                return await workflow.execute_local_activity(
                    call.name,
                    request,
                    result_type=ToolOutcome,
                    start_to_close_timeout=options.TOOL_START_TO_CLOSE,
                    retry_policy=options.TOOL_RETRY,
                    local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                    summary=call_summary(call.name, args),
                )
            return await workflow.execute_activity(
                call.name,
                request,
                result_type=ToolOutcome,
                start_to_close_timeout=options.tool_start_to_close(call.name, args.get("timeout_s")),
                heartbeat_timeout=options.HEARTBEAT_TIMEOUT,
                retry_policy=options.TOOL_RETRY,
                cancellation_type=options.TOOL_CANCELLATION,
                summary=call_summary(call.name, args),
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return ToolOutcome(ok=False, error=f"{call.name} failed: {failure_message(e)}")

    async def _delegate(self, call_id: str, key: str, args: dict[str, Any]) -> ToolOutcome:
        """A child run for a sub-task (workflows/delegation.py); its spend is charged here.
        A stalled delegate, or a cycle of waits, needs attention as this call (`call_id`)."""

        async def wait_problem(what: str, chain: str) -> Resolution:
            return await self._needs_attention(call_id, what, f"wait chain: {chain}", attempts=1, actions=WAIT_ACTIONS)

        parent = ParentSide(
            agent=self._agent,
            limits=self._limits,
            usage=self._carry.usage,
            elapsed_s=self._usage_now().elapsed_s,
            model=self._carry.model,
        )
        outcome = await self._delegates.run(
            key, args["goal"], args.get("tools"), args.get("budget_share"), parent, wait_problem
        )
        self._publish()
        return outcome

    async def _await_approval(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome | None:
        """Waits for a person when the call is gated; returns the denial, or None to run it."""
        reason = approval_reason(call.name, args, self._agent.approval)
        if reason is None:
            return None
        approval_id = f"{self._carry.step}:{call.id}"
        self._pending_approvals[approval_id] = PendingApproval(
            call_id=approval_id,
            tool=call.name,
            summary=call_summary(call.name, args),
            step=self._carry.step,
            reason=reason,
            shown=approval_view(call.name, args),
        )
        self._publish()
        with self._waiting_for_a_person():
            decision = await self._wait_for_decision(approval_id)
        del self._pending_approvals[approval_id]
        self._publish()
        if decision.approved:
            return None
        return ToolOutcome(ok=False, error=f"{NOT_RUN}denied by a person: {decision.note or 'no reason given'}")

    async def _wait_for_decision(self, approval_id: str) -> ApprovalDecision:
        settings = self._agent.approval
        decided = lambda: approval_id in self._decisions  # noqa: E731
        if settings.timeout_s is None:
            await workflow.wait_condition(decided)
            return self._decisions.pop(approval_id)
        try:
            await workflow.wait_condition(decided, timeout=timedelta(seconds=settings.timeout_s))
        except TimeoutError:
            if settings.on_timeout == "deny":
                note = f"no decision within {settings.timeout_s:g} s"
                return ApprovalDecision(call_id=approval_id, approved=False, note=note)
            self._pause(f"approval of {approval_id} timed out; still waiting for a decision")
            await workflow.wait_condition(decided)
        return self._decisions.pop(approval_id)

    def _add_tool_result(self, call: ToolCall, outcome: ToolOutcome) -> None:
        text = outcome.output if outcome.ok else f"ERROR: {outcome.error}"
        if not outcome.ok and outcome.output:
            text += "\n" + outcome.output
        self._carry.view.messages.append(
            Message(
                role="tool",
                content=text,
                tool_call_id=call.id,
                step=self._carry.step,
                kind="tool_result",
                tool_name=call.name,
            )
        )
