"""A definition of done: `success_criteria` and `check_command`, checked before an answer is taken."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import render
from durable_agent.model_server import Failure, ModelServer, Reply, is_judge_request
from tests.helpers import start
from tests.scripts import Script, answer, tools
from tests.test_agents import agent_text, write_agent
from workflows.types import AgentStatus

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
PYTEST = "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=.pylib python3 -m pytest -q -p no:cacheprovider"
"""`pytest -q` in the command sandbox, which shows the system's Python but not the tests' venv:
the venv's pytest (pure Python) is copied into the workspace's `.pylib` (`with_pytest`). No
bytecode: the fix has the buggy file's size, and written within the second of the first check
it would leave that check's `calc.pyc` looking current (Python compares mtime in seconds and size)."""
PYTEST_MODULES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py")


def with_pytest(workspace: Path) -> None:
    site = Path(pytest.__file__).parent.parent
    for name in PYTEST_MODULES:
        source = site / name
        target = workspace / ".pylib" / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(exist_ok=True)
            shutil.copy(source, target)


def user_texts(request: dict[str, Any]) -> list[str]:
    return [m.get("content") or "" for m in request["messages"] if m.get("role") == "user"]


def judge_says(*met: bool) -> Any:
    """A judge that gives each statement the verdict in `met`, in order, one reply per check
    (the last one again after that: a test that expected fewer checks then fails on its counts)."""
    replies = itertools.chain(met, itertools.repeat(met[-1]))

    def respond(request: dict[str, Any]) -> Reply:
        body = json.loads(request["messages"][1]["content"])
        verdict = next(replies)
        entries = [{"index": c["index"], "met": verdict, "evidence": f"judged {verdict}"} for c in body["criteria"]]
        return Reply(content=json.dumps({"criteria": entries}), input_tokens=300, output_tokens=30)

    return respond


