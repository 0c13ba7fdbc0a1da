"""`AgentWorkflow`: the agent loop, whose event history is its checkpoint.

One step = one `call_model` activity plus the tool activities it asked for (run
concurrently). Every decision here is deterministic and made from recorded results:
limits, approvals, pauses, needs-attention and continue-as-new. All I/O is in activities.

Here: the run from start to close, its limits, the model call, waits for a person, what
it publishes, continue-as-new. Its other parts work on the same state, one concern each:
the tool calls (workflows/tool_steps.py), the context's compaction and recall
(workflows/context_steps.py) and the signals, updates and queries (workflows/control.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from workflows import compaction, context_handoff, limits, options
    from workflows.agents import AgentDefinition, AgentFileError, AgentRequest, effective_input
    from workflows.context import (
        WireContext,
        estimate_tokens,
        initial_messages,
        last_answer,
        progress_summary,
    )
    from workflows.context_edit import ContextEditing
    from workflows.context_steps import ContextSteps
    from workflows.control import RunControl
    from workflows.delegation import Delegates, ParentReporter
    from workflows.done import unfinished_lines
    from workflows.done_steps import DoneSteps
    from workflows.failures import (
        ACTIVITY_FAILED,
        attempts,
        counted_attempts,
        failure_message,
        raise_if_cancelled,
    )
    from workflows.hosts import HostSteps, short_local_activity
    from workflows.interrupts import InterruptedCommands
    from workflows.ladder import pressure, rungs_due
    from workflows.options import SNAPSHOT_PATCH
    from workflows.outages import OutageWaits
    from workflows.plan import unfinished_lines as plan_unfinished
    from workflows.plan_steps import PlanSteps
    from workflows.quota_steps import QuotaSteps
    from workflows.run_metrics import RunMetrics
    from workflows.run_opening import OPEN_RUN_ACTIVITY, OPEN_RUN_TIMEOUT, RunOpened, RunOpening
    from workflows.shell import shell_schemas
    from workflows.skills import (
        CATALOG_KIND,
        SkillCatalog,
        SkillCatalogRequest,
        catalog_text,
    )
    from workflows.snapshot_steps import SnapshotSteps
    from workflows.state import Carry, ModelView
    from workflows.status_view import details_markdown
    from workflows.time_cap import TimeCap
    from workflows.tool_specs import call_summary, unique_call_ids
    from workflows.tool_steps import ToolSteps
    from workflows.types import (
        WORKFLOW_TYPE,
        AgentInput,
        AgentResult,
        ApprovalDecision,
        AttentionReport,
        Degradation,
        Limits,
        Message,
        ModelCallInput,
        ModelContext,
        ModelReply,
        PendingApproval,
        Resolution,
        RunFilesCleaned,
        RunFilesCleanup,
        RunState,
        StopReason,
        ToolCall,
        Usage,
    )
    from workflows.validation_text import validation_text

MODEL_CALL_ID = "model"
"""The attention report's `call_id` for a failed model call."""

AGENT_STATE = SearchAttributeKey.for_keyword("AgentState")
AGENT_STEP = SearchAttributeKey.for_int("AgentStep")
AGENT_TOKENS = SearchAttributeKey.for_int("AgentTokens")
AGENT_COST = SearchAttributeKey.for_float("AgentCostUsd")


class _Terminate(Exception):
    """A person chose `terminate` while the run needed attention; unwinds to `run`."""


