"""1,000 steps in a bounded context: request size, carry size and history bytes per step.

`python -m bench long-run [--steps 1000] [--every 50] [--max-context-tokens 4000]`: one run
of `steps` steps against the stub model, a worker SIGKILLed (and replaced) half-way, a
continue-as-new every `every` steps. Each step runs one command whose output is ~100
tokens; step 5 prints a fact, and 100 steps before the end (at 90 % of a shorter run) the
model asks `recall` for it. The stub reports input tokens as its JSON's length / 4.

Reported: the request the model was sent at steps 50, 200 and 1,000 (tokens as reported,
and the largest up to there), the carry handed on at the last continue-as-new before each,
the history bytes per step of the run holding each; the tokens spent on compaction; the
offline estimate against the reported input tokens; whether the usage the run reports is
exactly what the stub reported (each distinct request counted once: a kill repeats one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import EventType

from bench.harness import bench, bench_input
from durable_agent.connection import connect
from durable_agent.model_server import Reply, count_assistant_turns, is_summary_request, stub_summary
from durable_agent.runs import chain_histories, start_agent
from workflows.context import calibrated, estimate_tokens
from workflows.types import AgentStatus, Message, ToolCall

FACT = "FACT: the vault code is 7319-ALPHA"
PADDING = "x" * 360
STEP_OUTPUT_TOKENS = 20
FINAL_OUTPUT_TOKENS = 10


class LongRunScript:
    """The long run's model: a command a step, the fact at `fact_at`, `recall` at `recall_at`."""

    def __init__(self, steps: int, fact_at: int = 5, recall_at: int | None = None) -> None:
        self.steps = steps
        self.fact_at = fact_at
        self.recall_at = recall_at or max(fact_at + 1, steps - 100 if steps >= 500 else int(steps * 0.9))
        self.found_at: int | None = None
        """The step whose request held the recalled fact (the one after `recall_at`)."""
        self.hooks: dict[int, Any] = {}
        """step -> callable run (in the HTTP thread) when that step's model call is first asked for."""

    def __call__(self, request: dict[str, Any]) -> Reply:
        step = count_assistant_turns(request) + 1
        hook = self.hooks.pop(step, None)
        if hook is not None:
            hook()
        if step == self.recall_at + 1:
            tool_results = [m.get("content") or "" for m in request["messages"] if m["role"] == "tool"]
            if tool_results and FACT in tool_results[-1]:
                self.found_at = step
        if step > self.steps:
            return Reply(content=f"finished {self.steps} steps", output_tokens=FINAL_OUTPUT_TOKENS)
        if step == self.recall_at:
            return Reply(tool_calls=[("recall", {"query": "vault code"})], output_tokens=STEP_OUTPUT_TOKENS)
        line = FACT if step == self.fact_at else f"step {step}"
        return Reply(
            tool_calls=[("run_command", {"command": f"echo '{line} {PADDING}'"})], output_tokens=STEP_OUTPUT_TOKENS
        )


@dataclass
class LongRun:
    steps: int
    result: dict[str, Any]
    status: AgentStatus
    requests: list[dict[str, Any]]
    """Every request the stub got, in order (a kill repeats one)."""
    carries: list[tuple[int, int]] = field(default_factory=list)
    """(step at the continue-as-new, bytes of the carried input)."""
    carried: list[dict[str, Any]] = field(default_factory=list)
    """Each continue-as-new's carry, decoded from history."""
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    """(first step, last step, history bytes) of each run of the chain."""
    found_at: int | None = None
    kills: int = 0
    wall_s: float = 0.0