async def test_a_failing_check_command_goes_back_to_the_model_which_fixes_it(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    (workspace / "calc.py").write_text(BUGGY)
    (workspace / "test_calc.py").write_text(TEST)
    with_pytest(workspace)

    model_server.responder = Script(
        [
            answer("done", input_tokens=100, output_tokens=10),
            tools(("write_file", {"path": "calc.py", "content": FIXED}), input_tokens=200, output_tokens=20),
        ],
        final="fixed",
    )
    model_server.judge = judge_says(True, True)
    handle = await start(
        client,
        task_queue,
        goal="make the tests pass",
        workspace=str(workspace),
        check_command=PYTEST,
        snapshot_exclude=[".pylib"],
        success_criteria=["add adds its arguments"],
    )
    result = await handle.result()

    agent_turns = [r for r in model_server.requests if not is_judge_request(r)]
    feedback = user_texts(agent_turns[1])[-1]  # what the model read before it fixed the file
    assert "NOT MET" in feedback and "exit code: 1" in feedback and "1 failed" in feedback, feedback
    assert result.criteria[0].met, result.criteria
    assert result.state == "completed" and result.output == "fixed"
    assert (workspace / "calc.py").read_text() == FIXED
    assert [(c.kind, c.met, c.check) for c in result.criteria] == [("command", True, 2), ("statement", True, 2)]
    assert result.criteria[0].evidence.startswith("exit code: 0\n") and "1 passed" in result.criteria[0].evidence
    assert not result.unfinished
    # The ledger, exactly: 3 agent turns + 2 judge calls; 1 write_file + 2 check commands.
    assert len(agent_turns) == 3 and len(model_server.requests) == 5
    usage = result.usage
    assert (usage.model_calls, usage.tool_calls, usage.done_checks) == (5, 3, 2)
    final_input = usage.input_tokens - 100 - 200 - 2 * 300
    assert final_input > 0 and usage.output_tokens - 10 - 20 - 2 * 30 > 0  # the last turn's default usage
    status = await handle.query("status", result_type=AgentStatus)
    assert status.usage.done_checks == 2
    # The judge read the goal, the statement, the answer and the steps since as evidence.
    first_judge = json.loads([r for r in model_server.requests if is_judge_request(r)][0]["messages"][1]["content"])
    assert first_judge["goal"] == "make the tests pass" and first_judge["final_answer"] == "done"
    assert first_judge["criteria"] == [{"index": 1, "statement": "add adds its arguments"}]
    assert first_judge["latest_steps"] == [{"step": 1, "role": "assistant", "content": "done"}]
    second_judge = json.loads([r for r in model_server.requests if is_judge_request(r)][1]["messages"][1]["content"])
    assert any(c["name"] == "write_file" for m in second_judge["latest_steps"] for c in m.get("tool_calls", []))


async def test_unmet_statements_are_sent_back_at_most_max_done_checks_times(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="all done")
    model_server.judge = judge_says(False, False, False)
    handle = await start(
        client,
        task_queue,
        goal="write the report",
        workspace=str(workspace),
        success_criteria="report.md exists",
        limits={"max_done_checks": 2},
    )
    result = await handle.result()

    assert result.state == "completed" and result.stop_reason == "final_answer"
    assert result.usage.done_checks == 2 and result.usage.model_calls == 4  # 2 turns, 2 judge calls
    shown = render.result_lines(result)
    assert "criterion NOT met: report.md exists" in shown and "unfinished: criterion not met: report.md exists" in shown
    assert [(c.criterion, c.met) for c in result.criteria] == [("report.md exists", False)]
    assert result.unfinished == ["criterion not met: report.md exists"]
    second_turn = [r for r in model_server.requests if not is_judge_request(r)][1]
    assert "NOT MET: report.md exists" in user_texts(second_turn)[-1] and "judged False" in user_texts(second_turn)[-1]


async def test_a_malformed_judge_reply_leaves_the_statement_unmet_and_the_run_goes_on(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="ok")
    model_server.judge = lambda request: Reply(content="Looks good to me! {not json")
    handle = await start(
        client,
        task_queue,
        goal="anything",
        workspace=str(workspace),
        success_criteria=["it works"],
        limits={"max_done_checks": 1},
    )
    result = await handle.result()
    assert result.state == "completed"
    assert not result.criteria[0].met and "could not be read" in result.criteria[0].evidence


def test_an_agent_file_gives_criteria_and_a_check_command(workspace: Path) -> None:
    from activities.agents import AgentActivities
    from workflows.agents import effective_input
    from workflows.types import AgentInput

    text = agent_text("prompt", description="d", success_criteria="[tests pass, docs updated]", check_command="make")
    write_agent(workspace / "agents", "strict", text)
    definition = AgentActivities()._load(str(workspace), "strict")
    merged = effective_input(AgentInput(goal="g", workspace=str(workspace), agent="strict"), definition)
    assert merged.success_criteria == ["tests pass", "docs updated"] and merged.check_command == "make"


async def test_a_failing_judge_call_leaves_the_statement_unmet_and_the_run_goes_on(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="ok")
    model_server.judge = lambda request: Failure(400, "judge refused")  # not retried: a bad request
    handle = await start(
        client,
        task_queue,
        goal="anything",
        workspace=str(workspace),
        success_criteria="it works",
        limits={"max_done_checks": 1},
    )
    result = await handle.result()
    assert result.state == "completed" and result.usage.done_checks == 1
    assert not result.criteria[0].met and "the judge call failed" in result.criteria[0].evidence


def test_run_takes_criteria_and_a_check_command(workspace: Path) -> None:
    from durable_agent import cli

    args = (
        "run",
        "g",
        "--workspace",
        str(workspace),
        "--check-command",
        "make test",
        "--criterion",
        "a",
        "--criterion",
        "b",
    )
    given = cli._agent_input(cli.build_parser().parse_args(args), demo=False)
    assert (given.check_command, given.success_criteria) == ("make test", ["a", "b"])
    plain = cli._agent_input(cli.build_parser().parse_args(args[:4]), demo=False).model_dump(exclude_unset=True)
    assert "check_command" not in plain and "success_criteria" not in plain  # an agent file's stay in force


async def test_checks_continue_as_new_like_any_step_and_carry_their_count(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="finished?")
    model_server.judge = judge_says(False)
    handle = await start(
        client,
        task_queue,
        goal="never quite done",
        workspace=str(workspace),
        success_criteria="it is perfect",
        continue_as_new_every=10,
        limits={"max_done_checks": 12},
    )
    result = await handle.result()
    assert result.state == "completed" and result.steps == 12
    assert result.usage.done_checks == 12 and result.usage.model_calls == 24
    assert [(c.met, c.check) for c in result.criteria] == [(False, 12)]
    runs = [run async for run in client.list_workflows(f'WorkflowId="{handle.id}"')]
    assert len(runs) == 2  # a rejected answer ends its step: the run continued as new at step 10


async def test_no_check_spends_past_a_used_up_budget(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([], final="answered with the last call")
    handle = await start(
        client,
        task_queue,
        goal="one call only",
        workspace=str(workspace),
        check_command="true",
        success_criteria="it is right",
        limits={"max_model_calls": 1},
    )
    result = await handle.result()
    assert result.state == "completed" and result.output == "answered with the last call"
    assert len(model_server.requests) == 1 and result.usage.model_calls == 1  # no judge call
    assert (result.usage.tool_calls, result.usage.done_checks) == (0, 0)  # no check command
    assert [(c.kind, c.met, c.evidence) for c in result.criteria] == [
        ("command", False, "not checked: the run's model_call_budget is used up"),
        ("statement", False, "not checked: the run's model_call_budget is used up"),
    ]
    assert result.unfinished == ["criterion not met: `true` exits 0", "criterion not met: it is right"]


def test_criteria_are_bounded() -> None:
    from pydantic import ValidationError

    from workflows.types import AgentInput

    for criteria in (["x"] * 51, "y" * 2_001):
        try:
            AgentInput(goal="g", workspace="/w", success_criteria=criteria)
        except ValidationError as e:
            assert "at most 50 criteria of at most 2,000 characters each" in str(e)
        else:
            raise AssertionError(f"accepted {len(criteria)}")
    assert AgentInput(goal="g", workspace="/w", success_criteria=["x"] * 50).success_criteria == ["x"] * 50
