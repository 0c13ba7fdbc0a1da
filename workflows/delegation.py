"""`delegate`: a child `AgentWorkflow` with its own context, limits carved from the parent's.

The parent side (`Delegates`) starts each delegate as a child workflow whose id is the
call's idempotency key, so a retried or replayed call never starts a second one; the
Web UI lists it under the parent's Relationships. Its limits are a share of what the
parent has left, minus what running delegates already hold, before it starts; its usage
is charged to the parent when it ends (the last reported spend, if the parent ends
first). The parent gets the child's five-field summary and output, never its transcript.
Pause and resume are forwarded to running delegates; cancelling the parent cancels them
and waits for their partial results; a parent that closes any other way asks them to
cancel (parent-close policy). While it waits, the parent watches the delegate's reports
for a cycle of waits or a stall (the delegate waits on something, with no progress, for
`delegation.stall_after_s`) and then needs attention, with the wait chain as its report.

The child side (`ParentReporter`) signals `child_report` to its parent whenever its state,
step, spend or waits change, so the parent's status shows them live.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError

from workflows.status_view import start_details
from workflows.summary import StructuredSummary
from workflows.types import (
    WORKFLOW_TYPE,
    AgentInput,
    AgentResult,
    AgentStatus,
    ChildReport,
    ChildRun,
    Limits,
    ParentLink,
    PauseRequest,
    Resolution,
    ToolOutcome,
    Usage,
    WaitLink,
)
from workflows.wait_graph import chain_text, find_cycle

DEFAULT_BUDGET_SHARE = 0.5
MIN_CHILD_TOKENS = 2_000
"""A delegate gets at least this many tokens, or the call is refused: a share too small to
finish anything would only spend the parent's budget on a partial result."""
CHILD_OUTPUT_CHARS = 8_000


class DelegateRefused(ValueError):
    """The delegate call cannot run; the message is meant for the model."""


def child_workflow_id(idempotency_key: str) -> str:
    """The delegate's workflow id: the call's idempotency key (first run id, step, call id),
    unique across retries and continue-as-new, so the child is started at most once."""
    return idempotency_key


def child_tools(parent: AgentInput, requested: list[str] | None) -> list[str]:
    """The delegate's tools: a subset of the parent's; no `delegate` at the deepest level."""
    allowed = parent.enabled_tools()
    tools = list(requested) if requested is not None else allowed
    outside = [t for t in tools if t not in allowed]
    if outside:
        raise DelegateRefused(f"tools {outside} are not among this run's tools: {allowed}")
    depth = parent.parent.depth if parent.parent else 0
    if depth + 1 >= parent.delegation.max_depth:
        tools = [t for t in tools if t != "delegate"]
    return tools


def carve_limits(limits: Limits, usage: Usage, elapsed_s: float, reserved: list[Limits], share: float) -> Limits:
    """The delegate's limits: `share` of what the parent has left, after what running
    delegates hold. Time is not shared (delegates run in parallel): it gets what is left."""
    tokens = int((limits.max_tokens - usage.tokens - sum(r.max_tokens for r in reserved)) * share)
    cost = round((limits.max_cost_usd - usage.cost_usd - sum(r.max_cost_usd for r in reserved)) * share, 6)
    calls = int((limits.max_model_calls - usage.model_calls - sum(r.max_model_calls for r in reserved)) * share)
    tool_calls = int((limits.max_tool_calls - usage.tool_calls - sum(r.max_tool_calls for r in reserved)) * share)
    seconds = limits.max_duration_s - elapsed_s
    short = [
        what
        for what, missing in (
            (f"tokens ({tokens:,} < {MIN_CHILD_TOKENS:,})", tokens < MIN_CHILD_TOKENS),
            (f"model calls ({calls})", calls < 1),
            (f"cost (${cost:g})", cost <= 0),
            (f"time ({seconds:.0f} s)", seconds < 1),
        )
        if missing
    ]
    if short:
        raise DelegateRefused(f"not enough budget left to delegate (share {share:g}): {', '.join(short)}")
    return Limits(
        max_tokens=tokens,
        max_cost_usd=cost,
        max_model_calls=calls,
        max_tool_calls=max(0, tool_calls),
        max_duration_s=seconds,
        hard_steps=limits.hard_steps,
        soft_steps=limits.soft_steps,
        soft_ratio=limits.soft_ratio,
    )


