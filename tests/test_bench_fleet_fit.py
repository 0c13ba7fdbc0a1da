"""`python -m bench fleet --steps N M`: a run's CPU split into what a run costs once and what
each step adds, from the fleet's figures per model call."""

from __future__ import annotations

import pytest

from bench.run_costs import fit_per_run_and_per_step, run_cpu_ms


def figures(steps: int, agents: int, per_run: dict[str, float], per_step: dict[str, float]) -> dict:
    """What `measure` reports for runs whose CPU is exactly per_run + per_step x steps."""
    cpu = {part: per_run[part] + per_step[part] * steps for part in per_run}
    calls = agents * (steps + 1)
    per_call = {part: cpu[part] * agents / calls for part in cpu}
    return {
        "model_calls": calls,
        "cpu_ms_per_model_call": per_call["worker"] + per_call["children"] + per_call["server"],
        # The worker's figure holds its children's CPU: the fit takes it out again.
        "worker_cpu_ms_per_model_call": per_call["worker"] + per_call["children"],
        "worker_children_cpu_ms_per_model_call": per_call["children"],
        "server_cpu_ms_per_model_call": per_call["server"],
    }


def test_a_runs_cpu_is_split_into_its_cost_per_run_and_per_step() -> None:
    per_run = {"worker": 40.0, "children": 30.0, "server": 50.0}
    per_step = {"worker": 35.0, "children": 6.0, "server": 26.0}
    by_steps = {n: [figures(n, 100, per_run, per_step)] * 2 for n in (1, 4, 8)}

    fitted = fit_per_run_and_per_step(100, by_steps)

    for part in per_run:
        assert fitted[part]["per_run"] == pytest.approx(per_run[part], abs=0.1)
        assert fitted[part]["per_step"] == pytest.approx(per_step[part], abs=0.1)
    assert fitted["total"] == {"per_run": 120.0, "per_step": 67.0}
    assert run_cpu_ms(100, by_steps[1][0])["worker"] == pytest.approx(75.0)
