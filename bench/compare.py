"""durable-agent against its peers, measured side by side in one run; writes bench/RESULTS.md.

`python -m bench compare [--quick]` (or `make bench`). The same agent task for every
implementation (bench/task.py, bench/harness.py: one model call, then write a file and
run a command, per step) against the same stub model, with zero and with 50 ms latency:

The peers: a plain loop with a JSONL log, one with an fsynced snapshot, LangGraph with its
SQLite checkpointer, and the 40-line Temporal loop of bench/plain_temporal.py twice (with the
peers' tools, and with durable-agent's own tool activities), so that what Temporal costs,
what durable-agent's tools cost and what its workflow adds can be read apart.

1. timing: ms and CPU ms per step at N steps, `--runs` runs each, interleaved in rotating
   order so load from elsewhere on the machine falls on every implementation alike;
2. bytes persisted at rest after complete runs of N = 50, 100 (extra runs) and 200 (the
   timing runs);
3. throughput: `--agents` concurrent agents of `--agent-steps` steps, steps per second;
4. recovery: `--kills` SIGKILLs at random steps and random moments within the step, the
   process restarted at once; read from the stub's request log and the ledger;
5. modes: the seed's three run modes under the same kills (`bench/modes.py`);
6. slow models: ms per step at 1 s and 3 s model latency (`slow_steps` steps, one run each
   per round), and the fleet row (`bench/fleet.py`: 200 agents x 4 steps at 3 s beside a
   plain Temporal loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import fleet
from bench.contenders import DurableContender, Figures, PeerContender, PlainTemporalContender
from bench.harness import Bench, StepScript, bench
from bench.observe import Kill, Recorder, kill_figures, ledger_check
from bench.report import git_commit, machine_description, output_file, write_results
from bench.task import goal_for
from durable_agent.connection import connect

HERE = Path(__file__).resolve().parent


@dataclass
class Options:
    steps: int = 200
    runs: int = 3
    latencies_ms: list[int] = field(default_factory=lambda: [0, 50])
    byte_marks: list[int] = field(default_factory=lambda: [50, 100, 200])
    agents: int = 50
    agent_steps: int = 10
    kills: int = 3
    kill_steps: int = 40
    peers: list[str] = field(default_factory=lambda: ["jsonl", "snapshot", "langgraph"])
    plain_temporal: list[bool] = field(default_factory=lambda: [False, True])
    """The plain Temporal loop with the peers' tools (False) and with durable-agent's (True)."""
    seed: int = 4
    slow_latencies_ms: list[int] = field(default_factory=lambda: [1000, 3000])
    slow_steps: int = 10
    fleet_agents: int = 200
    fleet_steps: int = 4
    quick: bool = False

    @classmethod
    def quick_options(cls, **changes: Any) -> Options:
        return cls(
            steps=50,
            byte_marks=[10, 25, 50],
            agents=10,
            agent_steps=5,
            kills=2,
            kill_steps=24,
            slow_steps=4,
            fleet_agents=50,
            quick=True,
            **changes,
        )


def log(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Session:
    """One bench (server, stub, request log) and the contenders, for every phase."""

    def __init__(self, b: Bench, recorder: Recorder, contenders: list[Any], options: Options) -> None:
        self.b, self.recorder, self.contenders, self.o = b, recorder, contenders, options

    def script(self, steps: int, latency_ms: int = 0) -> None:
        """Fresh stub state for the next run; the stub's own request list would grow without end."""
        self.recorder.responder = StepScript(steps)
        self.recorder.clear()
        self.b.model.requests.clear()
        self.b.model.latency_s = latency_ms / 1000

    async def run(self, contender: Any, steps: int, agents: int, latency_ms: int = 0) -> Figures:
        self.script(steps, latency_ms)
        figures = await contender.run(steps, agents)
        wrong = [o for o in figures.outputs if o != f"finished {steps} steps"]
        if wrong or len(figures.outputs) != agents:
            raise RuntimeError(f"{contender.name}: unexpected outputs {wrong[:3]} ({len(figures.outputs)} agents)")
        return figures

    async def timing(self, latencies_ms: list[int], steps: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """latency -> contender -> one entry per run (rounds interleave the contenders)."""
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for latency in latencies_ms:
            per = out.setdefault(str(latency), {c.name: [] for c in self.contenders})
            for r in range(self.o.runs):
                for c in _rotated(self.contenders, r):
                    f = await self.run(c, steps, 1, latency)
                    per[c.name].append({"round": r, **asdict(f)})
                    log(f"timing {latency} ms, run {r + 1}: {c.name} {1000 * f.wall_s / steps:.0f} ms/step")
        return out

    async def persisted(self, timing: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """contender -> N -> bytes at rest after an N-step run (N = steps reuses the timing runs)."""
        out: dict[str, dict[str, Any]] = {}
        for c in self.contenders:
            sizes = out.setdefault(c.name, {})
            for n in self.o.byte_marks:
                if n == self.o.steps:
                    runs = timing["0"][c.name]
                    sizes[str(n)] = {"bytes": runs[0]["bytes"], "extra": runs[0]["extra"]}
                    continue
                f = await self.run(c, n, 1)
                sizes[str(n)] = {"bytes": f.bytes, "extra": f.extra}
            log(f"bytes: {c.name} {sizes}")
        return out

    async def throughput(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        total = self.o.agents * self.o.agent_steps
        for latency in self.o.latencies_ms:
            for c in self.contenders:
                f = await self.run(c, self.o.agent_steps, self.o.agents, latency)
                out.setdefault(str(latency), {})[c.name] = {"wall_s": f.wall_s, "steps_per_s": total / f.wall_s}
                log(f"throughput {latency} ms: {c.name} {total / f.wall_s:.1f} steps/s")
        return out

    async def recovery(self) -> dict[str, dict[str, Any]]:
        out = {}
        for i, c in enumerate(self.contenders):
            if not c.measures_recovery:
                continue
            out[c.name] = await self.kill_run(c, random.Random(self.o.seed + i))
            log(f"recovery: {c.name} {out[c.name]}")
        return out

    async def kill_run(self, contender: Any, rng: random.Random) -> dict[str, Any]:
        steps, agent = self.o.kill_steps, goal_for(0, self.o.kill_steps)
        self.script(steps)
        ledger = await contender.begin(steps)
        kills = []
        for target in _kill_steps(steps, self.o.kills, rng):
            await self.recorder.wait_turn(agent, target)
            await asyncio.sleep(rng.uniform(0, self.recorder.step_s(agent)))  # anywhere within the step
            killed_at = time.time()
            await contender.kill()
            kills.append(Kill(killed_at, time.time()))
            await contender.restart()
        output = await contender.finish()
        return {
            "resumes_by_itself": contender.resumes,
            "completed": output == f"finished {steps} steps",
            "kills": len(kills),
            **kill_figures(self.recorder.of(agent), kills),
            **ledger_check(ledger, steps),
        }


async def modes(session: Session, durable: DurableContender) -> dict[str, dict[str, Any]]:
    """The seed's three run modes side by side, under the same kills (same steps, same
    moments): stateless (a kill loses the run; run again it starts from zero), manual
    checkpoint (a snapshot every 10 steps; run again it redoes the steps since) and
    automatic per step (durable-agent). Steps redone, model calls and tokens wasted (the
    stub bills 70 tokens a call), side effects duplicated, time from start to completion."""
    out: dict[str, dict[str, Any]] = {}
    for c in [PeerContender("stateless", session.b), PeerContender("checkpoint", session.b), durable]:
        began = time.perf_counter()
        figures = await session.kill_run(c, random.Random(session.o.seed))
        figures["time_to_completion_s"] = round(time.perf_counter() - began, 2)
        figures["tokens_wasted"] = figures["model_calls_repeated"] * sum(StepScript.STEP_TOKENS.values())
        out[c.name] = figures
        log(f"modes: {c.name} {figures}")
    return out


def _rotated(items: list[Any], r: int) -> list[Any]:
    k = r % len(items)
    return items[k:] + items[:k]


def _kill_steps(steps: int, kills: int, rng: random.Random) -> list[int]:
    """One random step in each of `kills` equal stretches, clear of the run's two ends."""
    stretch = (steps - 6) // kills
    return [3 + i * stretch + rng.randrange(max(stretch - 2, 1)) for i in range(kills)]


async def measure(o: Options) -> dict[str, Any]:
    recorder = Recorder(StepScript(o.steps))
    started = time.time()
    load_before = os.getloadavg()
    with bench(recorder) as b:
        client = await connect(b.server.address)
        contenders: list[Any] = [
            *(PeerContender(p, b) for p in o.peers),
            *(PlainTemporalContender(b, client, product_tools) for product_tools in o.plain_temporal),
            DurableContender(b, client),  # last: `modes` takes it from there
        ]
        for c in contenders:
            await c.prepare()
        s = Session(b, recorder, contenders, o)
        timing = await s.timing(o.latencies_ms, o.steps)
        data = {
            "options": asdict(o),
            "timing": timing,
            "bytes": await s.persisted(timing),
            "throughput": await s.throughput(),
            "recovery": await s.recovery(),
            "modes": await modes(s, contenders[-1]),
            "slow_timing": {"steps": o.slow_steps, "runs": await s.timing(o.slow_latencies_ms, o.slow_steps)},
            "scopes": {c.name: {"cpu": c.cpu_scope, "bytes": c.bytes_scope} for c in contenders},
        }
    data["fleet"] = await fleet.run(o.fleet_agents, o.fleet_steps, 3000, 1)
    data["run"] = {
        "started": started,
        "seconds": time.time() - started,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "commit": git_commit(),
        "machine": machine_description(),
    }
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N=50 and fewer agents: a few minutes, for a smoke run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--with-langgraph-sync",
        action="store_true",
        help='add LangGraph with durability="sync" (a checkpoint before every next node)',
    )
    parser.add_argument("--out", type=output_file, default=HERE / "RESULTS.md")
    args = parser.parse_args(argv)
    o = Options.quick_options(runs=args.runs) if args.quick else Options(runs=args.runs)
    if args.with_langgraph_sync:
        o.peers.append("langgraph-sync")
    data = asyncio.run(measure(o))
    out = args.out
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    write_results(data, out, " ".join(["python -m bench compare", *(argv if argv is not None else sys.argv[1:])]))
    log(f"wrote {out} and {out.with_suffix('.json')}")
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
