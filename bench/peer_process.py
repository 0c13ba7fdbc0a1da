"""One peer process: runs `--agents` agents of one peer implementation concurrently, then
prints its measurements as JSON. The benchmark driver starts it, and SIGKILLs it in the
recovery benchmark; run again on the same folder, it resumes every agent from its state.

`python -m bench.peer_process --impl jsonl|snapshot|langgraph --folder DIR --agents 1 --steps 200`
with OPENAI_BASE_URL pointing at the stub. Wall and CPU time cover the agent loops only
(not interpreter start-up or imports), like the durable-agent figures, which exclude the
worker's start-up. Folder layout: agent-<i>/ws is agent i's workspace; its session log or
snapshot sits beside it; LangGraph's agents share one SQLite file, one thread each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.task import Clock, ModelClient, PeerAgent, dumps, goal_for

IMPLS = ("jsonl", "snapshot", "stateless", "checkpoint", "langgraph", "langgraph-sync")
"""langgraph-sync: LangGraph with durability="sync" (checkpoint written before the next node)."""

RunOne = Callable[[int, ModelClient, int], Awaitable[str]]
"""(agent index, model client, steps) -> the agent's final answer."""


def agent_folder(folder: Path, index: int) -> Path:
    path = folder / f"agent-{index}"
    (path / "ws").mkdir(parents=True, exist_ok=True)
    return path


def persisted_bytes(impl: str, folder: Path) -> int:
    """What the agents have persisted, as the benchmark counts it (see RESULTS.md), at rest."""
    if impl.startswith("langgraph"):
        # Closing the saver folded the WAL into the database file.
        return sum(p.stat().st_size for p in folder.glob("langgraph.sqlite*"))
    from bench.baselines import STORES

    return sum(STORES[impl](p).path.stat().st_size for p in folder.glob("agent-*"))


async def run_agents(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    model = ModelClient()
    clock = Clock()
    async with _runner(args.impl, folder) as run_one:
        outputs = await asyncio.gather(*(run_one(i, model, args.steps) for i in range(args.agents)))
    wall_s, cpu_s = clock.read()
    return {"wall_s": wall_s, "cpu_s": cpu_s, "outputs": outputs, "bytes": persisted_bytes(args.impl, folder)}


@contextlib.asynccontextmanager
async def _runner(impl: str, folder: Path) -> AsyncIterator[RunOne]:
    """A coroutine function running (or resuming) agent i to its final answer."""
    if impl.startswith("langgraph"):
        from bench.langgraph_peer import DEFAULT_DURABILITY, open_saver, run_thread

        durability = "sync" if impl == "langgraph-sync" else DEFAULT_DURABILITY
        async with open_saver(folder / "langgraph.sqlite") as saver:

            async def run_one(i: int, model: ModelClient, steps: int) -> str:
                agent = _agent(folder, i, steps)
                return await run_thread(agent, model, saver, f"agent-{i}", steps, durability)

            yield run_one
        return
    from bench.baselines import STORES, run_loop

    async def run_loop_one(i: int, model: ModelClient, steps: int) -> str:
        return await run_loop(_agent(folder, i, steps), model, STORES[impl](agent_folder(folder, i)))

    yield run_loop_one


def _agent(folder: Path, index: int, steps: int) -> PeerAgent:
    return PeerAgent.create(goal_for(index, steps), str(agent_folder(folder, index) / "ws"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=IMPLS, required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print(dumps(asyncio.run(run_agents(args))), flush=True)
    sys.stderr.flush()
    os._exit(0)  # aiosqlite's and httpx's finalizers have nothing left to do


if __name__ == "__main__":
    main()
