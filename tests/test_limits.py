"""Every limit and budget through its soft and hard tier, counted from stub usage numbers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import render
from durable_agent.model_server import ModelServer, Reply, is_summary_request
from tests.helpers import start
from tests.scripts import Script
from workflows.status_view import details_markdown
from workflows.types import AgentStatus, Message


def always_tools(count: int = 1, delay_s: float = 0.0, **usage: int):
    """A model that never finishes: `count` cheap tool calls per turn."""

    def respond(request: dict[str, Any]) -> Reply:
        if delay_s:
            time.sleep(delay_s)
        return Reply(tool_calls=[("list_files", {})] * count, **usage)

    return respond


CASES = {
    "steps": ({"soft_steps": 2, "hard_steps": 6}, {}, "hard_step_limit"),
    "tokens": ({"max_tokens": 20_000}, {"input_tokens": 500, "output_tokens": 500}, "token_budget"),
    "cost": ({"max_cost_usd": 0.1}, {"input_tokens": 20_000, "output_tokens": 1_000}, "cost_budget"),
    "model_calls": ({"max_model_calls": 5}, {}, "model_call_budget"),
    "tool_calls": ({"max_tool_calls": 7}, {}, "tool_call_budget"),
}


LADDER = ["compaction", "soft_warning", "fallback_model", "stop"]


@pytest.mark.parametrize("name", list(CASES))
async def test_soft_then_hard_tier(
    name: str, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    limits, usage, reason = CASES[name]
    model_server.responder = always_tools(count=2 if name == "tool_calls" else 1, **usage)
    handle = await start(
        client,
        task_queue,
        goal="never ends",
        workspace=str(workspace),
        model="gpt-4.1-mini",
        fallback_model="gpt-4.1-nano",
        limits=limits,
    )
    result = await handle.result()
    assert result.state == "stopped" and result.stop_reason == reason
    assert result.unfinished and "never ends" in result.unfinished[0]
    assert result.output  # a summary, since the model never answered

    status = await handle.query("status", result_type=AgentStatus)
    # The ladder, in its order: compaction, wrap-up warning, fallback model, stop; each
    # rung once, each recorded in status and in the transcript.
    rungs = [d.kind for d in status.degradations]
    assert rungs == [r for r in LADDER if r in rungs] and rungs[0] == "compaction" and rungs[-1] == "stop"
    transcript = await handle.query("transcript", result_type=list[Message])
    notes = [m for m in transcript if m.kind in ("degradation", "warning", "compaction")]
    # A compaction that folded steps is noted with its summary; one with nothing to fold, briefly.
    noted = {"soft_warning": {"warning"}, "compaction": {"compaction", "degradation"}}
    assert len(notes) == len(rungs)
    assert all(m.kind in noted.get(r, {"degradation"}) for m, r in zip(notes, rungs, strict=True))
    assert all("Budget warning" in (m.content or "") for m in notes if m.kind == "warning")
    agent_requests = [r for r in model_server.requests if not is_summary_request(r)]
    sent = [m.get("content") or "" for r in agent_requests for m in r["messages"]]
    assert not any("switched from" in text for text in sent)  # a record for people, not the model
    if "fallback_model" in rungs:
        switched_at = next(d.step for d in status.degradations if d.kind == "fallback_model")
        models = [r["model"] for r in agent_requests]
        assert set(models[:switched_at]) == {"gpt-4.1-mini"}
        assert models[switched_at:] and set(models[switched_at:]) == {"gpt-4.1-nano"}
    if name == "steps":  # a wide soft tier: every rung, one step apart
        assert [(d.kind, d.step) for d in status.degradations] == [
            ("compaction", 2),
            ("soft_warning", 4),
            ("fallback_model", 5),
            ("stop", 6),
        ]

    u, lim = result.usage, status.limits
    if name == "tokens":
        assert u.tokens <= lim.max_tokens  # pre-charged: never overshot
    if name == "model_calls":
        assert u.model_calls == lim.max_model_calls
    if name == "tool_calls":
        assert u.tool_calls <= lim.max_tool_calls and any("tool call not run" in x for x in result.unfinished)
    if name == "steps":
        assert result.steps == lim.hard_steps


async def test_time_limit(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = always_tools(delay_s=0.5)
    limits = {"max_duration_s": 6, "soft_ratio": 0.1}
    handle = await start(client, task_queue, goal="slow", workspace=str(workspace), limits=limits)
    result = await asyncio.wait_for(handle.result(), 120)
    assert result.stop_reason == "time_limit" and result.usage.elapsed_s >= 6
    # Prompt, by the run's own record: no model call was scheduled after the 6 s were up,
    # and the run closed in the task that first saw them up (no step after that).
    # A call's time is when its workflow task started (the workflow's own clock, `workflow.now()`),
    # not when the server recorded the task's commands; the run's clock starts at its first task.
    events = (await handle.fetch_history()).events
    started = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    decided_at, began, calls = None, None, []
    for e in events:
        if e.event_type == started:
            decided_at = e.event_time.ToDatetime()
            began = began or decided_at
        elif e.activity_task_scheduled_event_attributes.activity_type.name == "call_model":
            calls.append((decided_at - began).total_seconds())
    assert calls and max(calls) <= 6, calls
    status = await handle.query("status", result_type=AgentStatus)
    assert any(d.kind == "soft_warning" and d.detail.startswith("time") for d in status.degradations), status


async def test_preset_and_runway(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = always_tools()
    handle = await start(
        client, task_queue, goal="qa", workspace=str(workspace), limits={"preset": "simple_qa", "max_tool_calls": 5}
    )
    result = await handle.result()
    status = await handle.query("status", result_type=AgentStatus)
    assert status.limits.max_model_calls == 3 and status.limits.max_tokens == 5_000
    assert status.limits.max_tool_calls == 5  # the explicit field beats the preset
    assert result.stop_reason in {"model_call_budget", "hard_step_limit"} and result.usage.model_calls == 3
    assert status.runway.steps == 0


async def test_unknown_model_price_is_reported(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = lambda request: Reply(content="hi")
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), model="local-llama")
    result = await handle.result()
    assert result.usage.cost_usd == 0 and result.usage.cost_known is False


async def test_a_spike_enters_the_soft_tier_early(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
        if turn == 5:
            return Reply(content="done", input_tokens=100, output_tokens=10)
        big = turn == 4
        return Reply(tool_calls=[("list_files", {})], input_tokens=5_000 if big else 100, output_tokens=10)

    model_server.responder = respond
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), fallback_model="cheap")
    result = await handle.result()
    assert result.state == "completed"
    status = await handle.query("status", result_type=AgentStatus)
    # The spike starts the ladder at its first rung (nothing to fold yet in five steps);
    # the fallback model waits for its own rung.
    assert [(d.kind, d.step) for d in status.degradations] == [("early_soft_tier", 5), ("compaction", 5)]
    assert model_server.requests[-1]["model"] == "gpt-4.1-mini"


async def test_replies_without_usage_are_estimated_said_so_and_count_against_the_token_budget(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # An endpoint that reports no usage: counted as 0 tokens, the budget would never trip.
    write = Reply(tool_calls=[("write_file", {"path": "big.txt", "content": "x" * 8_000})], no_usage=True)
    model_server.responder = Script([write] + [Reply(tool_calls=[("list_files", {})], no_usage=True)] * 20)
    handle = await start(
        client, task_queue, goal="no usage", workspace=str(workspace), limits={"max_tokens": 12_000, "hard_steps": 20}
    )
    result = await asyncio.wait_for(handle.result(), 120)
    usage = result.usage
    assert result.stop_reason == "token_budget", result
    assert usage.estimated_calls == usage.model_calls >= 3
    # Every call after the first sent the 8,000 characters written (about 2,000 tokens).
    assert usage.input_tokens >= 2_000 * (usage.model_calls - 1) and usage.output_tokens >= 2_000
    status = await handle.query("status", result_type=AgentStatus)
    assert status.usage.estimated_calls == usage.model_calls
    said = f"(estimated for {usage.model_calls} model calls without usage)"
    assert said in render.full_usage_text(usage) and said in render.usage_text(status.usage)
    assert f"~ tokens estimated for {usage.model_calls} model calls" in details_markdown(status)