async def run_long(steps: int, every: int, max_context_tokens: int, keep_recent_steps: int = 6) -> LongRun:
    script = LongRunScript(steps)
    workflow_id = f"long-run-{steps}"
    kills = 0
    with bench(script) as b:

        def kill_and_replace() -> None:
            nonlocal kills
            b.kill_worker(b.workers[-1])
            b.start_worker()
            kills += 1

        script.hooks[steps // 2] = kill_and_replace
        b.start_worker()
        client = await connect(b.server.address)
        agent = bench_input(
            "long run: print the steps",
            b.workspace(),
            steps + 1,
            continue_as_new_every=every,
            context={"max_context_tokens": max_context_tokens, "keep_recent_steps": keep_recent_steps},
        )
        agent.limits.max_model_calls = 2 * steps + 20  # summaries are model calls too
        started = time.perf_counter()
        handle = await start_agent(client, agent, workflow_id, b.task_queue)
        result = await handle.result()
        wall = time.perf_counter() - started
        status = await handle.query("status", result_type=AgentStatus)
        histories = await chain_histories(client, workflow_id)
        requests = list(b.model.requests)
    run = LongRun(steps, result.model_dump(), status, requests, found_at=script.found_at, kills=kills, wall_s=wall)
    first = 1
    for history in histories:
        size = sum(event.ByteSize() for event in history.events)
        last_event = history.events[-1]
        if last_event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            payload = last_event.workflow_execution_continued_as_new_event_attributes.input.payloads[0].data
            carry = json.loads(payload)["carry"]
            step = carry["step"]
            run.carries.append((step, len(payload)))
            run.carried.append(carry)
        else:
            step = result.steps
        run.runs.append((first, step, size))
        first = step + 1
    return run


def agent_requests(requests: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The request of each step (the last one sent, if a kill repeated it)."""
    return {count_assistant_turns(r) + 1: r for r in requests if not is_summary_request(r)}


def reported_input(request: dict[str, Any]) -> int:
    """What the stub reports as input tokens (durable_agent/model_server.py)."""
    return len(json.dumps(request.get("messages", []))) // 4


def as_messages(wire: list[dict[str, Any]]) -> list[Message]:
    return [
        Message(
            role=m["role"],
            content=m.get("content"),
            tool_call_id=m.get("tool_call_id"),
            tool_calls=[
                ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                for c in m.get("tool_calls") or []
            ],
        )
        for m in wire
    ]


def expected_usage(requests: list[dict[str, Any]], steps: int) -> dict[str, int]:
    """The usage the stub reported, each distinct request once."""
    distinct = {json.dumps(r, sort_keys=True): r for r in requests}.values()
    usage = {"input_tokens": 0, "output_tokens": 0, "model_calls": 0}
    for request in distinct:
        usage["input_tokens"] += reported_input(request)
        usage["model_calls"] += 1
        if is_summary_request(request):
            usage["output_tokens"] += len(stub_summary(request).content or "") // 4 + 1
        elif count_assistant_turns(request) + 1 > steps:
            usage["output_tokens"] += FINAL_OUTPUT_TOKENS
        else:
            usage["output_tokens"] += STEP_OUTPUT_TOKENS
    return usage


def estimate_accuracy(by_step: dict[int, dict[str, Any]]) -> dict[str, float]:
    """The offline estimate (raw, and calibrated by the previous call's report) against the
    input tokens the stub reported, over every agent request."""
    raw_ratios: list[float] = []
    calibrated_errors: list[float] = []
    previous: tuple[int, int] | None = None
    for step in sorted(by_step):
        request = by_step[step]
        raw = estimate_tokens(as_messages(request["messages"]))
        reported = reported_input(request)
        raw_ratios.append(raw / reported)
        if previous is not None:
            guess = calibrated(raw, previous[0], previous[1])
            calibrated_errors.append(abs(guess - reported) / reported)
        previous = (raw, reported)
    return {
        "raw_over_reported_mean": round(statistics.mean(raw_ratios), 3),
        "raw_over_reported_min": round(min(raw_ratios), 3),
        "raw_over_reported_max": round(max(raw_ratios), 3),
        "calibrated_abs_error_mean_pct": round(100 * statistics.mean(calibrated_errors), 2),
        "calibrated_abs_error_max_pct": round(100 * max(calibrated_errors), 2),
    }


def figures(run: LongRun, marks: list[int]) -> dict[str, Any]:
    by_step = agent_requests(run.requests)
    tokens = {step: reported_input(r) for step, r in by_step.items()}
    context = run.status.context
    assert context is not None
    at: dict[int, dict[str, Any]] = {}
    for mark in marks:
        carried = [size for step, size in run.carries if step <= mark]
        holding = next((r for r in run.runs if r[0] <= mark <= r[1]), None)
        at[mark] = {
            "request_tokens": tokens.get(mark),
            "request_bytes": len(json.dumps(by_step[mark])) if mark in by_step else None,
            "largest_request_tokens_so_far": max(t for s, t in tokens.items() if s <= mark),
            "carry_bytes_at_last_continue_as_new": carried[-1] if carried else None,
            "history_bytes_per_step_of_its_run": round(holding[2] / (holding[1] - holding[0] + 1)) if holding else None,
        }
    per_run = [round(size / (last - first + 1)) for first, last, size in run.runs]
    counters = context.counters
    usage = {k: run.result["usage"][k] for k in ("input_tokens", "output_tokens", "model_calls")}
    return {
        "steps": run.result["steps"],
        "state": run.result["state"],
        "wall_s": round(run.wall_s, 1),
        "worker_kills": run.kills,
        "continue_as_new_boundaries": len(run.carries),
        "max_context_tokens": context.max_context_tokens,
        "largest_request_tokens": max(tokens.values()),
        "at_step": at,
        "carry_bytes": [size for _, size in run.carries],
        "history_bytes_per_step_by_run": per_run,
        "compaction": {
            "compactions": counters.compactions,
            "folded_steps": counters.folded_steps,
            "summary_tokens": counters.summary_tokens,
            "extractive_summaries": counters.extractive_summaries,
            "share_of_all_tokens_pct": round(
                100 * counters.summary_tokens / (usage["input_tokens"] + usage["output_tokens"]), 1
            ),
        },
        "estimate_vs_reported": estimate_accuracy(by_step),
        "usage": usage,
        "usage_reported_by_stub": expected_usage(run.requests, run.steps),
        "fact_from_step_5_recalled_at_step": run.found_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50, help="continue-as-new every N steps")
    parser.add_argument("--max-context-tokens", type=int, default=4000)
    args = parser.parse_args()
    run = asyncio.run(run_long(args.steps, args.every, args.max_context_tokens))
    marks = [m for m in (50, 200, 1000) if m <= args.steps]
    print(json.dumps(figures(run, marks), indent=2), flush=True)
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
