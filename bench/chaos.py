"""Chaos: SIGKILLed workers and restarted Temporal servers while agents run; nothing lost or doubled.

`python -m bench chaos` (or `make chaos`) runs two scenarios on a dev server with SQLite
persistence, two workers sharing the task queue:

1. one 100-step run, 20 worker SIGKILLs at random moments, 2 restarts of the dev server
   itself (one SIGKILL, one SIGTERM; a new process on the same database and port);
2. 50 concurrent agents of 20 steps under the same chaos.

A killed worker is replaced by a new process only after a random 0.5-3 s, so the surviving
worker has to take over. During the first server restart one more worker starts while the
server is down, and the server comes back only once that worker waits for it. Afterwards,
for every run: it completed; its result equals an uninterrupted run's (same output, steps,
usage); its ledger holds every step exactly once; and it made no more model calls than
its steps plus the faults it lived through (kills and restarts). Exit code 1 if any check fails.

`python -m bench chaos --soak 30`: 30 minutes of continuous runs instead (no kills), the
worker's RSS sampled throughout and reported, with whether it stayed flat.

The CI version is tests/test_chaos.py (3 kills, 1 server restart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from activities.pricing import price_of
from activities.tools.command import INTERRUPTED
from bench.harness import Bench, RecheckingScript, StepScript, bench, bench_input
from bench.observe import Recorder, ledger_check
from bench.task import goal_for
from durable_agent.connection import connect
from durable_agent.runs import start_agent
from workflows.types import AgentInput, AgentResult, ModelReply


@dataclass
class Plan:
    steps: int = 100
    agents: int = 1
    worker_kills: int = 20
    server_restarts: int = 2
    workers: int = 2
    replace_after_s: tuple[float, float] = (0.5, 3.0)
    workers_started_while_down: int = 1
    """Server restarts (the first ones) during which one more worker starts, and waits for
    the server: a replacement started during a deploy must not die (issue #29)."""
    seed: int = 1
    deadline_s: float = 900


@dataclass
class Report:
    plan: Plan
    events: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class Monkey:
    """Keeps `plan.workers` workers up and breaks things at planned points of progress."""

    def __init__(self, b: Bench, plan: Plan, recorder: Recorder) -> None:
        self.b, self.plan, self.recorder = b, plan, recorder
        self.rng = random.Random(plan.seed)
        self.live: list[Popen[bytes]] = []
        self.events: list[dict[str, Any]] = []
        self.unexpected_exits = 0
        self._replacements: set[asyncio.Task[None]] = set()
        self._gates: list[threading.Event] = []

    def start_workers(self) -> None:
        while len(self.live) < self.plan.workers:
            self.live.append(self.b.start_worker())

    def schedule(self, total_turns: int) -> list[tuple[str, int]]:
        """Each fault, at the progress (distinct turns asked for) after which it fires, and
        a gate one turn later that holds the runs until it has: on a fast machine the runs
        would otherwise finish before a slow fault (a server restart) came round."""
        kinds = ["kill"] * self.plan.worker_kills + ["restart"] * self.plan.server_restarts
        self.rng.shuffle(kinds)
        # One fault somewhere in each equal slice of the run's first 85 %.
        slices = len(kinds)
        faults = [
            (kind, math.ceil(total_turns * 0.85 * (i + self.rng.random()) / slices)) for i, kind in enumerate(kinds)
        ]
        self._gates = [self.recorder.gate(at + 1) for _, at in faults]
        return faults

    async def run(self, faults: list[tuple[str, int]]) -> None:
        try:
            for (kind, at), gate in zip(faults, self._gates, strict=True):
                await self._until(lambda at=at: self.recorder.turns_done() >= at)
                await asyncio.sleep(self.rng.uniform(0, 0.3))  # anywhere in the step: a tool, the model call
                if kind == "kill":
                    await self._kill_one()
                else:
                    await self._restart_server(len([e for e in self.events if e["kind"] == "restart"]))
                gate.set()
        finally:
            self.recorder.open_gates()

    async def _kill_one(self) -> None:
        # Kill only with every worker up, so there is always a survivor to take over.
        await self._until(lambda: self._count_live() >= self.plan.workers)
        victim = self.rng.choice(self.live)
        self.live.remove(victim)
        self.b.kill_worker(victim)
        delay = self.rng.uniform(*self.plan.replace_after_s)
        self.events.append(
            {
                "kind": "kill",
                "at": time.time(),
                "turns": self.recorder.turns_done(),
                "replaced_after_s": round(delay, 2),
            }
        )
        task = asyncio.create_task(self._replace_after(delay))
        self._replacements.add(task)
        task.add_done_callback(self._replacements.discard)

    async def _replace_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)  # the server may be restarting: the worker waits for it
        self.live.append(self.b.start_worker())

    async def _restart_server(self, done: int) -> None:
        # Alternate a crash and a clean shutdown: both must lose nothing.
        sig = signal.SIGKILL if done % 2 == 0 else signal.SIGTERM
        at = time.time()
        await asyncio.to_thread(self.b.stop_server, sig)
        started_while_down = done < self.plan.workers_started_while_down
        if started_while_down:
            await self._start_worker_while_down()
        await asyncio.to_thread(self.b.start_server_again)
        self.events.append(
            {
                "kind": "restart",
                "signal": sig.name,
                "at": at,
                "turns": self.recorder.turns_done(),
                "down_s": round(time.time() - at, 2),
                "worker_started_while_down": started_while_down,
            }
        )

    async def _start_worker_while_down(self) -> None:
        """One more worker, started once the server is gone; the server comes back only once
        the worker has tried it and is waiting (or has exited: counted as unexpected)."""
        worker = self.b.start_worker()
        self.live.append(worker)
        log = self.b.worker_log(worker)
        deadline = time.monotonic() + 60
        while worker.poll() is None and time.monotonic() < deadline:
            if "waiting for the Temporal server" in log.read_text(errors="replace"):
                return
            await asyncio.sleep(0.05)
        self._count_live()  # it exited: counted now, whatever comes after

    def _count_live(self) -> int:
        """Live workers; one that died on its own is counted (a failure: workers must ride out
        server restarts), and replaced."""
        for worker in [w for w in self.live if w.poll() is not None]:
            self.live.remove(worker)
            self.unexpected_exits += 1
            self.live.append(self.b.start_worker())
        return len(self.live)

    async def _until(self, condition: Any) -> None:
        while not condition():
            self._count_live()
            await asyncio.sleep(0.01)

    async def settle(self) -> None:
        await asyncio.gather(*self._replacements)
        self._count_live()  # a worker that died after the last fault counts too


