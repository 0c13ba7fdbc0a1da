"""A run's CPU split into what it costs once and what each step adds (`python -m bench fleet
--steps N M`), from the fleet's figures per model call. Apart from bench/fleet.py so that its
test needs none of the benchmarks' own dependencies."""

from __future__ import annotations

import statistics
from typing import Any

RUN_CPU_PARTS = ("total", "worker", "children", "server")
"""`worker` is the worker process's own CPU; `children` its commands, sandboxes and their helpers."""
FIT_TERMS = ("per_run", "per_step")


def run_cpu_ms(agents: int, figures: dict[str, Any]) -> dict[str, float]:
    """One measurement's CPU per run, by part, from its figures per model call."""
    per_run = figures["model_calls"] / agents
    worker_and_children = figures["worker_cpu_ms_per_model_call"] * per_run
    children = figures["worker_children_cpu_ms_per_model_call"] * per_run
    return {
        "total": figures["cpu_ms_per_model_call"] * per_run,
        "worker": worker_and_children - children,
        "children": children,
        "server": figures["server_cpu_ms_per_model_call"] * per_run,
    }


def fit_per_run_and_per_step(agents: int, by_steps: dict[int, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """CPU of a run = per_run + per_step x steps, by least squares over every measurement."""
    points = [(steps, run_cpu_ms(agents, f)) for steps, rows in by_steps.items() for f in rows]
    xs = [steps for steps, _ in points]
    fitted = {}
    for part in RUN_CPU_PARTS:
        slope, intercept = statistics.linear_regression(xs, [cpu[part] for _, cpu in points])
        fitted[part] = {"per_run": round(intercept, 1), "per_step": round(slope, 1)}
    return fitted
