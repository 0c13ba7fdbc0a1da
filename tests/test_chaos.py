"""The chaos suite, small: worker SIGKILLs and a dev server restart during a run lose and double
nothing, and a worker started while the server is down waits for it.

The full version is `python -m bench chaos` (bench/chaos.py). This one runs on its own dev
server, not the session's, because it restarts it.
"""

from __future__ import annotations

from typing import Any

import pytest

from activities.tools.command import INTERRUPTED
from bench.chaos import Plan, run_chaos
from bench.harness import RecheckingScript


@pytest.mark.timeout(180)
async def test_run_survives_worker_kills_and_a_server_restart() -> None:
    plan = Plan(steps=24, worker_kills=3, server_restarts=1, seed=2024, deadline_s=150)

    report = await run_chaos(plan)

    assert report.ok, "\n".join(report.failures)
    assert report.figures["worker_kills"] == 3
    assert report.figures["server_restarts"] == 1
    # A worker started while the server was down waited for it (issue #29).
    assert report.figures["workers_started_while_server_down"] == 1
    assert report.figures["unexpected_worker_exits"] == 0
    assert report.figures["side_effects_duplicated"] == 0
    assert report.figures["side_effects_missing"] == 0
    # At most one repeated model call per fault: the one in flight when it struck. The
    # restart counts: an outage past the call's heartbeat timeout gives its attempt up.
    assert report.figures["model_calls_beyond_steps"] <= 3 + 1


def _request(goal: str, turns: list[list[tuple[str, bool]]]) -> dict[str, Any]:
    """A chat request after `turns`, each a list of (command, interrupted) run that turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": goal}]
    for t, commands in enumerate(turns):
        calls = [
            {"id": f"c{t}-{i}", "type": "function", "function": {"name": "run_command", "arguments": command}}
            for i, (command, _) in enumerate(commands)
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [
            {"role": "tool", "tool_call_id": call["id"], "content": f"ERROR: {INTERRUPTED}" if cut else "ok"}
            for call, (_, cut) in zip(calls, commands, strict=True)
        ]
    return {"messages": messages}


def test_a_recheck_that_is_itself_interrupted_counts_as_another_tool_call() -> None:
    """Issue #29: a run's tool_calls was 43 against an expected 42. Two faults in a row hit
    one agent: step 3's command, then the re-check of it in step 4, were both interrupted,
    so the model re-checked step 3 twice: two tool calls, which the bench counted once."""
    script = RecheckingScript(steps=20)
    step_3 = ('{"command": "echo 3 >> ledger.txt"}', True)
    recheck_3 = ('{"command": "grep -qx 3 ledger.txt || echo 3 >> ledger.txt"}', True)
    before = [[('{"command": "echo 1 >> ledger.txt"}', False)], [('{"command": "echo 2 >> ledger.txt"}', False)]]

    script(_request("agent a", [*before, [step_3]]))  # turn 3 re-checks step 3
    script(_request("agent a", [*before, [step_3]]))  # the same turn asked again after a kill
    script(_request("agent a", [*before, [step_3], [recheck_3]]))  # turn 4 re-checks it again

    assert script.rechecks_of("agent a") == [(3, 3), (4, 3)]