@dataclass
class Started:
    workflow_id: str
    goal: str
    workspace: Path


async def start_runs(client: Client, b: Bench, plan: Plan, prefix: str) -> list[Started]:
    async def one(i: int) -> Started:
        started = Started(f"{prefix}-{i}", goal_for(i, plan.steps), b.workspace())
        await start_agent(
            client, bench_input(started.goal, started.workspace, plan.steps), started.workflow_id, b.task_queue
        )
        return started

    return list(await asyncio.gather(*(one(i) for i in range(plan.agents))))


async def outcome(client: Client, workflow_id: str, deadline: float) -> AgentResult | str:
    """The run's result, waiting through server restarts; an error text if it failed or hung."""
    while time.monotonic() < deadline:
        try:
            handle = client.get_workflow_handle(workflow_id, result_type=AgentResult)
            return await asyncio.wait_for(handle.result(), timeout=max(deadline - time.monotonic(), 0.1))
        except WorkflowFailureError as e:
            return f"failed: {e.cause or e}"
        except (TimeoutError, RPCError):  # the server is restarting; ask again
            await asyncio.sleep(0.5)
    return "no result before the deadline (hung?)"


def comparable(result: AgentResult) -> dict[str, Any]:
    """What must match an uninterrupted run: everything but wall-clock time (cost in
    micro-dollars, so that adding it up in another order cannot tell runs apart), the counts
    of the files the close kept (saved outputs and archive entries hold the run's id, and
    re-checks add to them; the note's wording must match), the goal in the summary (each
    agent has its own) and the summary's notes of commands that a kill interrupted (the
    model re-checks them: RecheckingScript)."""
    usage = result.usage.model_dump(exclude={"elapsed_s"})
    usage["cost_usd"] = round(usage["cost_usd"] * 1e6)
    files = re.sub(r"[\d,]+ (bytes|files)", r"N \1", result.files or "")
    summary = result.summary.model_dump() if result.summary is not None else None
    if summary is not None:
        summary["goal"] = "the run's goal"
        summary["open_issues"] = [i for i in summary["open_issues"] if INTERRUPTED not in i]
    return {
        **result.model_dump(exclude={"usage", "files", "summary"}),
        "usage": usage,
        "files": files,
        "summary": summary,
    }


