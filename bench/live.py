"""What the live view of model replies costs: CPU per model call with it on and off, in one run.

`python -m bench live [--agents 20] [--reply-s 3] [--rounds 4] [--line-chars N] [--follower
local remote none]`: `--agents` one-step runs at once, whose model reply (750 characters of
text: one line, or lines of `--line-chars` characters, as code or a list) streams over
`--reply-s` seconds, on one worker process, in modes alternating per round: followed
(started with the `watch` signal, as `durable-agent run` starts them, and followed as `run`
follows the reply, one mode per `--follower`, default local and remote) and not followed.
Per mode: CPU of the worker process and of the dev server per model call; the difference
with the same round's unfollowed runs (median over rounds) is what the live view costs. The
follower (`--follower`): on the worker's machine it asks the worker for the reply (its Unix
socket, activities/live_replies.py) and the call beats at the usual pace; `remote`, as from
another machine, it reads the heartbeat details (a beat within a second of each new line,
and the run's description once a second); `none` sends the signal only (the call then beats
as for a remote follower). A run nobody follows pays nothing for it."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from typing import Any

from bench.contenders import _cpu_s
from bench.harness import Bench, bench, bench_input
from bench.report import git_commit
from durable_agent.connection import connect
from durable_agent.follow import POLL_S, LiveReply
from durable_agent.live_source import LiveSource
from durable_agent.model_server import Reply
from durable_agent.runs import start_agent
from workflows.types import WatchRequest

TEXT_CHARS = 750
CHUNK_CHARS = 4


def reply_text(line_chars: int | None) -> str:
    """Words of 5 characters; with `line_chars`, a line feed ends every line of that length."""
    if not line_chars:
        return "word " * (TEXT_CHARS // 5)
    line = "word " * (max(line_chars, 5) // 5 - 1) + "word\n"
    return (line * (TEXT_CHARS // len(line) + 1))[:TEXT_CHARS]


async def measure(b: Bench, client: Any, worker_pid: int, agents: int, follower: str | None) -> dict[str, float]:
    """`follower`: None for runs nobody follows; else as `--follower`."""
    pids = (worker_pid, b.server.process.pid)
    cpu0 = {pid: _cpu_s(pid) for pid in pids}
    b.model.requests.clear()
    watch: dict[str, Any] = {"start_signal": "watch", "start_signal_args": [WatchRequest()]} if follower else {}
    inputs = [bench_input("answer", b.workspace(), 1) for _ in range(agents)]
    handles = [await start_agent(client, i, f"live-{uuid.uuid4().hex[:8]}", b.task_queue, **watch) for i in inputs]
    following = follower in ("local", "remote")
    counted = [Counting(h) for h in handles]
    shown = await asyncio.gather(*(follow_live(h, follower == "local") if following else h.result() for h in counted))
    calls = len(b.model.requests)
    worker_ms, server_ms = (1000 * (_cpu_s(pid) - cpu0[pid]) / calls for pid in pids)
    figures = {"worker_ms": round(worker_ms, 2), "server_ms": round(server_ms, 2), "calls": calls}
    if following:
        figures["lines_shown_per_call"] = sum(shown) / calls
        figures["describes_per_call"] = sum(h.describes for h in counted) / calls
    return figures


class Counting:
    """A run's handle that counts the descriptions the follower asks the server for."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.id, self.describes = handle, handle.id, 0

    async def describe(self) -> Any:
        self.describes += 1
        return await self.handle.describe()

    async def result(self) -> Any:
        return await self.handle.result()


async def follow_live(handle: Any, local: bool) -> int:
    """The live part of `durable-agent run`'s follower (durable_agent/follow.py) until the run
    ends: the reply so far every POLL_S; how many of its lines it showed. The status and
    transcript queries it also makes are left out: a follower makes them, live view or not."""
    source, live, shown = LiveSource(handle, local=local), LiveReply(), 0
    ending = asyncio.ensure_future(handle.result())
    while not ending.done():
        found = await source.reply()
        shown += len(live.lines(1, *found)) if found else 0
        await asyncio.wait({ending}, timeout=POLL_S)
    source.close()
    return shown


async def run(
    agents: int, reply_s: float, rounds: int, line_chars: int | None = None, followers: tuple[str, ...] = ("local",)
) -> dict[str, Any]:
    text = reply_text(line_chars)
    modes: dict[str, str | None] = {"not followed": None, **{f"followed, {f}": f for f in followers}}
    with bench(lambda request: Reply(content=text, input_tokens=50, output_tokens=150)) as b:
        b.model.stream_interval_s = reply_s / (len(text) / CHUNK_CHARS)
        client = await connect(b.server.address)
        worker = b.start_worker()
        for follower in modes.values():  # warm up: start-up costs are in no figure
            await measure(b, client, worker.pid, 2, follower)
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for r in range(rounds):
            for mode in list(modes) if r % 2 == 0 else list(reversed(modes)):
                figures = await measure(b, client, worker.pid, agents, modes[mode])
                stamp = time.strftime("%H:%M:%S")
                print(f"[live {stamp}] round {r + 1} {mode}: {json.dumps(figures)}", file=sys.stderr)
                results[mode].append(figures)
    return {
        "commit": git_commit(),
        "agents": agents,
        "reply_s": reply_s,
        "rounds": rounds,
        "line_chars": line_chars,
        "median_cpu_ms_per_model_call": {
            mode: {k: statistics.median(f[k] for f in rows) for k in ("worker_ms", "server_ms")}
            for mode, rows in results.items()
        },
        # Each round's followed runs against that round's unfollowed ones: load from elsewhere
        # on the machine shifts both alike.
        "live_view_cost_ms_per_followed_model_call": {
            mode: statistics.median(
                _total(on) - _total(off) for on, off in zip(results[mode], results["not followed"], strict=True)
            )
            for mode in modes
            if modes[mode]
        },
        "results": results,
    }


def _total(figures: dict[str, float]) -> float:
    return round(figures["worker_ms"] + figures["server_ms"], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--reply-s", type=float, default=3.0, help="how long each reply takes to stream")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--line-chars", type=int, help="a line feed every N characters (default: one line)")
    parser.add_argument(
        "--follower",
        nargs="+",
        choices=["local", "remote", "none"],
        default=["local", "remote"],
        help="who follows a followed run, one mode each: the follower of `run` on the worker's machine "
        "(asks the worker), one on another machine (reads heartbeats), or nobody (the watch signal only)",
    )
    args = parser.parse_args()
    figures = asyncio.run(run(args.agents, args.reply_s, args.rounds, args.line_chars, tuple(args.follower)))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