def child_input(
    parent: AgentInput,
    goal: str,
    tools: list[str],
    limits: Limits,
    model: str,
    link: ParentLink,
    agent: str | None,
    host: str | None = None,
) -> AgentInput:
    """With `agent`, the child runs that agent file within these fields as bounds (workflows/agents.py).
    The child is pinned to the parent's host unless it names another (`host`): its workspace is
    then the folder at the same path on that host (workflows/hosts.py)."""
    return AgentInput(
        agent=agent,
        goal=goal,
        workspace=parent.workspace,
        model=model,
        fallback_model=parent.fallback_model,
        tools=tools,
        limits=limits,
        approval=parent.approval,
        context=parent.context,
        continue_as_new_every=parent.continue_as_new_every,
        delegation=parent.delegation,
        parent=link,
        host=host or parent.host,
    )


def charge(usage: Usage, spent: Usage) -> None:
    """Adds a delegate's spend to the parent's usage (not its wall time: the parent's own)."""
    usage.input_tokens += spent.input_tokens
    usage.output_tokens += spent.output_tokens
    usage.model_calls += spent.model_calls
    usage.tool_calls += spent.tool_calls
    usage.cost_usd = round(usage.cost_usd + spent.cost_usd, 8)
    usage.cost_known = usage.cost_known and spent.cost_known
    usage.estimated_calls += spent.estimated_calls
    usage.done_checks += spent.done_checks


def outcome_of(child_id: str, result: AgentResult) -> ToolOutcome:
    """What the parent's model gets: the state, the spend, the five-field summary, the output."""
    u = result.usage
    head = (
        f"delegate {child_id}: {result.state} ({result.stop_reason}) after {result.steps} step(s); "
        f"spent {u.tokens:,} tokens, ${u.cost_usd:.4f}, {u.model_calls} model and {u.tool_calls} tool call(s)"
    )
    summary = result.summary or StructuredSummary(
        goal="", inputs=[], outputs=[], key_decisions=[], open_issues=result.unfinished
    )
    output = result.output if len(result.output) <= CHILD_OUTPUT_CHARS else result.output[:CHILD_OUTPUT_CHARS] + "…"
    text = f"{head}\nsummary: {summary.model_dump_json()}\noutput:\n{output}"
    if result.state in ("completed", "stopped"):
        return ToolOutcome(ok=True, output=text)  # a stopped delegate's partial result is still a result
    return ToolOutcome(ok=False, error=text)


AttentionHandler = Callable[[str, str], Awaitable[Resolution]]
"""Asks a person (needs_attention) with what failed and the detail; returns their decision."""

WAIT_ACTIONS = [
    "retry: keep waiting (after unblocking the end of the chain, e.g. with the command shown)",
    "skip: cancel the delegate and give the model its partial result",
    "terminate: finish the run now with a partial result",
]


@dataclass
class ParentSide:
    """What a delegate call needs from its parent run; `usage` is charged in place."""

    agent: AgentInput
    limits: Limits
    usage: Usage
    elapsed_s: float
    model: str