@contextmanager
def _refusal_closes_the_run() -> Iterator[None]:
    """A workspace check that failed for good closes the run with its reason."""
    try:
        yield
    except ACTIVITY_FAILED as e:
        raise_if_cancelled(e)
        raise ApplicationError(failure_message(e), type="WorkspaceRefused", non_retryable=True) from None


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflow(
    ContextSteps,
    ToolSteps,
    RunControl,
    SnapshotSteps,
    ContextEditing,
    DoneSteps,
    PlanSteps,
    QuotaSteps,
    HostSteps,
    TimeCap,
    OutageWaits,
    InterruptedCommands,
):
    @workflow.init
    def __init__(self, raw_input: Any) -> None:
        # The input is decoded here, before any signal handler runs, so a pause or message
        # sent with the start (or right at continue-as-new) lands on the real state.
        self._input: AgentInput | None = None
        self._input_error: ApplicationError | None = None
        self._carry = Carry()
        self._limits = Limits()
        self._started_at = workflow.now()
        self._waiting = 0
        """How many waits for a person are open now (parallel calls may wait at once)."""
        self._wait_began: datetime | None = None
        self._waited_s = 0.0
        """Time this run spent waiting for a person: not counted against max_duration_s."""
        self._steps_this_run = 0
        self._tokens_before_step = 0
        self._pending_approvals: dict[str, PendingApproval] = {}
        """In the order the model asked for the calls (`ToolSteps._list_in_call_order`)."""
        self._call_positions: dict[str, int] = {}
        """The current step's approval keys (`approval_key`), by their call's place in the model's reply."""
        self._decisions: dict[str, ApprovalDecision] = {}
        self._attention: dict[str, AttentionReport] = {}
        self._resolutions: dict[str, Resolution] = {}
        self._doing = "starting"
        self._result: AgentResult | None = None
        self._published: tuple[Any, ...] = ()
        self._published_at: datetime | None = None
        self._wire = WireContext()
        self._metrics = RunMetrics()
        self._in_flight: ModelContext | None = None
        self._ignored_signals: list[str] = []
        self._watched_until: datetime | None = None
        """Until when someone follows the run live (the `watch` signal)."""
        self._folded: list[Message] = []
        """Messages folded during this run: the `transcript` query shows them; earlier runs'
        are in the archive only."""
        self._delegates = Delegates()
        self._reporter = ParentReporter(None)
        self._baseline: frozenset[str] | None = None
        self._tool_waits: dict[str, str] = {}
        """Tools whose calls wait for a worker to poll their task queue, and since when."""
        self._riders_done = []
        self._opened_skills: SkillCatalog | None = None
        """The skill catalog `open_run` listed, for `_list_skills`."""
        try:
            self._start(_parse_input(raw_input))
        except ApplicationError as e:
            self._input_error = e  # raised by run: raising here would fail the task forever

    @property
    def _agent(self) -> AgentInput:
        if self._input is None:  # handlers and queries check _input first; this never fires
            raise ApplicationError("the run has no input yet", non_retryable=True)
        return self._input

    def _patched(self, patch: str) -> bool:
        """`workflow.patched(patch)`, except that a run recorded with a baseline patch has every
        patch of that baseline without a marker of its own (options.BASELINES)."""
        if self._baseline is None:
            self._baseline = next((patches for id, patches in options.BASELINES if workflow.patched(id)), frozenset())
        return patch in self._baseline or workflow.patched(patch)

    # --- run ---------------------------------------------------------------------------

    @workflow.run
    async def run(self, raw_input: Any) -> AgentResult:
        # The input is typed Any and decoded by us, not by the SDK: a bad input from the
        # Temporal CLI must close the run with a clear error, not fail its task forever.
        if self._input_error is not None:
            raise self._input_error
        # Read once, before any local activity (see options.LOCAL_START_UP_PATCH on why).
        self._snapshots_on = self._patched(SNAPSHOT_PATCH)
        self._snapshot_with_tools = self._snapshots_on and self._patched(options.SNAPSHOT_WITH_TOOLS_PATCH)
        self._calls_with_command = self._snapshot_with_tools and self._patched(options.FILE_CALLS_WITH_COMMAND_PATCH)
        self._opens_at_once = self._patched(options.OPEN_RUN_PATCH)
        self._caps_on = self._patched(options.LIMITS_PATCH)
        try:
            await self._begin()
            await self._list_skills()
            result = await self._capped(self._loop())
        except _Terminate:
            result = self._finish("terminated", "terminated")
        except asyncio.CancelledError:
            result = self._finish("cancelled", "cancelled")
        else:
            await self._archive_rest()
        await self._clean_up_files(result)
        await self._close_mcp_sessions()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._flush_signals()
        return result

    async def _begin(self) -> None:
        """Before the first step; a cancel that comes with the start lands in `run`'s handler."""
        if self._agent.agent and not self._carry.agent_file:
            await self._load_agent()  # before any continue-as-new, which carries the result
        if self._task_timeout_too_long():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._input_for_next_run(), task_timeout=options.WORKFLOW_TASK_TIMEOUT)
        self._publish_host()
        if self._patched(options.WORKSPACE_CHECK_PATCH):
            if self._opens_at_once and self._agent.host is None and self._patched(options.LOCAL_START_UP_PATCH):
                await self._open_run()
            else:
                await self._check_workspace()
        await self._resolve_tools()
        if self._carry.snapshot is None and self._carry.step == 0:
            await self._snapshot()  # step 0: the workspace as the run found it
        self._publish()

    async def _clean_up_files(self, result: AgentResult) -> None:
        """The chain closes: its journal goes (activities/cleanup.py). A failure is only reported."""
        if not self._patched(options.RUN_FILES_PATCH):
            return
        request = RunFilesCleanup(workspace=self._agent.workspace, run_folder=self._run_folder())
        try:
            cleaned = await self._local_or_regular(
                options.LOCAL_CLEAN_UP_PATCH,
                "clean_up_run",
                request,
                RunFilesCleaned,
                options.CLEANUP_TIMEOUT,
                f"clean_up_run: {request.run_folder}"[:120],
                options.CLEANUP_RETRY,
                patient=False,  # a closing run does not wait for a gone host: `gc` there cleans up
            )
            result.files = cleaned.note
        except ACTIVITY_FAILED as e:
            result.files = f"cleaning up the run's files failed: {failure_message(e)}; `durable-agent gc` can retry"

    async def _load_agent(self) -> None:
        """The agent file, read once and recorded (a later edit cannot change a replay), under
        the input: the run goes on as if the merged input had been given. A bad or unknown
        file closes the run here, before any model call."""
        name = self._agent.agent
        self._doing = f"loading agent {name}"
        try:
            definition = await self._on_host_or_local(
                "load_agent",
                AgentRequest(workspace=self._agent.workspace, name=name or ""),
                result_type=AgentDefinition,
                start_to_close_timeout=options.AGENT_FILE_TIMEOUT,
                retry_policy=options.TOOL_RETRY,
                local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                summary=f"load_agent: {name}",
            )
            merged = effective_input(self._agent, definition)
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            raise ApplicationError(failure_message(e), type="AgentFileError", non_retryable=True) from None
        except AgentFileError as e:
            raise ApplicationError(str(e), type="AgentFileError", non_retryable=True) from None
        self._input, self._limits = merged, merged.limits
        self._carry.model = merged.model
        self._carry.view = ModelView(session=initial_messages(merged))
        self._carry.agent_file = definition.path

    def _run_folder(self) -> str:
        return compaction.run_folder(workflow.info().workflow_id, self._carry.first_run_id)

    def _task_timeout_too_long(self) -> bool:
        """A run started without `start_agent`'s task timeout (e.g. a plain `temporal workflow
        start`, 10 s) restarts at once with the short one, before its first step: a task held
        by a killed worker is then handed on after 1.5 s, not 10 s, however the run began."""
        timeout = workflow.info().task_timeout
        return (
            self._agent.carry is None
            and (timeout is None or timeout > options.WORKFLOW_TASK_TIMEOUT)
            and self._patched(options.TASK_TIMEOUT_PATCH)
        )

    async def _flush_signals(self) -> None:
        """Signals to delegates and to the parent go out before the run closes or continues."""
        await self._delegates.flush()
        await self._reporter.flush()

    async def _check_workspace(self) -> None:
        """The worker confirms the workspace lies in its roots; a refusal closes the run."""
        with _refusal_closes_the_run():
            await self._local_or_regular(
                options.LOCAL_START_UP_PATCH,
                "check_workspace",
                self._agent.workspace,
                None,
                options.WORKSPACE_CHECK_TIMEOUT,
                f"check_workspace: {self._agent.workspace}"[:120],
            )

    async def _open_run(self) -> None:
        """The workspace check, and with it step 0's snapshot and the skills where nothing runs
        between them (workflows/run_opening.py); what it did not bring, `_begin` and
        `_list_skills` ask for on their own. A refusal closes the run as the check's does."""
        workspace = self._agent.workspace
        resolves = self._carry.catalog is None and bool(self._agent.tools_to_resolve() or self._agent.mcp_servers)
        takes_snapshot = self._snapshots_on and self._carry.snapshot is None and self._carry.step == 0
        opening = RunOpening(
            workspace=workspace,
            snapshot=self._snapshot_request() if takes_snapshot and not resolves else None,
            skills=SkillCatalogRequest(workspace=workspace) if self._lists_skills() and not resolves else None,
        )
        parts = ["check"] + ["snapshot of step 0"] * bool(opening.snapshot) + ["skills"] * bool(opening.skills)
        with _refusal_closes_the_run():
            opened = await short_local_activity(
                OPEN_RUN_ACTIVITY,
                opening,
                RunOpened,
                OPEN_RUN_TIMEOUT,
                options.TOOL_RETRY,
                f"{OPEN_RUN_ACTIVITY} ({', '.join(parts)}): {workspace}"[:120],
            )
        self._taken_in_a_call = opened.snapshot
        self._opened_skills = opened.skills

    async def _local_or_regular(
        self,
        patch: str,
        name: str,
        arg: Any,
        result_type: type | None,
        timeout: timedelta,
        summary: str,
        retry: RetryPolicy = options.TOOL_RETRY,
        patient: bool = True,
    ) -> Any:
        """A short read or cleanup at a run's start or close: a local activity, in a workflow
        task the run has anyway, or a regular one in runs recorded before `patch`; on the
        run's host if it has one (workflows/hosts.py)."""
        if self._agent.host is not None:
            return await self._here_or_on_host(name, arg, result_type, timeout, summary, retry, patient=patient)
        if self._patched(patch):
            return await short_local_activity(name, arg, result_type, timeout, retry, summary)
        return await workflow.execute_activity(
            name, arg, result_type=result_type, start_to_close_timeout=timeout, retry_policy=retry, summary=summary
        )

    def _start(self, input: AgentInput) -> None:
        info = workflow.info()
        self._input = input
        self._limits = input.limits
        self._reporter = ParentReporter(input.parent)
        if input.carry is not None:
            self._carry = input.carry
            # A fork's carry comes from another chain: it starts its own (durable_agent/fork.py).
            self._carry.first_run_id = self._carry.first_run_id or info.first_execution_run_id or info.run_id
        else:
            self._carry = Carry(
                model=input.model,
                view=ModelView(session=initial_messages(input)),
                first_run_id=info.first_execution_run_id or info.run_id,
            )
        if not self._carry.archive_dir:
            self._carry.archive_dir = compaction.archive_dir(info.workflow_id, self._carry.first_run_id)

    async def _loop(self) -> AgentResult:
        while True:
            await self._wait_while_paused()
            stop = self._hard_stop()
            if stop is not None:
                return self._finish("stopped", stop)
            await self._climb_ladder()
            self._take_user_messages()
            await self._fit_context()
            reply = await self._call_model()
            if not reply.tool_calls:
                if await self._answer_accepted(reply.content or ""):
                    return self._finish("completed", "final_answer", output=reply.content or "")
                # Unmet criteria went back to the model: the step ends like one with tools.
            elif limits.tool_calls_exceed(self._carry.usage, self._limits, len(reply.tool_calls)):
                return self._finish("stopped", "tool_call_budget", open_calls=reply.tool_calls)
            else:
                await self._run_tools(reply.tool_calls)
            await self._snapshot()
            self._end_step()
            if self._should_continue_as_new():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if self._patched(options.CLOSED_RUN_STATE_PATCH):
                    # The closed run holds no AgentState: the chain's next run holds it.
                    workflow.upsert_search_attributes([AGENT_STATE.value_unset()])
                await self._flush_signals()
                workflow.continue_as_new(self._input_for_next_run())

    def _lists_skills(self) -> bool:
        """Whether the run lists the skills at its start: once per chain, where the model may load them."""
        if self._carry.skills_listed or "load_skill" not in self._agent.enabled_tools():
            return False
        return self._patched(options.SKILLS_PATCH)

    async def _list_skills(self) -> None:
        """Once per chain: the skills the model may load, as a system message."""
        if not self._lists_skills():
            return
        self._doing = "listing skills"
        catalog, self._opened_skills = self._opened_skills, None
        if catalog is None:
            catalog = await self._discover_skills()
        self._carry.skills_listed = True
        text = catalog_text(catalog)
        if text is not None:
            self._carry.view.messages.insert(1, Message(role="system", content=text, step=0, kind=CATALOG_KIND))

    async def _discover_skills(self) -> SkillCatalog:
        try:
            return await self._local_or_regular(
                options.LOCAL_START_UP_PATCH,
                "discover_skills",
                SkillCatalogRequest(workspace=self._agent.workspace),
                SkillCatalog,
                options.SKILLS_TIMEOUT,
                "discover_skills",
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return SkillCatalog(problems=[f"the skill folders could not be listed: {failure_message(e)}"])

    # --- limits ------------------------------------------------------------------------

    def _spend(self, now: datetime | None = None) -> limits.Spend:
        usage = self._usage_now(now)
        return limits.Spend(step=self._carry.step, usage=usage, elapsed_s=usage.elapsed_s)

    def _usage_now(self, now: datetime | None = None) -> Usage:
        """Usage with the time the run has run: waits for a person (paused, awaiting
        approval, needs attention) are left out; the time limit is for runaway runs."""
        now = now or self._now()
        waited = self._waited_s
        if self._waiting and self._wait_began is not None:
            waited += max(0.0, (now - self._wait_began).total_seconds())
        elapsed = self._carry.elapsed_before_s + (now - self._started_at).total_seconds() - waited
        return self._carry.usage.model_copy(update={"elapsed_s": round(max(0.0, elapsed), 3)})

    @contextmanager
    def _waiting_for_a_person(self) -> Iterator[None]:
        # Histories recorded before this change counted waits: they replay as recorded.
        if not self._patched(options.WAITS_NOT_TIMED_PATCH):
            yield
            return
        if self._waiting == 0:
            self._wait_began = workflow.now()
        self._waiting += 1
        try:
            yield
        except GeneratorExit:
            raise  # the worker drops the run from its cache: no clock, nothing to count
        except BaseException:
            self._end_wait()
            raise
        self._end_wait()

    def _end_wait(self) -> None:
        self._waiting -= 1
        if self._waiting == 0 and self._wait_began is not None:
            self._waited_s += max(0.0, (workflow.now() - self._wait_began).total_seconds())
            self._wait_began = None

    def _hard_stop(self) -> StopReason | None:
        estimate = limits.estimate_next_call(
            self._request_tokens(), self._carry.recent_output_tokens, self._carry.last_price
        )
        return limits.hard_stop(self._spend(), self._limits, estimate)

    async def _climb_ladder(self) -> None:
        """The degradation ladder (workflows/ladder.py): each rung due now, in order."""
        spend = self._spend()
        level = pressure(spend, self._limits, self._carry.early_soft_tier)
        for rung in rungs_due(self._carry.ladder, level):
            self._carry.ladder.append(rung)
            if rung == "compaction":
                await self._compact("soft_tier")
            elif rung == "soft_warning":
                self._warn(limits.soft_tier(spend, self._limits) or ["tokens"])
                self._skip_optional()
            else:
                self._switch_to_fallback()
        if "soft_warning" in self._carry.ladder:
            # Past the wrap-up rung, a budget that enters its soft tier later is announced too.
            entered = [b for b in limits.soft_tier(spend, self._limits) if b not in self._carry.warned]
            if entered:
                self._warn(entered)

    def _warn(self, budgets: list[str]) -> None:
        self._carry.warned += [b for b in budgets if b not in self._carry.warned]
        text = limits.warning_text(budgets, self._spend(), self._limits)
        self._add_message("system", text, kind="warning")
        self._degrade("soft_warning", f"{', '.join(budgets)}: {text}")

    def _switch_to_fallback(self) -> None:
        fallback = self._agent.fallback_model if self._input else None
        if not fallback or fallback == self._carry.model:
            return
        detail = f"switched from {self._carry.model} to {fallback}"
        self._degrade("fallback_model", detail)
        self._carry.model = fallback

    def _degrade(self, kind: Any, detail: str) -> None:
        self._carry.degradations.append(Degradation(step=self._carry.step, kind=kind, detail=detail))
        if kind != "soft_warning":  # the warning is in the transcript already, as sent
            self._add_message("system", f"{kind}: {detail}", kind="degradation")

    def _end_step(self) -> None:
        step_tokens = self._carry.usage.tokens - self._tokens_before_step
        spike = limits.is_spike(step_tokens, self._carry.tokens_per_step)
        self._adapt_quota(step_tokens, spike)
        self._carry.tokens_per_step = (self._carry.tokens_per_step + [step_tokens])[-limits.PACING_WINDOW :]
        if spike and not self._carry.early_soft_tier and not self._carry.ladder:
            # The ladder starts at the next step (its first rung: compaction).
            self._carry.early_soft_tier = True
            self._degrade(
                "early_soft_tier", f"step {self._carry.step} used {step_tokens} tokens, over twice the average"
            )
        # No publish here: the next model call publishes step and usage together, in one upsert.

    # --- model -------------------------------------------------------------------------

    async def _call_model(self) -> ModelReply:
        self._carry.step += 1
        self._steps_this_run += 1
        self._tokens_before_step = self._carry.usage.tokens
        while True:
            messages = compaction.request_messages(self._carry.view)
            self._carry.last_estimate = estimate_tokens(messages)
            self._doing = f"calling {self._carry.model} (step {self._carry.step})"
            self._publish()
            try:
                reply = await self._execute_model_call(
                    self._wire.render(messages),
                    tools=self._enabled_tools(),
                    summary=f"step {self._carry.step}",
                    max_tokens=self._carry.quota.max_tokens(),
                )
            except ACTIVITY_FAILED as e:
                raise_if_cancelled(e)
                if await self._wait_out_outage(e):
                    continue
                await self._needs_attention(
                    MODEL_CALL_ID,
                    what=f"call_model ({self._carry.model}) at step {self._carry.step}",
                    error=self._outage_text(e),
                    attempts=counted_attempts(e) or attempts(e, options.MODEL_RETRY.maximum_attempts),
                )
                self._take_user_messages()  # what a person added while the run waited
                self._outage_since = None  # after a person's decision, an outage is waited out afresh
                continue  # retry, or skip (the model is told), both call again
            self._outage_since = None
            reply.tool_calls = unique_call_ids(reply.tool_calls)
            self._record_reply(reply)
            return reply

    async def _execute_model_call(
        self, messages: list[dict[str, Any]], tools: list[str], summary: str, max_tokens: int | None = None
    ) -> ModelReply:
        """One `call_model`: an agent step's (its wire messages chosen by compaction), or a
        compaction's summarising call."""
        summary = f"call_model: {self._carry.model} {summary}"[:120]
        if not self._patched(options.MODEL_ACTIVITY_PATCH):
            return await workflow.execute_local_activity(
                "call_model",
                ModelCallInput(messages=messages, tools=tools, model=self._carry.model),
                result_type=ModelReply,
                start_to_close_timeout=options.MODEL_START_TO_CLOSE,
                retry_policy=options.MODEL_RETRY,
                local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                summary=summary,
            )
        ref = context_handoff.context_ref(workflow.info().run_id, messages, self._wire.encode)
        self._in_flight = ModelContext(ref=ref, messages=messages)
        context_handoff.offer(ref, messages)
        try:
            return await workflow.execute_activity(
                "call_model",
                ModelCallInput(
                    context=ref,
                    tools=tools,
                    model=self._carry.model,
                    tool_schemas=self._tool_schemas(tools),
                    live=self._watched(),
                    max_tokens=max_tokens,
                    outage_wait=self._caps_on,
                    attempts=options.MODEL_RETRY.maximum_attempts if self._caps_on else None,
                ),
                result_type=ModelReply,
                start_to_close_timeout=self._clipped(options.MODEL_START_TO_CLOSE),
                heartbeat_timeout=options.MODEL_HEARTBEAT_TIMEOUT,
                retry_policy=options.COUNTED_MODEL_RETRY if self._caps_on else options.MODEL_RETRY,
                summary=summary,
            )
        finally:
            self._in_flight = None

    def _watched(self) -> bool:
        return self._watched_until is not None and workflow.now() < self._watched_until

    def _tool_schemas(self, tools: list[str]) -> list[dict[str, Any]]:
        specs = self._catalog_specs()
        catalog = [specs[name].schema() for name in tools if name in specs]
        return catalog + shell_schemas(tools, self._agent, self._patched)

    def _record_reply(self, reply: ModelReply) -> None:
        self._charge(reply)
        self._carry.last_input_tokens = reply.input_tokens
        self._carry.recent_output_tokens = (self._carry.recent_output_tokens + [reply.output_tokens])[
            -limits.PACING_WINDOW :
        ]
        self._carry.view.messages.append(
            Message(role="assistant", content=reply.content, tool_calls=reply.tool_calls, step=self._carry.step)
        )

    def _charge(self, reply: ModelReply) -> None:
        """Usage is what the provider reported, for every call: agent steps and summaries."""
        self._carry.usage.input_tokens += reply.input_tokens
        self._carry.usage.output_tokens += reply.output_tokens
        self._carry.usage.model_calls += 1
        self._carry.usage.cost_usd = round(self._carry.usage.cost_usd + reply.cost_usd(), 8)
        if reply.price is None:
            self._carry.usage.cost_known = False
        self._carry.usage.estimated_calls += reply.usage_estimated
        self._carry.last_price = reply.price

    # --- people ------------------------------------------------------------------------

    async def _needs_attention(
        self, call_id: str, what: str, error: FailureError | str, attempts: int, actions: list[str] | None = None
    ) -> Resolution:
        """Report the failed call and wait for a person's `resolve` of it. Parallel tool
        calls may each wait here at once, each with its own report and resolution."""
        message = error if isinstance(error, str) else failure_message(error)
        self._attention[call_id] = AttentionReport(
            call_id=call_id,
            what_failed=what,
            last_error=message,
            attempts=attempts,
            step=self._carry.step,
            suggested_actions=actions
            or [
                "retry: try the same call again (after fixing the cause, e.g. the endpoint or the workspace)",
                "skip: drop the failing call and tell the model",
                "terminate: finish the run now with a partial result",
            ],
        )
        self._add_message("system", f"Needs attention: {what}: {message}", kind="attention")
        self._publish()
        with self._waiting_for_a_person():
            await workflow.wait_condition(lambda: call_id in self._resolutions)
        resolution = self._resolutions.pop(call_id)
        del self._attention[call_id]
        self._add_message("user", _resolution_text(resolution), kind="resolution")
        self._publish()
        if resolution.action == "terminate":
            raise _Terminate()
        return resolution

    async def _wait_while_paused(self) -> None:
        if not self._carry.paused:
            return
        self._publish()
        with self._waiting_for_a_person():
            await workflow.wait_condition(lambda: not self._carry.paused)
        self._publish()

    def _pause(self, reason: str) -> None:
        earlier = self._carry.paused_reason if self._carry.paused else None
        if earlier:  # a second pause keeps the first one's reason
            reason = earlier if reason in earlier.split("; ") else f"{earlier}; {reason}"
        self._carry.paused = True
        self._carry.paused_reason = reason
        self._publish()

    def _take_user_messages(self) -> None:
        for text in self._carry.pending_user_messages:
            self._add_message("user", text, kind="user")
        self._carry.pending_user_messages = []

    def _add_message(self, role: Any, text: str, kind: str) -> None:
        self._carry.view.messages.append(Message(role=role, content=text, step=self._carry.step, kind=kind))

    # --- state and visibility ----------------------------------------------------------

    def _state(self) -> RunState:
        if self._result is not None:
            return self._result.state
        if self._attention:
            return "needs_attention"
        if self._carry.paused:
            return "paused"
        if self._pending_approvals:
            return "awaiting_approval"
        return "running"

    def _activity(self) -> str:
        """What the run is doing now, in words: a waiting state says what it waits for."""
        state = self._state()
        if state == "running" and (host_wait := self._host_wait_text()):
            return host_wait
        if state == "needs_attention":
            return "waiting for a person to resolve a failure"
        if state == "paused":
            return "paused before the next step"
        if state == "awaiting_approval":
            return f"waiting for a person to approve {len(self._pending_approvals)} tool call(s)"
        return self._doing

    def _publish(self) -> None:
        """Search attributes and current details for the Web UI, written only when changed."""
        if self._input is None:
            return
        usage = self._result.usage if self._result else self._carry.usage
        snapshot = (self._state(), self._carry.step, usage.tokens, round(usage.cost_usd, 6))
        if snapshot != self._published and self._search_attributes_due(snapshot[0]):
            self._published = snapshot
            self._published_at = workflow.now()
            workflow.upsert_search_attributes(
                [
                    AGENT_STATE.value_set(snapshot[0]),
                    AGENT_STEP.value_set(snapshot[1]),
                    AGENT_TOKENS.value_set(snapshot[2]),
                    # Unset while a model without a price was used: $0 would read as "free".
                    AGENT_COST.value_set(float(snapshot[3])) if usage.cost_known else AGENT_COST.value_unset(),
                ]
            )
        status = self._status()
        self._metrics.observe(status)  # replay-safe: workflow.metric_meter() (workflows/run_metrics.py)
        workflow.set_current_details(details_markdown(status))
        self._reporter.report(status, status.wait_chains)

    def _search_attributes_due(self, state: RunState) -> bool:
        """A new state is written at once; step, tokens and cost at most every
        `options.SEARCH_ATTRIBUTES_REFRESH` (each write is a visibility-store update)."""
        if not self._published or state != self._published[0] or self._published_at is None:
            return True
        if not self._patched(options.SEARCH_ATTRIBUTES_REFRESH_PATCH):
            return True
        return workflow.now() - self._published_at >= options.SEARCH_ATTRIBUTES_REFRESH

    def _finish(
        self, state: RunState, reason: StopReason, output: str | None = None, open_calls: list[ToolCall] = ()
    ) -> AgentResult:
        final = output if output is not None else last_answer(self._carry.view.messages)
        if state == "stopped":  # the ladder's last rung
            self._degrade("stop", f"{reason}: stopped cleanly at step {self._carry.step}")
        unfinished: list[str] = []
        if state != "completed":
            unfinished.append(f"goal not reached ({reason} at step {self._carry.step}): {self._agent.goal}")
            unfinished += [f"tool call not run: {call_summary(c.name, {})} {c.arguments[:200]}" for c in open_calls]
            unfinished += [f"approval pending: {p.summary}" for p in self._pending_approvals.values()]
            unfinished += self._delegates.charge_running(self._carry.usage)
        unfinished += unfinished_lines(self._carry.criteria) + plan_unfinished(self._carry.plan, state == "completed")
        output = final or progress_summary(
            self._carry.view.messages, self._carry.step, reason, self._carry.usage.tool_calls
        )
        self._result = AgentResult(
            state=state,
            stop_reason=reason,
            output=output,
            steps=self._carry.step,
            usage=self._usage_now(),
            unfinished=unfinished,
            summary=compaction.run_summary(self._carry.view, self._agent.goal, output, unfinished),
            degraded=[d.detail for d in self._carry.degradations if d.kind == "cached_tool_result"],
            criteria=self._carry.criteria,
            plan=self._carry.plan,
        )
        self._doing = f"finished ({reason})"
        self._publish()
        return self._result

    # --- continue-as-new ---------------------------------------------------------------

    def _should_continue_as_new(self) -> bool:
        return (
            workflow.info().is_continue_as_new_suggested() or self._steps_this_run >= self._agent.continue_as_new_every
        )

    def _input_for_next_run(self) -> AgentInput:
        carry = self._carry.model_copy(update={"elapsed_before_s": self._usage_now().elapsed_s})
        return self._agent.model_copy(update={"limits": self._limits, "carry": carry})


def _parse_input(raw: Any) -> AgentInput:
    if isinstance(raw, AgentInput):
        return raw
    try:
        return AgentInput.model_validate(raw)
    except ValidationError as e:
        raise ApplicationError(
            f"invalid AgentInput: {validation_text(e)}", type="InvalidInput", non_retryable=True
        ) from None


def _resolution_text(resolution: Resolution) -> str:
    note = f" Note: {resolution.note}" if resolution.note else ""
    if resolution.action == "skip":
        return f"A person chose to skip the failing call; continue without it.{note}"
    if resolution.action == "retry":
        return f"A person chose to retry the failing call.{note}"
    return f"A person terminated the run.{note}"
