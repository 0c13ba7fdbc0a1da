"""What the benchmarks observe from outside every implementation: model requests and the ledger.

The stub model sees every call any implementation makes, whatever process makes it, so
"model calls repeated", "steps redone" and "time to the next finished step" are all read
from one request log, the same way for the four implementations. The ledger (each step's
command appends its number) shows duplicated and missing side effects.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.task import agent_of
from durable_agent.model_server import Responder, count_assistant_turns

GATE_TIMEOUT_S = 120
"""A gate left shut (a crashed harness) delays a reply by this much, never forever."""


@dataclass(frozen=True)
class Request:
    at: float
    """time.time() when the stub received it (after the stub's latency, if any)."""
    agent: str
    turn: int
    """Steps the agent had finished when it asked: the request for turn k starts step k + 1."""


class Recorder:
    """Wraps the stub's responder and logs who asked for which turn, when."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self._gates: list[tuple[int, threading.Event]] = []

    def __call__(self, request: dict[str, Any]) -> Any:
        entry = Request(time.time(), agent_of(request), count_assistant_turns(request))
        with self._lock:
            self.log.append(entry)
            progress = self.turns_done()
            closed = [gate for at, gate in self._gates if progress >= at and not gate.is_set()]
        for gate in closed:
            gate.wait(timeout=GATE_TIMEOUT_S)
        return self.responder(request)

    def gate(self, at_turns: int) -> threading.Event:
        """Hold every reply once `at_turns` distinct turns have been asked for, until the
        returned event is set: the runs cannot outpace a test that must act before then."""
        gate = threading.Event()
        with self._lock:
            self._gates.append((at_turns, gate))
        return gate

    def open_gates(self) -> None:
        with self._lock:
            gates, self._gates = self._gates, []
        for _, gate in gates:
            gate.set()

    def clear(self) -> None:
        with self._lock:
            self.log.clear()

    def of(self, agent: str) -> list[Request]:
        return [r for r in self.log if r.agent == agent]

    def turns_done(self) -> int:
        """Distinct (agent, turn) pairs asked for: overall progress, repeats not counted."""
        return len({(r.agent, r.turn) for r in self.log})

    async def wait_turn(self, agent: str, turn: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(r.agent == agent and r.turn >= turn for r in self.log):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{agent} did not reach turn {turn} within {timeout_s:.0f} s")
            await asyncio.sleep(0.005)

    def step_s(self, agent: str) -> float:
        """The agent's latest step duration (between its last two requests)."""
        times = [r.at for r in self.of(agent)][-2:]
        return times[1] - times[0] if len(times) == 2 else 0.1


@dataclass
class Kill:
    killed_at: float
    restarted_at: float


def kill_figures(requests: list[Request], kills: list[Kill]) -> dict[str, Any]:
    """Per kill: how long from the restart until a step beyond the interrupted one began,
    and which finished steps were done again; plus the model calls repeated overall."""
    recoveries, redone = [], 0
    for i, kill in enumerate(kills):
        before = max((r.turn for r in requests if r.at <= kill.killed_at), default=0)
        until = kills[i + 1].killed_at if i + 1 < len(kills) else float("inf")
        after = [r for r in requests if kill.restarted_at <= r.at < until]
        # A request for turn k starts step k + 1, which had finished if turn k + 1 was asked before the kill.
        redone += len({r.turn for r in after if r.turn + 1 <= before})
        moved_on = [r.at for r in after if r.turn > before]
        recoveries.append(moved_on[0] - kill.restarted_at if moved_on else None)
    turns = [r.turn for r in requests]
    return {
        "restart_to_next_step_s": recoveries,
        "steps_redone": redone,
        "model_calls_repeated": len(turns) - len(set(turns)),
    }


def ledger_check(path: Path, steps: int) -> dict[str, int]:
    """Duplicated and missing side effects: the ledger should hold 1..steps once each."""
    counts = Counter(int(x) for x in path.read_text().split()) if path.exists() else Counter()
    return {
        "side_effects_duplicated": sum(c - 1 for c in counts.values()),
        "side_effects_missing": sum(1 for n in range(1, steps + 1) if n not in counts),
    }


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max: what the tables show for repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
