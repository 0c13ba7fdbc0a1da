"""Scripted model behaviour for tests: the reply depends only on the conversation so far.

Turn N of the script answers a request whose conversation holds N assistant messages,
so a retried or repeated call (after a crash) gets the same reply: deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable_agent.model_server import Failure, Reply, count_assistant_turns

Turn = Reply | Failure | Callable[[dict[str, Any]], "Reply | Failure"]


class Script:
    def __init__(self, turns: list[Turn], final: str = "done") -> None:
        self.turns = turns
        self.final = final

    def __call__(self, request: dict[str, Any]) -> Reply | Failure:
        index = count_assistant_turns(request)
        if index >= len(self.turns):
            return Reply(content=self.final)
        turn = self.turns[index]
        return turn(request) if callable(turn) else turn


def tools(*calls: tuple[str, dict[str, Any] | str], **usage: int) -> Reply:
    return Reply(tool_calls=list(calls), **usage)


def answer(text: str, **usage: int) -> Reply:
    return Reply(content=text, **usage)


def tool_results(request: dict[str, Any]) -> list[str]:
    """Contents of the tool messages the model was sent, in order."""
    return [m.get("content") or "" for m in request.get("messages", []) if m.get("role") == "tool"]


def goal_of(request: dict[str, Any]) -> str:
    """The run's goal: the first user message (each delegate has its own)."""
    return next((m.get("content") or "" for m in request.get("messages", []) if m.get("role") == "user"), "")


class ByGoal:
    """One script per run, chosen by the goal of the conversation (parent and delegates
    share the model server)."""

    def __init__(self, scripts: dict[str, Script]) -> None:
        self.scripts = scripts

    def __call__(self, request: dict[str, Any]) -> Reply | Failure:
        return self.scripts[goal_of(request)](request)
