"""The agent run's tool calls: parsing, approval, execution as activities, livelock
detection, delegation, and their results in the context. A part of `AgentWorkflow`
(workflows/agent.py), whose state it works on.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.redaction import Redactor
    from workflows import limits, options
    from workflows.approval import approval_reason, approval_view
    from workflows.delegation import WAIT_ACTIONS, ParentSide
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled, timed_out, worker_lost
    from workflows.livelock import LIVELOCK_REPEATS, call_key
    from workflows.shell import remember_shell, with_shell
    from workflows.skills import (
        already_loaded,
        take_loaded_skill,
    )
    from workflows.tool_catalog import CatalogRequest, ToolCatalog, ToolSpec
    from workflows.tool_specs import RecallArgs, ToolArgumentError, call_summary, decode_arguments, parse_tool_call
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


OUTCOME_UNKNOWN = (
    "the outcome is unknown: the worker running {tool} stopped before it reported ({error}). The call "
    "may or may not have taken effect, and it was not run again; check its effect before repeating it"
)


SHAPES_ONLY = Redactor({})
"""Token shapes (API keys, private keys, bearer tokens): pure, so the workflow may apply it."""


def activity_outcome(raw: Any, budget_chars: int) -> ToolOutcome:
    """An activity tool's result: a `ToolOutcome`-shaped object (`{"ok", "output", "error"}`),
    or any other value, shown as text; capped to the run's tool output budget, head and tail,
    and redacted of token shapes before the model sees it. (Its activity result in history is
    as the other worker sent it: only that worker knows its own secrets.)"""
    try:
        outcome = ToolOutcome.model_validate(raw) if isinstance(raw, dict) and "ok" in raw else None
    except ValidationError:
        outcome = None
    if outcome is None:
        text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
        outcome = ToolOutcome(ok=True, output=text)
    for field in ("output", "error"):
        text = getattr(outcome, field) or ""
        if len(text) > budget_chars:
            keep = budget_chars // 2
            cut = f"{text[:keep]}\n… {len(text):,} characters total, {len(text) - 2 * keep:,} cut …\n{text[-keep:]}"
            outcome = outcome.model_copy(update={field: cut})
    return SHAPES_ONLY.value(outcome)


class ToolSteps:
    """A step's tool calls, as `AgentWorkflow` runs them."""

    def _catalog_specs(self) -> dict[str, ToolSpec]:
        """The run's tools beyond the built-ins: its `activity_tools` and its resolved catalog."""
        specs = {t.name: ToolSpec.of_activity(t) for t in self._agent.activity_tools}
        return {**specs, **{s.name: s for s in self._carry.catalog or []}}

    async def _resolve_tools(self) -> None:
        """Once per chain: the workers' specs of the tools the run names beyond the built-ins,
        recorded in history; a name no worker offers closes the run, before any model call."""
        names = self._agent.tools_to_resolve()
        if self._carry.catalog is not None or not names:
            return
        self._doing = "resolving tools"
        try:
            catalog: ToolCatalog = await workflow.execute_local_activity(
                "tool_catalog",
                CatalogRequest(names=names),
                result_type=ToolCatalog,
                start_to_close_timeout=options.CATALOG_TIMEOUT,
                retry_policy=options.TOOL_RETRY,
                summary=f"tool_catalog: {', '.join(names)}"[:120],
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            raise ApplicationError(
                f"the run's tools could not be resolved: {failure_message(e)}", type="UnknownTool", non_retryable=True
            ) from None
        if catalog.unknown:
            raise ApplicationError(
                f"unknown tool(s) {catalog.unknown}: no worker offers them (load their module with "
                "DURABLE_AGENT_TOOLS, `durable-agent worker --tools MODULE` or DurableAgentPlugin(tools=...)), "
                "and they are not in activity_tools",
                type="UnknownTool",
                non_retryable=True,
            )
        self._carry.catalog = catalog.tools

    async def _call_catalog_tool(self, spec: ToolSpec, request: ToolCallInput, args: dict[str, Any]) -> ToolOutcome:
        """A user's tool or an activity tool: its activity on its task queue. While no worker
        polls that queue the run waits, saying so, and goes on when one does."""
        waiting_since: str | None = None
        while True:
            try:
                raw = await workflow.execute_activity(
                    spec.activity_type(),
                    request,
                    # Another team's worker answers in its own words: read by `activity_outcome`.
                    result_type=ToolOutcome if spec.source == "python" else None,
                    task_queue=spec.task_queue,
                    schedule_to_start_timeout=options.TOOL_WORKER_WAIT,
                    start_to_close_timeout=timedelta(seconds=spec.timeout_s or options.USER_TOOL_TIMEOUT_S),
                    # Our Python tools beat in the background; another team's worker may not.
                    heartbeat_timeout=options.HEARTBEAT_TIMEOUT if spec.source == "python" else None,
                    retry_policy=options.catalog_tool_retry(spec.effect, spec.retries),
                    cancellation_type=options.TOOL_CANCELLATION,
                    summary=call_summary(spec.name, args),
                )
            except ACTIVITY_FAILED as e:
                raise_if_cancelled(e)
                if timed_out(e, "SCHEDULE_TO_START"):
                    waiting_since = waiting_since or workflow.now().isoformat(timespec="seconds")
                    self._tool_waits[spec.name] = waiting_since
                    self._doing = f"waiting for a worker with tool {spec.name} since {waiting_since}"
                    self._publish()
                    continue
                self._tool_waits.pop(spec.name, None)
                if spec.effect == "write" and worker_lost(e):
                    return ToolOutcome(ok=False, error=OUTCOME_UNKNOWN.format(tool=spec.name, error=failure_message(e)))
                return ToolOutcome(ok=False, error=f"{spec.name} failed: {failure_message(e)}")
            self._tool_waits.pop(spec.name, None)
            outcome = raw if isinstance(raw, ToolOutcome) else activity_outcome(raw, request.output_chars)
            self._charge_tool(spec)
            if outcome.cached_from is not None:
                detail = f"{call_summary(spec.name, args)}: answered from its cache of {outcome.cached_from}"
                self._degrade("cached_tool_result", detail)
            return outcome

    def _charge_tool(self, spec: ToolSpec) -> None:
        if not spec.cost_usd:
            return
        usage = self._carry.usage
        usage.cost_usd += spec.cost_usd
        usage.tool_costs[spec.name] = usage.tool_costs.get(spec.name, 0.0) + spec.cost_usd

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
        enabled = self._agent.enabled_tools()
        try:
            if call.name in self._catalog_specs():
                args = decode_arguments(call.name, call.arguments, enabled)
            else:
                args = parse_tool_call(call.name, call.arguments, enabled).model_dump(exclude_none=True)
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
            remember_shell(self._carry, outcome)
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
            request = with_shell(request, self._agent, self._carry, self._patched)
        if (spec := self._catalog_specs().get(call.name)) is not None:
            return await self._call_catalog_tool(spec, request.model_copy(update={"step": self._carry.step}), args)
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
            key, args["goal"], args.get("tools"), args.get("budget_share"), args.get("agent"), parent, wait_problem
        )
        self._publish()
        return outcome

    async def _await_approval(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome | None:
        """Waits for a person when the call is gated; returns the denial, or None to run it."""
        reason = approval_reason(call.name, args, self._agent.approval)
        spec = self._catalog_specs().get(call.name)
        if reason is None and spec is not None and spec.approval:
            reason = f"{call.name} asks for approval of every call"
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
