"""Adaptive quotas: a spike shrinks the step quota, cheap steps loosen it, and compaction keeps
fewer steps as the tokens run out; each change recorded, shown in status, and replayed."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import render
from durable_agent.model_server import ModelServer, is_judge_request, is_summary_request
from tests.helpers import start
from tests.scripts import Script, tool_results, tools
from tests.test_replay import replay_failure
from workflows import quota
from workflows.status_view import details_markdown
from workflows.types import AgentStatus

BIG = "".join(f"line {n}\n" for n in range(300))
"""About 4,500 characters as `read_file` shows it, under the 8,000 a tool result keeps by default."""


def cheap(name: str = "list_files", **args: str):
    return tools((name, args), input_tokens=100, output_tokens=10)


async def test_a_spike_shrinks_the_quota_and_cheap_steps_loosen_it(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    (workspace / "big.txt").write_text(BIG)
    spike = tools(("list_files", {}), input_tokens=2_000, output_tokens=200)
    # Steps 1-4 cost 110 tokens, step 5 2,200 (20x the average), steps 6-12 110 again.
    turns = [cheap("read_file", path="big.txt"), cheap(), cheap(), cheap(), spike, cheap("read_file", path="big.txt")]
    model_server.responder = Script([*turns, *[cheap()] * 6], final="done")
    handle = await start(
        client, task_queue, goal="spike once", workspace=str(workspace), continue_as_new_every=10, success_criteria="ok"
    )
    result = await handle.result()
    assert result.state == "completed" and result.steps == 13
    first_run_history = await handle.fetch_history()
    latest = client.get_workflow_handle(handle.id)  # the chain's second run: continued as new at step 10

    steps = [r for r in model_server.requests if not (is_summary_request(r) or is_judge_request(r))]
    judged = [r for r in model_server.requests if is_judge_request(r)]
    assert len(judged) == 1 and "max_tokens" not in judged[0]  # the step quota caps steps, not the judge
    # 4,000 x (2 x 110 / 2,200) = 400 after the spike; three cheap steps loosen it halfway
    # back to the 4,000 default (2,200), three more again (3,100).
    assert [r.get("max_tokens") for r in steps] == [None] * 5 + [400] * 3 + [2_200] * 3 + [3_100] * 2
    # The tool output cap follows the quota: the same file, whole at step 1, cut at step 6.
    whole, capped = tool_results(steps[1])[0], tool_results(steps[6])[-1]
    assert "line 299" in whole and len(whole) > 4_000
    assert "line 150" not in capped and len(capped) < 1_500

    status = await latest.query("status", result_type=AgentStatus)
    # Changes at steps 5 and 8 were carried across continue-as-new; 11 loosened a carried quota.
    changes = [(c.step, c.kind, c.quota) for c in status.quota.changes]
    assert changes == [(5, "shrunk", 400), (8, "loosened", 2_200), (11, "loosened", 3_100)]
    assert status.quota.changes[0].step_tokens == 2_200 and status.quota.changes[0].average == 110
    assert "quota: 3,100 tokens/step, loosened at step 11" in render.status_lines(handle.id, status)
    assert "quota: 3,100 tokens/step, loosened at step 11" in details_markdown(status)

    assert await replay_failure(first_run_history) is None
    assert await replay_failure(await latest.fetch_history()) is None


async def test_compaction_keeps_fewer_steps_as_the_tokens_run_out(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # 1,000 tokens a step of a 20,000 budget: under half left after step 11 (level 1), under a
    # quarter after step 16 (level 2), where the tokens' soft tier compacts the context, under a
    # tenth after step 18 (level 3).
    model_server.responder = Script([tools(("list_files", {}), input_tokens=900, output_tokens=100)] * 40)
    handle = await start(
        client,
        task_queue,
        goal="run out of tokens",
        workspace=str(workspace),
        limits={"max_tokens": 20_000},
        context={"keep_recent_steps": 6},
    )
    result = await handle.result()
    assert result.state == "stopped" and result.stop_reason == "token_budget"
    status = await handle.query("status", result_type=AgentStatus)
    levels = [(c.step, c.quota) for c in status.quota.changes if c.kind == "compaction_level"]
    assert levels == [(11, 1), (16, 2), (18, 3)]
    first = status.context.compactions[0]
    # Level 2 keeps a third of keep_recent_steps (2 of 6): steps 1-14 folded at step 16, not 1-10.
    assert (first.step, first.trigger, first.first_step, first.last_step) == (16, "soft_tier", 1, 14)
    assert await replay_failure(await handle.fetch_history()) is None


def test_the_quota_has_a_floor_snaps_back_to_the_default_and_keeps_its_latest_changes() -> None:
    tiny = quota.after_step(quota.Quota(), step=4, step_tokens=1_000_000, previous=[100] * 3, spike=True)
    assert tiny.tokens_per_step == quota.MIN_STEP_QUOTA and tiny.max_tokens() == quota.MIN_STEP_QUOTA
    assert tiny.output_chars(4_000) == quota.MIN_OUTPUT_CHARS  # 4,000 x 256 / 4,000 = 256: at least 500
    near = quota.Quota(tokens_per_step=3_700, cheap_streak=2)
    loosened = quota.after_step(near, step=9, step_tokens=10, previous=[100] * 5, spike=False)
    assert loosened.tokens_per_step == quota.DEFAULT_STEP_QUOTA and loosened.max_tokens() is None  # 3,850: snapped
    assert quota.after_step(tiny, step=5, step_tokens=10**6, previous=[100] * 3, spike=True) == tiny  # at the floor
    many = quota.Quota()
    for step in range(1, 60):  # a spike every 4th step, cheap steps between: shrunk, loosened, shrunk, ...
        spike = step % 4 == 1
        many = quota.after_step(many, step, 10**6 if spike else 10, [100] * 3, spike)
    assert len(many.changes) == quota.CHANGES_KEPT and many.changes[-1].step == 57
    assert [quota.keep_recent(6, level) for level in range(4)] == [6, 3, 2, 1]
    assert [quota.summary_share(level) for level in range(4)] == [1.0, 0.5, 0.25, 0.125]
