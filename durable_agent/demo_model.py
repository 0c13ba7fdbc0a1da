"""The offline demo model: a scripted "developer" that plays one fixed, useful scenario.

It writes `calc.py` (with a real bug in `median`) and `test_calc.py`, runs the test, reads
the failure, fixes the bug with `edit_file`, runs the test again and reports. Each reply
is a pure function of the conversation it is sent, so a call retried after a crash gets
the same reply, like a model at temperature 0. Where the story branches it reads the tool
results it was sent (exit codes, file contents), so it reacts to what really happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable_agent.model_server import Reply, count_assistant_turns
from workflows.compaction import command_exit_code

LABEL = "[offline demo model]"
MODEL = "offline-demo"
ENDPOINT_MODEL = "offline-demo-model"
"""The model name `durable-agent demo-model` answers with, whatever the request asked for."""
EMPTY_LISTING = "no files under"
"""How `list_files` starts its result for a folder with no files in it."""
GOAL = "Write calc.py with average() and median(), test them with test_calc.py, and fix any bug the test finds."
TEST_COMMAND = "python3 test_calc.py"

CALC_PY = '''\
"""Small statistics helpers."""


def average(numbers):
    """Arithmetic mean of a non-empty list."""
    return sum(numbers) / len(numbers)


def median(numbers):
    """Middle value of a non-empty list."""
    ordered = sorted(numbers)
    middle = len(ordered) // 2
    return ordered[middle]
'''

TEST_CALC_PY = '''\
"""Plain asserts, so it runs with `python3 test_calc.py` and needs no test framework."""

from calc import average, median


def test_average():
    assert average([2, 4, 6]) == 4


def test_median():
    assert median([3, 1, 2]) == 2
    result = median([4, 1, 3, 2])
    assert result == 2.5, f"median([4, 1, 3, 2]) returned {result}, expected 2.5"


if __name__ == "__main__":
    test_average()
    test_median()
    print("all tests passed")
'''

BUGGY_LINE = "    return ordered[middle]\n"
FIXED_LINES = (
    "    if len(ordered) % 2 == 0:\n"
    "        return (ordered[middle - 1] + ordered[middle]) / 2\n"
    "    return ordered[middle]\n"
)


def respond(request: dict[str, Any]) -> Reply:
    """The reply to one chat-completions request (the `ModelServer` responder)."""
    turn = count_assistant_turns(request)
    if turn >= len(_SCENARIO):
        return Reply(content="The task is finished; nothing is left to do.")
    return _SCENARIO[turn](_last_tool_results(request))


def respond_as_endpoint(request: dict[str, Any]) -> Reply:
    """The reply of `durable-agent demo-model`, the demo served at OPENAI_BASE_URL.

    Served that way it cannot know which folder it writes into, so its first turn lists the
    workspace, and it plays the scenario only when the folder holds no files; otherwise it
    stops without writing. Every reply starts with LABEL.
    """
    messages = request.get("messages", [])
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        return _labelled(Reply(content="First, checking that the workspace is empty.", tool_calls=[("list_files", {})]))
    rest = first + 1
    while rest < len(messages) and messages[rest].get("role") == "tool":
        rest += 1
    listing = [m.get("content") or "" for m in messages[first + 1 : rest]]
    if not listing or not listing[0].startswith(EMPTY_LISTING):
        return _labelled(
            Reply(
                content="The workspace already holds files. The offline demo model writes calc.py and "
                "test_calc.py and only ever works in an empty folder, so it stops here without writing anything."
            )
        )
    return _labelled(respond({**request, "messages": messages[:first] + messages[rest:]}))


def _labelled(reply: Reply) -> Reply:
    reply.content = f"{LABEL} {reply.content}" if reply.content else LABEL
    return reply


def _last_tool_results(request: dict[str, Any]) -> list[str]:
    """Contents of the tool messages after the last assistant message: the latest results."""
    results: list[str] = []
    for message in request.get("messages", []):
        if message.get("role") == "assistant":
            results = []
        elif message.get("role") == "tool":
            results.append(message.get("content") or "")
    return results


def _write_files(_: list[str]) -> Reply:
    # Two independent writes in one turn: the workflow runs them as concurrent activities.
    return Reply(
        content="I'll write the module and its test together.",
        tool_calls=[
            ("write_file", {"path": "calc.py", "content": CALC_PY}),
            ("write_file", {"path": "test_calc.py", "content": TEST_CALC_PY}),
        ],
    )


def _run_tests(_: list[str]) -> Reply:
    return Reply(tool_calls=[("run_command", {"command": TEST_COMMAND})])


def _inspect_failure(results: list[str]) -> Reply:
    if _passed(results):
        return Reply(content=f"`{TEST_COMMAND}` passes on the first try: calc.py and test_calc.py are done.")
    return Reply(
        content="The even-length median case fails; let me read calc.py.",
        tool_calls=[("read_file", {"path": "calc.py"})],
    )


def _fix_median(results: list[str]) -> Reply:
    if not any(BUGGY_LINE.strip() in r for r in results):
        return Reply(content="calc.py does not contain the code I expected, so I stop here without editing it.")
    return Reply(
        content="median() returns the upper middle value for even-length lists; it should average the two.",
        tool_calls=[("edit_file", {"path": "calc.py", "old_text": BUGGY_LINE, "new_text": FIXED_LINES})],
    )


def _rerun_tests(results: list[str]) -> Reply:
    if not results or results[0].startswith("ERROR"):
        return Reply(content=f"The edit failed ({results[0] if results else 'no result'}); calc.py is unchanged.")
    return _run_tests(results)


def _summarize(results: list[str]) -> Reply:
    if not _passed(results):
        return Reply(content=f"`{TEST_COMMAND}` still fails after the fix; calc.py needs another look.")
    return Reply(
        content=(
            "Done. I wrote calc.py (average, median) and test_calc.py. The first test run failed: "
            "median([4, 1, 3, 2]) returned 3 instead of 2.5, because median() took the upper middle "
            "value of an even-length list. I changed it to average the two middle values, and "
            f"`{TEST_COMMAND}` now passes."
        )
    )


def _passed(results: list[str]) -> bool:
    return bool(results) and command_exit_code(results[-1]) == 0


_SCENARIO: list[Callable[[list[str]], Reply]] = [
    _write_files,
    _run_tests,
    _inspect_failure,
    _fix_median,
    _rerun_tests,
    _summarize,
]