class Delegates:
    """A run's delegates: running children, their live reports, and what they have cost."""

    def __init__(self) -> None:
        self.running: dict[str, ChildRun] = {}
        self._handles: dict[str, workflow.ChildWorkflowHandle] = {}
        self._progress_at: dict[str, float] = {}
        self._signals: list[asyncio.Task[None]] = []
        self._charged: dict[str, bool] = {}

    def reserved(self) -> list[Limits]:
        return [child.limits for child in self.running.values()]

    def check_fan_out(self, agent: AgentInput) -> None:
        depth = agent.parent.depth if agent.parent else 0
        if depth >= agent.delegation.max_depth:
            raise DelegateRefused(
                f"delegation depth limit reached: this run is at depth {depth} "
                f"(delegation.max_depth {agent.delegation.max_depth})"
            )
        if len(self.running) >= agent.delegation.max_children:
            raise DelegateRefused(
                f"fan-out limit reached: {len(self.running)} delegates already running "
                f"(delegation.max_children {agent.delegation.max_children}); wait for their results"
            )

    async def run(
        self,
        key: str,
        goal: str,
        tools: list[str] | None,
        budget_share: float | None,
        agent_name: str | None,
        host: str | None,
        parent: ParentSide,
        on_wait_problem: AttentionHandler,
    ) -> ToolOutcome:
        """Runs one delegate call to its end; its spend is charged to `parent.usage`."""
        agent = parent.agent
        try:
            self.check_fan_out(agent)
            carved = carve_limits(
                parent.limits, parent.usage, parent.elapsed_s, self.reserved(), budget_share or DEFAULT_BUDGET_SHARE
            )
            depth = (agent.parent.depth if agent.parent else 0) + 1
            link = ParentLink(workflow_id=workflow.info().workflow_id, depth=depth)
            child = child_input(agent, goal, child_tools(agent, tools), carved, parent.model, link, agent_name, host)
        except DelegateRefused as e:
            return ToolOutcome(ok=False, error=str(e))
        child_id = child_workflow_id(key)
        self.running[child_id] = ChildRun(workflow_id=child_id, goal=goal, limits=carved)
        self._progress_at[child_id] = _now_s()
        charged = False
        try:
            handle = await workflow.start_child_workflow(
                WORKFLOW_TYPE,
                child,
                id=child_id,
                task_queue=workflow.info().task_queue,
                result_type=AgentResult,
                parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
                cancellation_type=workflow.ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                task_timeout=workflow.info().task_timeout,
                static_summary=goal[:400],
                static_details=start_details(child),
            )
            self._handles[child_id] = handle
            result = await self._await(handle, agent.delegation.stall_after_s, parent.usage, on_wait_problem)
            charge(parent.usage, result.usage)
            charged = True
            return outcome_of(child_id, result)
        except ChildWorkflowError as e:
            return ToolOutcome(ok=False, error=f"delegate {child_id} failed: {e.cause or e}")
        finally:
            # Unless its result was charged (here, or on cancel in _await), its last reported spend is.
            child = self.running.pop(child_id, None)
            if child is not None and not charged and not self._charged.pop(child_id, False):
                charge(parent.usage, child.usage)
            self._handles.pop(child_id, None)
            self._progress_at.pop(child_id, None)

    async def _await(
        self, handle: workflow.ChildWorkflowHandle, stall_s: float, usage: Usage, on_wait_problem: AttentionHandler
    ) -> AgentResult:
        child_id = handle.id
        while True:
            # Wake when the delegate would have been quiet for stall_s (progress moves it on).
            quiet_s = _now_s() - self._progress_at[child_id]
            timeout = timedelta(seconds=stall_s - quiet_s if quiet_s < stall_s else stall_s)
            try:
                await workflow.wait_condition(
                    lambda: handle.done() or self._cycle(child_id) is not None, timeout=timeout
                )
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                # The parent is cancelled: cancel the delegate and wait for its partial result,
                # so that its spend is charged exactly; then let the cancellation go on.
                handle.cancel()
                partial = await _result_or_none(handle)
                if partial is not None:
                    charge(usage, partial.usage)
                    self._charged[child_id] = True
                raise
            if handle.done():
                return await handle
            problem = self._wait_problem(child_id, stall_s)
            if problem is None:
                continue
            resolution = await on_wait_problem(*problem)
            self._progress_at[child_id] = _now_s()
            if resolution.action == "skip":
                handle.cancel()
                return await handle

    def charge_running(self, usage: Usage) -> list[str]:
        """When the parent ends before its delegates (terminated): charges their last reported
        spend, and says which were still running (they are asked to cancel as it closes)."""
        still = [f"delegate still running: {c.workflow_id} ({c.goal[:200]})" for c in self.running.values()]
        for child in self.running.values():
            charge(usage, child.usage)
        self.running.clear()
        return still

    def _cycle(self, child_id: str) -> list[WaitLink] | None:
        """A chain through this delegate that comes back to a run already in it (this one included)."""
        child = self.running.get(child_id)
        if child is None:
            return None
        return find_cycle([[self._waiting_on(child_id), *chain] for chain in child.wait_chains])

    def _waiting_on(self, child_id: str) -> WaitLink:
        return WaitLink(workflow_id=workflow.info().workflow_id, waiting_for=f"delegate {child_id}")

    def _wait_problem(self, child_id: str, stall_s: float) -> tuple[str, str] | None:
        child = self.running[child_id]
        cycle = self._cycle(child_id)
        if cycle is not None:
            return "a cycle of waits (deadlock)", chain_text(cycle)
        if child.wait_chains and _now_s() - self._progress_at[child_id] >= stall_s:
            chain = [self._waiting_on(child_id), *child.wait_chains[0]]
            return f"delegate {child_id} has made no progress for {stall_s:g} s", chain_text(chain)
        return None

    def receive(self, report: ChildReport) -> None:
        child = self.running.get(report.workflow_id)
        if child is None or report.seq <= child.seq:
            return  # a delegate that has ended, or a report overtaken by a later one
        if (report.step, report.usage.tokens) != (child.step, child.usage.tokens):
            self._progress_at[report.workflow_id] = _now_s()
        child.seq, child.state, child.step = report.seq, report.state, report.step
        child.usage, child.activity, child.wait_chains = report.usage, report.activity, report.wait_chains

    def forward(self, signal: str, request: PauseRequest | None = None) -> None:
        """Pause or resume every running delegate (their own delegates get it from them)."""
        for handle in self._handles.values():
            if handle.done():
                continue
            send = handle.signal(signal, request) if request is not None else handle.signal(signal)
            self._signals.append(asyncio.create_task(_quietly(send)))

    async def flush(self) -> None:
        await asyncio.gather(*self._signals)
        self._signals = []


