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
    from workflows.approval_diff import DIFFED_TOOLS, approval_diff_lines
    from workflows.delegation import WAIT_ACTIONS, ParentSide
    from workflows.dependency_waits import DependencyWaits, dependency_down
    from workflows.failures import (
        ACTIVITY_FAILED,
        failure_message,
        failure_type,
        raise_if_cancelled,
        timed_out,
        worker_lost,
    )
    from workflows.hosts import workspace_queue
    from workflows.interrupts import rerun_note
    from workflows.livelock import LIVELOCK_REPEATS, call_key
    from workflows.shell import remember_shell, with_shell
    from workflows.skills import (
        already_loaded,
        take_loaded_skill,
    )
    from workflows.tool_catalog import CatalogRequest, LocalToolCall, McpClose, ToolCatalog, ToolSpec
    from workflows.tool_specs import (
        SUMMARY_MAX_BYTES,
        SUMMARY_MAX_CHARS,
        RecallArgs,
        ToolArgumentError,
        call_summary,
        decode_arguments,
        parse_tool_call,
    )
    from workflows.types import (
        NOT_RUN,
        ApprovalDecision,
        Message,
        PendingApproval,
        Resolution,
        RidingCall,
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


def approval_key(step: int, call_id: str) -> str:
    """A pending approval's id, as `approve` takes it: the call's id is unique only in its step."""
    return f"{step}:{call_id}"


class ToolSteps(DependencyWaits):
    """A step's tool calls, as `AgentWorkflow` runs them.

    `_calls_with_command` is read once, at the run's start (`AgentWorkflow.run`)."""

    _calls_with_command = False
    _riders_done: list[ToolOutcome | None]
    """The outcomes the step's command brought back for its riding calls, in their order, until taken."""

    def _enabled_tools(self) -> list[str]:
        """The input's tools and the tools of its MCP servers, as listed at the run's start."""
        mcp = [s.name for s in self._carry.catalog or [] if s.source == "mcp"]
        return self._agent.enabled_tools() + mcp

    def _catalog_specs(self) -> dict[str, ToolSpec]:
        """The run's tools beyond the built-ins: its `activity_tools` and its resolved catalog."""
        specs = {t.name: ToolSpec.of_activity(t) for t in self._agent.activity_tools}
        return {**specs, **{s.name: s for s in self._carry.catalog or []}}

    async def _resolve_tools(self) -> None:
        """Once per chain: the workers' specs of the tools the run names beyond the built-ins,
        recorded in history; a name no worker offers closes the run, before any model call."""
        names, servers = self._agent.tools_to_resolve(), self._agent.mcp_servers
        if self._carry.catalog is not None or not (names or servers):
            return
        self._doing = "resolving tools"
        request = CatalogRequest(names=names)
        if servers:  # their sessions start for this run on this worker (activities/mcp_tools.py)
            request = CatalogRequest(
                names=names, mcp_servers=servers, workspace=self._agent.workspace, run_folder=self._run_folder()
            )
        catalog = await self._list_catalog(request)
        if catalog.unknown:
            raise ApplicationError(
                f"unknown tool(s) {catalog.unknown}: no worker offers them (load their module with "
                "DURABLE_AGENT_TOOLS, `durable-agent worker --tools MODULE` or DurableAgentPlugin(tools=...)), "
                "and they are not in activity_tools",
                type="UnknownTool",
                non_retryable=True,
            )
        if catalog.unknown_servers:
            raise ApplicationError(
                f"unknown MCP server(s) {catalog.unknown_servers}: the worker's DURABLE_AGENT_MCP_CONFIG does not "
                "configure them (docs/mcp.md)",
                type="UnknownMcpServer",
                non_retryable=True,
            )
        self._carry.catalog = catalog.tools

    async def _list_catalog(self, request: CatalogRequest) -> ToolCatalog:
        """`tool_catalog`; while an MCP server is down (cannot start, or does not answer) the run
        waits for it like any dependency, saying so in its status, and tries again."""
        waiting_since: str | None = None
        timeout = options.MCP_CATALOG_TIMEOUT if request.mcp_servers else options.CATALOG_TIMEOUT
        while True:
            summary = f"tool_catalog: {', '.join([*request.names, *request.mcp_servers])}"[:120]
            try:
                return await self._on_host_or_local(
                    "tool_catalog",
                    request,
                    result_type=ToolCatalog,
                    start_to_close_timeout=timeout,
                    retry_policy=options.TOOL_RETRY,
                    local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                    summary=summary,
                    bound=bool(request.mcp_servers),  # servers start in the workspace: on the run's host
                )
            except ACTIVITY_FAILED as e:
                raise_if_cancelled(e)
                if not _mcp_down(e):
                    raise ApplicationError(
                        f"the run's tools could not be resolved: {failure_message(e)}",
                        type="UnknownTool",
                        non_retryable=True,
                    ) from None
                waiting_since = waiting_since or workflow.now().isoformat(timespec="seconds")
                self._doing = f"waiting for an MCP server since {waiting_since}: {failure_message(e)}"
                self._publish()
                await workflow.sleep(options.MCP_DOWN_RETRY)

    async def _close_mcp_sessions(self) -> None:
        """At the chain's close: its MCP sessions on this worker end (on others, when idle), and
        so does a start still going for an attempt of its catalog that was cancelled."""
        if not self._agent.mcp_servers:
            return
        if self._carry.catalog is None and not self._patched(options.MCP_CLOSE_UNLISTED_PATCH):
            return
        try:
            close, summary = McpClose(run_folder=self._run_folder()), f"mcp_close: {', '.join(self._agent.mcp_servers)}"
            if self._agent.host is not None:  # where its servers run; a gone host's end with their worker
                await self._on_host("mcp_close", close, None, options.MCP_CLOSE_TIMEOUT, summary[:120], patient=False)
                return
            await workflow.execute_local_activity(
                "mcp_close", close, start_to_close_timeout=options.MCP_CLOSE_TIMEOUT, summary=summary[:120]
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            workflow.logger.warning("closing the run's MCP sessions failed: %s", failure_message(e))

    async def _call_catalog_tool(self, spec: ToolSpec, request: ToolCallInput, args: dict[str, Any]) -> ToolOutcome:
        """A user's tool or an activity tool; while its dependency is down the run waits for it
        (workflows/dependency_waits.py) and calls again."""
        once = lambda r: self._call_catalog_tool_once(spec, r, args)  # noqa: E731
        return await self._waiting_out_dependencies(spec, request, once)

    async def _call_catalog_tool_once(
        self, spec: ToolSpec, request: ToolCallInput, args: dict[str, Any]
    ) -> ToolOutcome:
        """Its activity on its task queue. While no worker polls that queue the run waits,
        saying so, and goes on when one does. A short Python tool runs here, as a local
        activity, when this worker has it (`_call_here`)."""
        if self._runs_here(spec):
            here = await self._call_here(spec, request, args)
            if here is not None:
                return here
        waiting_since: str | None = None
        while True:
            try:
                if (spec.workspace or spec.mcp is not None) and self._agent.host is not None:
                    return self._received(spec, await self._call_on_host(spec, request, args), args)
                raw = await workflow.execute_activity(
                    spec.activity_type(),
                    request,
                    # Another team's worker answers in its own words: read by `activity_outcome`.
                    result_type=ToolOutcome if spec.source == "python" else None,
                    task_queue=spec.task_queue,
                    schedule_to_start_timeout=options.TOOL_WORKER_WAIT,
                    start_to_close_timeout=timedelta(seconds=spec.timeout_s or options.USER_TOOL_TIMEOUT_S),
                    # Our Python tools beat in the background; another team's worker may not.
                    heartbeat_timeout=options.HEARTBEAT_TIMEOUT if spec.source in ("python", "mcp") else None,
                    retry_policy=options.catalog_tool_retry(spec.retries),
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
                if (down := dependency_down(e)) is not None:
                    raise down from None
                if spec.effect == "write" and worker_lost(e):
                    return ToolOutcome(ok=False, error=OUTCOME_UNKNOWN.format(tool=spec.name, error=failure_message(e)))
                return ToolOutcome(ok=False, error=f"{spec.name} failed: {failure_message(e)}")
            self._tool_waits.pop(spec.name, None)
            outcome = raw if isinstance(raw, ToolOutcome) else await self._answer(spec.name, raw, request.output_chars)
            return self._received(spec, outcome, args)

    async def _call_on_host(self, spec: ToolSpec, request: ToolCallInput, args: dict[str, Any]) -> ToolOutcome:
        """A workspace-bound user tool of a run pinned to a host: on the host's queue of the tool."""
        return await self._on_host(
            spec.activity_type(),
            request,
            ToolOutcome,
            timedelta(seconds=spec.timeout_s or options.USER_TOOL_TIMEOUT_S),
            call_summary(spec.name, args),
            options.catalog_tool_retry(spec.retries),
            heartbeat=options.HEARTBEAT_TIMEOUT,
            cancellation=options.TOOL_CANCELLATION,
            base_queue=spec.task_queue,
        )

    def _received(self, spec: ToolSpec, outcome: ToolOutcome, args: dict[str, Any]) -> ToolOutcome:
        """A catalog tool's call that ran: its cost counted, a cached answer noted."""
        self._charge_tool(spec)
        if outcome.cached_from is not None:
            detail = f"{call_summary(spec.name, args)}: answered from its cache of {outcome.cached_from}"
            self._degrade("cached_tool_result", detail)
        return outcome

    def _runs_here(self, spec: ToolSpec) -> bool:
        """A Python tool whose `timeout_s` is short enough to run inside a workflow task, unless
        it needs the workspace of a run pinned to a host (the workflow task may run elsewhere)."""
        short = spec.timeout_s is not None and spec.timeout_s <= options.LOCAL_TOOL_MAX_S
        on_host = spec.workspace and self._agent.host is not None
        return spec.source == "python" and short and not on_host and self._patched(options.LOCAL_PYTHON_TOOLS_PATCH)

    async def _call_here(self, spec: ToolSpec, request: ToolCallInput, args: dict[str, Any]) -> ToolOutcome | None:
        """The tool as a local activity of the worker running the run: no task queue round trip.
        Through `run_tool_here`, which every agent worker has, so any worker can replay the
        run; None when this worker lacks the tool (recorded in the marker: replays take the
        same path): then its own queue's workers serve it."""
        try:
            outcome = await workflow.execute_local_activity(
                "run_tool_here",
                LocalToolCall(tool=spec.name, call=request),
                result_type=ToolOutcome,
                start_to_close_timeout=timedelta(seconds=spec.timeout_s or options.LOCAL_TOOL_MAX_S),
                retry_policy=options.catalog_tool_retry(spec.retries),
                local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                summary=call_summary(spec.name, args),
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            if failure_type(e) == "NotFoundError":
                return None
            if (down := dependency_down(e)) is not None:
                raise down from None
            return ToolOutcome(ok=False, error=f"{spec.name} failed: {failure_message(e)}")
        return self._received(spec, outcome, args)

    async def _answer(self, name: str, raw: Any, budget_chars: int) -> ToolOutcome:
        """Another team's answer as the run records it: capped and redacted of token shapes
        here, then of this worker's secret values by a local activity (only a worker knows
        them). The activity's own result event keeps what that worker sent (docs/tools.md)."""
        outcome = activity_outcome(raw, budget_chars)
        if not self._patched(options.ACTIVITY_TOOL_REDACTION_PATCH):
            return outcome
        try:
            return await workflow.execute_local_activity(
                "redact_tool_outcome",
                outcome,
                result_type=ToolOutcome,
                start_to_close_timeout=options.REDACTION_TIMEOUT,
                retry_policy=options.TOOL_RETRY,
                summary=f"redact_tool_outcome: {name}",
            )
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            workflow.logger.warning("%s: its answer kept with token shapes redacted only: %s", name, e)
            return outcome

    def _charge_tool(self, spec: ToolSpec) -> None:
        if not spec.cost_usd:
            return
        usage = self._carry.usage
        usage.cost_usd += spec.cost_usd
        usage.tool_costs[spec.name] = usage.tool_costs.get(spec.name, 0.0) + spec.cost_usd

    async def _run_tools(self, calls: list[ToolCall]) -> None:
        runnable = calls[: limits.MAX_TOOL_CALLS_PER_STEP]
        step = self._carry.step
        self._call_positions = {approval_key(step, call.id): place for place, call in enumerate(runnable)}
        self._carry.usage.tool_calls += len(runnable)
        self._doing = f"running {len(runnable)} tool call(s) (step {self._carry.step})"
        outcomes = await self._run_in_order(runnable, self._snapshot_carrier(runnable))
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

    async def _run_in_order(self, calls: list[ToolCall], last: int | None) -> list[ToolOutcome]:
        """The calls side by side; the one at `last` (which takes the step's snapshot) after the
        others, and the file calls that ride with it (`_riders`) inside its activity, before it."""
        if last is None:
            return list(await asyncio.gather(*(self._run_tool(call) for call in calls)))
        riders = self._riders(calls, last)
        alone = [place for place in range(len(calls)) if place != last and place not in riders]
        outcomes = dict(zip(alone, await asyncio.gather(*(self._run_tool(calls[p]) for p in alone)), strict=True))
        self._riders_done = []
        outcomes[last] = await self._run_tool(calls[last], takes_snapshot=True, riders=[calls[p] for p in riders])
        done, self._riders_done = self._riders_done or [None] * len(riders), []
        for place, outcome in zip(riders, done, strict=True):  # None: the activity failed, the call runs alone
            outcomes[place] = await self._run_tool(calls[place], done=outcome)
        return [outcomes[place] for place in range(len(calls))]

    def _riders(self, calls: list[ToolCall], last: int) -> list[int]:
        """The places of the file calls that run inside the step's command's activity, before the
        command: that saves each a local activity's round in the worker and the workflow
        activation that records it (docs/fleet.md measures it). Only beside a command that takes
        the snapshot (`_snapshot_carrier`): the step's calls are then built-in, none gated; and
        only while the command's input stays small (a large write runs alone, in its own payload)."""
        if not self._calls_with_command or calls[last].name != "run_command":
            return []
        riders, size = [], len(calls[last].arguments)
        for place, call in enumerate(calls):
            if place != last and self._parses(call) and size + len(call.arguments) <= options.RIDING_MAX_CHARS:
                riders.append(place)
                size += len(call.arguments)
        return riders

    def _parses(self, call: ToolCall) -> bool:
        try:
            self._arguments(call)
        except ToolArgumentError:
            return False  # refused without running: it needs no activity
        return True

    def _arguments(self, call: ToolCall) -> dict[str, Any]:
        """The call's arguments, checked against its tool; raises ToolArgumentError."""
        enabled = self._enabled_tools()
        if call.name in self._catalog_specs():
            return decode_arguments(call.name, call.arguments, enabled)
        return parse_tool_call(call.name, call.arguments, enabled).model_dump(exclude_none=True)

    def _approval_reason(self, call: ToolCall, args: dict[str, Any]) -> str | None:
        """Why the call waits for a person's approval; None when it does not."""
        reason = approval_reason(call.name, args, self._agent.approval)
        spec = self._catalog_specs().get(call.name)
        if reason is None and spec is not None and spec.approval:
            reason = f"{call.name} asks for approval of every call"
        return reason

    async def _run_tool(
        self,
        call: ToolCall,
        takes_snapshot: bool = False,
        riders: list[ToolCall] | None = None,
        done: ToolOutcome | None = None,
    ) -> ToolOutcome:
        """`riders`: file calls run inside this call's (a command's) first activity, before it;
        `done`: this call's outcome from such an activity (it ran there)."""
        try:
            args = self._arguments(call)
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
            if done is not None:
                outcome, done = done, None
            else:
                outcome = await self._execute_tool(call, args, retry, takes_snapshot, riders)
                riders = None  # they ran with the first
            reruns = 0
            while outcome.interrupted and await self._run_again(call, args, outcome, reruns):
                retry, reruns = retry + 1, reruns + 1
                outcome = await self._execute_tool(call, args, retry, takes_snapshot)
            if outcome.interrupted:
                # A person may have been asked, and changed files, after the snapshot was taken.
                self._taken_in_a_call = None
            remember_shell(self._carry, outcome)
            if reruns:
                outcome = rerun_note(outcome, reruns, asked=self._agent.commands.on_interrupt == "ask")
            # Identical calls of one reply ran side by side: only a repeat in a later step counts.
            step = self._carry.step if self._patched(options.LIVELOCK_ACROSS_STEPS_PATCH) else None
            streak = self._carry.livelock.record(key, None if outcome.ok else outcome.error, step)
            if streak < LIVELOCK_REPEATS:
                return outcome
            self._taken_in_a_call = None  # a person decides after the call: the step takes its own
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

    def _call_input(self, call: ToolCall, args: dict[str, Any], retry: int) -> ToolCallInput:
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
            output_chars=self._carry.quota.output_chars(self._agent.context.tool_output_chars),
        )
        if self._patched(options.RUN_FILES_PATCH):
            request = request.model_copy(update={"run_folder": self._run_folder(), "step": self._carry.step})
        return request

    async def _execute_tool(
        self,
        call: ToolCall,
        args: dict[str, Any],
        retry: int,
        takes_snapshot: bool = False,
        riders: list[ToolCall] | None = None,
    ) -> ToolOutcome:
        request = self._call_input(call, args, retry)
        if call.name == "delegate":
            return await self._delegate(f"{self._carry.step}:{call.id}", request.idempotency_key, args)
        summary = None
        if call.name == "run_command":
            args = self._clip_command(args, options.DEFAULT_COMMAND_TIMEOUT_S)
            request = request.model_copy(
                update={"sandbox": self._agent.sandbox, "env_allow": self._agent.env_allow, "arguments": args}
            )
            request = with_shell(request, self._agent, self._carry, self._patched)
            if riders:
                parsed = [(r, self._arguments(r)) for r in riders]
                riding = [RidingCall(tool=r.name, call=self._call_input(r, a, 0)) for r, a in parsed]
                request = request.model_copy(update={"riding": riding})
                summary = _command_summary(args, [call_summary(r.name, a) for r, a in parsed])
        if (spec := self._catalog_specs().get(call.name)) is not None:
            update = {"step": self._carry.step, "mcp": spec.mcp} if spec.mcp else {"step": self._carry.step}
            return await self._call_catalog_tool(spec, request.model_copy(update=update), args)
        try:
            if call.name == "recall":
                return await self._recall(RecallArgs.model_validate(args))
            if call.name == "plan":
                return self._plan_tool(args)
            if takes_snapshot:
                self._taken_in_a_call = None  # an earlier run of the call took one: this run's effects are not in it
                request = request.model_copy(update={"snapshot": self._snapshot_request()})
            outcome = await self._builtin_activity(call.name, request, args, summary or call_summary(call.name, args))
            if takes_snapshot:
                self._taken_in_a_call = outcome.snapshot
            if riders and len(outcome.riding) == len(riders):
                self._riders_done = list(outcome.riding)
            return outcome.model_copy(update={"riding": []})
        except ACTIVITY_FAILED as e:
            raise_if_cancelled(e)
            return ToolOutcome(ok=False, error=f"{call.name} failed: {failure_message(e)}")

    async def _builtin_activity(
        self, name: str, request: ToolCallInput, args: dict[str, Any], summary: str
    ) -> ToolOutcome:
        """A built-in tool's activity: on the run's host if it has one, the fast file tools as
        local activities, the rest (commands) as regular ones that heartbeat."""
        timeout = options.tool_start_to_close(name, args.get("timeout_s")) + options.RIDING_CALL_TIME * len(
            request.riding
        )
        local = name in options.LOCAL_TOOLS and self._patched(options.LOCAL_TOOLS_PATCH)
        if self._agent.host is not None:
            on_host = self._here_or_on_host if local else self._on_host
            return await on_host(
                name,
                request,
                ToolOutcome,
                timeout,
                summary,
                heartbeat=options.HEARTBEAT_TIMEOUT,
                cancellation=options.TOOL_CANCELLATION,
            )
        if local:
            return await workflow.execute_local_activity(
                name,
                request,
                result_type=ToolOutcome,
                start_to_close_timeout=options.TOOL_START_TO_CLOSE,
                retry_policy=options.TOOL_RETRY,
                local_retry_threshold=options.LOCAL_RETRY_THRESHOLD,
                summary=summary,
            )
        return await workflow.execute_activity(
            name,
            request,
            result_type=ToolOutcome,
            start_to_close_timeout=timeout,
            heartbeat_timeout=options.HEARTBEAT_TIMEOUT,
            retry_policy=options.TOOL_RETRY,
            cancellation_type=options.TOOL_CANCELLATION,
            summary=summary,
        )

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
            key,
            args["goal"],
            args.get("tools"),
            args.get("budget_share"),
            args.get("agent"),
            args.get("host"),
            parent,
            wait_problem,
        )
        self._publish()
        return outcome

    async def _await_approval(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome | None:
        """Waits for a person when the call is gated; returns the denial, or None to run it."""
        reason = self._approval_reason(call, args)
        if reason is None:
            return None
        approval_id = approval_key(self._carry.step, call.id)
        shown = approval_view(call.name, args)
        if call.name in DIFFED_TOOLS and self._patched(options.APPROVAL_DIFF_PATCH):
            shown = "\n".join(
                [
                    shown,
                    *await approval_diff_lines(
                        self._agent.workspace, call.name, args, workspace_queue(self._agent.host)
                    ),
                ]
            )
        self._pending_approvals[approval_id] = PendingApproval(
            call_id=approval_id,
            tool=call.name,
            summary=call_summary(call.name, args),
            step=self._carry.step,
            reason=reason,
            shown=shown,
        )
        self._list_in_call_order()
        self._publish()
        with self._waiting_for_a_person():
            decision = await self._wait_for_decision(approval_id)
        del self._pending_approvals[approval_id]
        self._publish()
        if decision.approved:
            return None
        return ToolOutcome(ok=False, error=f"{NOT_RUN}denied by a person: {decision.note or 'no reason given'}")

    def _list_in_call_order(self) -> None:
        """Each approval waits for its diff, and diffs finish in any order: a person reads the
        step's approvals in the order the model asked for them."""
        place = lambda item: self._call_positions.get(item[0], 0)  # noqa: E731
        self._pending_approvals = dict(sorted(self._pending_approvals.items(), key=place))

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


def _command_summary(args: dict[str, Any], riders: list[str]) -> str:
    """A command's line in the Web UI with the file calls that ran before it in its activity:
    `run_command: pytest -q (after write_file: a.py)`, or their count when that is too long."""
    after = f" (after {'; '.join(riders)})"
    if len(after) > SUMMARY_MAX_CHARS // 2 or len(after.encode()) != len(after):
        after = f" (after {len(riders)} file call{'s' if len(riders) > 1 else ''})"
    text = call_summary("run_command", args, limit=SUMMARY_MAX_CHARS - len(after)) + after
    return text if len(text.encode()) <= SUMMARY_MAX_BYTES else call_summary("run_command", args)


def _mcp_down(error: BaseException) -> bool:
    """Whether the catalog failed because an MCP server could not be started or reached (a
    local activity's error comes as it was raised, a regular one's as the ActivityError's cause)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__
    return cause is not None and cause.type == "McpUnavailable"