def expected_result(reference: AgentResult, script: RecheckingScript, goal: str, steps: int) -> dict[str, Any]:
    """The uninterrupted run's result, plus what the model's re-checks add: each is one tool
    call the uninterrupted run did not need, and each turn from the last step's on that
    re-checks takes one more step before the final answer (see RecheckingScript)."""
    want = comparable(reference)
    rechecks = script.rechecks_of(goal)
    want["usage"]["tool_calls"] += len(rechecks)
    extra_steps = len({turn for turn, _ in rechecks if turn >= steps})
    if not extra_steps:
        return want
    if want["summary"] is not None:
        final = f"step {steps + 1}: "
        want["summary"]["key_decisions"] = [
            f"step {steps + 1 + extra_steps}: {d.removeprefix(final)}" if d.startswith(final) else d
            for d in want["summary"]["key_decisions"]
        ]
    model = AgentInput.model_fields["model"].default  # bench_input keeps the product's default
    step = ModelReply(model=model, price=price_of(model), **script.STEP_TOKENS)
    want["steps"] += extra_steps
    want["usage"]["model_calls"] += extra_steps
    want["usage"]["input_tokens"] += extra_steps * step.input_tokens
    want["usage"]["output_tokens"] += extra_steps * step.output_tokens
    want["usage"]["cost_usd"] += extra_steps * round(step.cost_usd() * 1e6)
    return want


async def run_chaos(plan: Plan) -> Report:
    report = Report(plan)
    recorder = Recorder(RecheckingScript(plan.steps))
    deadline = time.monotonic() + plan.deadline_s
    with bench(recorder) as b:
        monkey = Monkey(b, plan, recorder)
        monkey.start_workers()
        client = await connect(b.server.address)
        reference = await reference_result(client, b, plan.steps, deadline)
        recorder.clear()
        faults = monkey.schedule(plan.agents * (plan.steps + 1))
        runs = await start_runs(client, b, plan, "chaos")
        chaos = asyncio.create_task(monkey.run(faults))
        results = await asyncio.gather(*(outcome(client, r.workflow_id, deadline) for r in runs))
        chaos.cancel()
        await monkey.settle()
        report.events = monkey.events
        report.figures["unexpected_worker_exits"] = monkey.unexpected_exits
        check(report, reference, runs, results, recorder)
        on_server = await final_executions(client, b.task_queue)
        report.figures["final_executions_on_server"] = sum(on_server.values())
        expected = {r.workflow_id for r in runs} | {"reference-0"}
        if set(on_server) != expected or set(on_server.values()) != {1}:
            report.failures.append(
                f"final executions on the server {on_server}: expected one for each of {sorted(expected)}"
            )
        b.keep = not report.ok
    return report


async def reference_result(client: Client, b: Bench, steps: int, deadline: float) -> AgentResult:
    started = (await start_runs(client, b, Plan(steps=steps, agents=1), "reference"))[0]
    result = await outcome(client, started.workflow_id, deadline)
    if isinstance(result, str):
        raise RuntimeError(f"the uninterrupted reference run did not complete: {result}")
    return result


def check(report: Report, reference: AgentResult, runs: list[Started], results: list[Any], recorder: Recorder) -> None:
    script: RecheckingScript = recorder.responder  # type: ignore[assignment]
    checked = [
        check_run(report, reference, run, result, recorder, script) for run, result in zip(runs, results, strict=True)
    ]
    kills = sum(1 for e in report.events if e["kind"] == "kill")
    extra_calls = [c["model_calls"] - c["steps"] for c in checked]
    report.figures.update(
        {
            "completed": sum(1 for r in results if isinstance(r, AgentResult) and r.state == "completed"),
            "agents": report.plan.agents,
            "worker_kills": kills,
            "server_restarts": len(report.events) - kills,
            "workers_started_while_server_down": sum(1 for e in report.events if e.get("worker_started_while_down")),
            "kills_taken_over_by_the_survivor": takeovers(report.events, recorder),
            "model_calls": sum(c["model_calls"] for c in checked),
            "model_calls_beyond_steps": sum(extra_calls),
            "max_model_calls_beyond_steps_per_run": max(extra_calls, default=0),
            "commands_reported_interrupted": len(script.rechecks),
            "side_effects_duplicated": sum(c["side_effects_duplicated"] for c in checked),
            "side_effects_missing": sum(c["side_effects_missing"] for c in checked),
        }
    )
    check_chaos(report, extra_calls)


