"""The chaos suite, small: worker SIGKILLs and a dev server restart during a run lose and double nothing.

The full version is `python -m bench chaos` (bench/chaos.py). This one runs on its own dev
server, not the session's, because it restarts it.
"""

from __future__ import annotations

import pytest

from bench.chaos import Plan, run_chaos


@pytest.mark.timeout(180)
async def test_run_survives_worker_kills_and_a_server_restart() -> None:
    plan = Plan(steps=24, worker_kills=3, server_restarts=1, seed=2024, deadline_s=150)

    report = await run_chaos(plan)

    assert report.ok, "\n".join(report.failures)
    assert report.figures["worker_kills"] == 3
    assert report.figures["server_restarts"] == 1
    assert report.figures["side_effects_duplicated"] == 0
    assert report.figures["side_effects_missing"] == 0
    assert report.figures["model_calls_beyond_steps"] <= 3