class ParentReporter:
    """A delegate's side: tells its parent (`child_report`) what it is doing, when that changes."""

    def __init__(self, parent: ParentLink | None) -> None:
        self._parent = parent
        self._seq = 0
        self._last: str | None = None
        self._signals: list[asyncio.Task[None]] = []

    def report(self, status: AgentStatus, chains: list[list[WaitLink]]) -> None:
        if self._parent is None:
            return
        report = ChildReport(
            workflow_id=workflow.info().workflow_id,
            seq=0,
            state=status.state,
            step=status.step,
            usage=status.usage.model_copy(update={"elapsed_s": 0.0}),
            activity=status.activity,
            wait_chains=chains,
        )
        fingerprint = report.model_dump_json(exclude={"seq", "activity"})
        if fingerprint == self._last:
            return
        self._last = fingerprint
        self._seq += 1
        report.seq = self._seq
        parent = workflow.get_external_workflow_handle(self._parent.workflow_id)
        self._signals.append(asyncio.create_task(_quietly(parent.signal("child_report", report))))

    async def flush(self) -> None:
        await asyncio.gather(*self._signals)
        self._signals = []


async def _quietly(send: Awaitable[None]) -> None:
    # A parent or delegate that has already closed cannot be told; nothing to do about it.
    try:
        await send
    except Exception:
        workflow.logger.debug("a delegate signal found its run closed")


async def _result_or_none(handle: workflow.ChildWorkflowHandle) -> AgentResult | None:
    try:
        return await handle
    except ChildWorkflowError:
        return None


def _now_s() -> float:
    return workflow.time()