def check_run(
    report: Report, reference: AgentResult, run: Started, result: Any, recorder: Recorder, script: RecheckingScript
) -> dict[str, int]:
    """One run's checks (failures go to the report); its figures, or nothing if it did not complete."""
    if isinstance(result, str) or result.state != "completed":
        report.failures.append(f"{run.workflow_id}: {result if isinstance(result, str) else result.state}")
        return {"steps": 0, "model_calls": 0, "side_effects_duplicated": 0, "side_effects_missing": 0}
    want = expected_result(reference, script, run.goal, report.plan.steps)
    got = comparable(result)
    if script.rechecks_of(run.goal):
        # A re-check's call and its result lengthen the prompts after it, which the stub bills
        # by their length: the tokens and cost can only be told to be no fewer.
        for usage in (got["usage"], want["usage"]):
            counted = {k: usage.pop(k) for k in ("input_tokens", "output_tokens", "cost_usd")}
            usage["billed"] = counted
        if any(got["usage"]["billed"][k] < want["usage"]["billed"][k] for k in want["usage"]["billed"]):
            report.failures.append(f"{run.workflow_id}: billed less than the uninterrupted run: {got} != {want}")
        got["usage"]["billed"] = want["usage"]["billed"]
    if got != want:
        report.failures.append(f"{run.workflow_id}: result differs from the uninterrupted run's: {got} != {want}")
    ledger = ledger_check(run.workspace / "ledger.txt", report.plan.steps)
    if any(ledger.values()):
        report.failures.append(f"{run.workflow_id}: ledger {ledger}")
    return {"steps": result.steps, "model_calls": len(recorder.of(run.goal)), **ledger}


def check_chaos(report: Report, extra_calls: list[int]) -> None:
    """The chaos happened as planned, and cost no more model calls than it may."""
    f, plan = report.figures, report.plan
    if f["completed"] < plan.agents:
        report.failures.append(f"only {f['completed']} of {plan.agents} runs completed")
    faults = f["worker_kills"] + f["server_restarts"]
    over = [n for n in extra_calls if n > faults]
    if over:
        # A fault repeats at most one model call of each run: the one in flight. A server
        # restart counts: an outage that outlasts the call's heartbeat timeout (10 s, less the
        # time since its last beat) gives the attempt up, and a retry on another worker asks again.
        report.failures.append(f"{len(over)} run(s) repeated more model calls ({max(over)}) than faults ({faults})")
    if f.get("unexpected_worker_exits"):
        report.failures.append(f"{f['unexpected_worker_exits']} worker(s) exited without being killed")
    if f["worker_kills"] >= 5 and not f["kills_taken_over_by_the_survivor"]:
        report.failures.append("the surviving worker never moved a run on before the killed one was replaced")
    if f["worker_kills"] + f["server_restarts"] < plan.worker_kills + plan.server_restarts:
        report.failures.append(
            f"only {f['worker_kills']} kills and {f['server_restarts']} restarts happened "
            "before the runs ended: make the runs longer"
        )


def takeovers(events: list[dict[str, Any]], recorder: Recorder) -> int:
    """Kills after which some run began a new step before the killed worker's replacement started."""
    count = 0
    for e in (e for e in events if e["kind"] == "kill"):
        seen = {(r.agent, r.turn) for r in recorder.log if r.at <= e["at"]}
        window = {(r.agent, r.turn) for r in recorder.log if e["at"] < r.at < e["at"] + e["replaced_after_s"]}
        count += bool(window - seen)
    return count


async def final_executions(client: Client, task_queue: str) -> dict[str, int]:
    """Per workflow id, its executions that did not continue as new: 1 each, or a run was lost
    (0, never listed) or started twice (2)."""
    counts: dict[str, int] = {}
    async for execution in client.list_workflows(f'TaskQueue="{task_queue}"'):
        final = execution.status != WorkflowExecutionStatus.CONTINUED_AS_NEW
        counts[execution.id] = counts.get(execution.id, 0) + final
    return counts


# --- soak ------------------------------------------------------------------------------


async def soak(minutes: float, agents: int = 10, steps: int = 20) -> dict[str, Any]:
    """Waves of `agents` concurrent runs for `minutes`, one worker; its RSS sampled every 5 s."""
    import psutil  # the bench extra

    samples: list[tuple[float, float]] = []
    waves = 0
    with bench(StepScript(steps)) as b:
        worker = psutil.Process(b.start_worker().pid)
        client = await connect(b.server.address)
        started = time.monotonic()
        sampler = asyncio.create_task(_sample_rss(worker, started, samples))
        while time.monotonic() - started < 60 * minutes:
            runs = await start_runs(client, b, Plan(steps=steps, agents=agents), f"soak-{waves}")
            await asyncio.gather(*(client.get_workflow_handle(r.workflow_id).result() for r in runs))
            waves += 1
        sampler.cancel()
    return rss_summary(samples, waves, agents * steps * waves, minutes)


async def _sample_rss(worker: Any, started: float, samples: list[tuple[float, float]]) -> None:
    while True:
        samples.append((time.monotonic() - started, worker.memory_info().rss / 1e6))
        if len(samples) % 12 == 1:  # a progress line a minute, so a cut-short soak still tells
            print(f"soak {samples[-1][0] / 60:5.1f} min: worker RSS {samples[-1][1]:.1f} MB", flush=True)
        await asyncio.sleep(5)


def rss_summary(samples: list[tuple[float, float]], waves: int, steps: int, minutes: float) -> dict[str, Any]:
    """Flat = the last fifth's median RSS within 10 % of the second fifth's (the first is warm-up)."""
    fifth = max(len(samples) // 5, 1)
    early = statistics.median(mb for _, mb in samples[fifth : 2 * fifth] or samples[:1])
    late = statistics.median(mb for _, mb in samples[-fifth:])
    return {
        "minutes": minutes,
        "waves": waves,
        "steps": steps,
        "rss_mb_early": round(early, 1),
        "rss_mb_late": round(late, 1),
        "rss_mb_max": round(max(mb for _, mb in samples), 1),
        "growth_pct": round(100 * (late - early) / early, 1),
        "slope_mb_per_min_second_half": round(_slope(samples[len(samples) // 2 :]) * 60, 2),
        "flat": late <= 1.10 * early,
        "rss_mb_by_minute": _by_minute(samples),
    }


def _slope(samples: list[tuple[float, float]]) -> float:
    """MB per second, least squares: a leak shows as a slope that does not fall to zero."""
    if len(samples) < 2:
        return 0.0
    return statistics.linear_regression([t for t, _ in samples], [mb for _, mb in samples]).slope


def _by_minute(samples: list[tuple[float, float]]) -> list[float]:
    """The median RSS of each minute, for a compact report."""
    minutes: dict[int, list[float]] = {}
    for at, mb in samples:
        minutes.setdefault(int(at // 60), []).append(mb)
    return [round(statistics.median(v), 1) for _, v in sorted(minutes.items())]


# --- command line ----------------------------------------------------------------------


def print_report(title: str, report: Report) -> None:
    print(f"\n== {title}: {'PASS' if report.ok else 'FAIL'}")
    print(
        json.dumps(
            {
                "plan": asdict(report.plan),
                "figures": report.figures,
                "failures": report.failures,
                "events": [{k: v for k, v in e.items() if k != "at"} for e in report.events],
            },
            indent=1,
        ),
        flush=True,
    )


async def scenarios(args: argparse.Namespace) -> bool:
    single = Plan(steps=args.steps, worker_kills=args.kills, server_restarts=args.restarts, seed=args.seed)
    many = Plan(
        steps=args.agent_steps,
        agents=args.agents,
        worker_kills=args.kills,
        server_restarts=args.restarts,
        seed=args.seed + 1,
    )
    ok = True
    for title, plan in (
        (f"one run of {single.steps} steps", single),
        (f"{many.agents} concurrent agents of {many.steps} steps", many),
    ):
        started = time.monotonic()
        report = await run_chaos(plan)
        report.figures["seconds"] = round(time.monotonic() - started, 1)
        print_report(title, report)
        ok = ok and report.ok
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--agent-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10_000)
    parser.add_argument("--soak", type=float, metavar="MINUTES", help="soak instead: continuous runs, worker RSS")
    args = parser.parse_args()
    print(f"seed {args.seed}", flush=True)
    if args.soak:
        summary = asyncio.run(soak(args.soak))
        print(json.dumps(summary), flush=True)
        ok = summary["flat"]
    else:
        ok = asyncio.run(scenarios(args))
    sys.stdout.flush()
    os._exit(0 if ok else 1)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
