"""What the model sees, and what a stopped run reports: pure functions of the transcript."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workflows.context_handoff import encode_message
from workflows.types import AgentInput, Message

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful software agent working in a workspace folder. Use the tools to read, "
    "write, edit, list and search files and to run commands; every path is relative to the "
    "workspace. Work step by step, check your work by running it, and when the goal is met "
    "reply with a short final answer and no tool calls."
)


def initial_messages(input: AgentInput) -> list[Message]:
    return [
        Message(role="system", content=input.system_prompt or DEFAULT_SYSTEM_PROMPT, step=0, kind="system_prompt"),
        Message(role="user", content=input.goal, step=0, kind="goal"),
    ]


RECORD_ONLY_KINDS = frozenset({"degradation", "compaction", "archived"})
"""Transcript entries for people (what changed and when), never sent to the model."""


def model_context(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.kind not in RECORD_ONLY_KINDS]


def estimate_tokens(messages: list[Message]) -> int:
    """Offline, nothing downloaded: about four characters a token plus a little per
    message. The provider's reported usage is the truth; `calibrated` scales this by how
    the last call's estimate compared with what the provider then reported."""
    # Counted in one pass, without building the texts: a step estimates its whole context
    # several times (the request, the hard stop, the status), so this loop is on every step.
    chars = texts = 0
    for m in messages:
        chars += len(m.content or "")
        texts += 1
        for call in m.tool_calls:
            chars += len(call.name) + len(call.arguments)
            texts += 1
    return _estimate(chars, texts)


def tokens_of(texts: Iterable[str]) -> int:
    """The estimate for texts (a message's content, a tool call's name and arguments each):
    also what a model call whose endpoint reported no usage is counted as."""
    chars = count = 0
    for text in texts:
        chars += len(text)
        count += 1
    return _estimate(chars, count)


def _estimate(chars: int, texts: int) -> int:
    """About four characters a token, and 16 characters' worth for each text's framing."""
    return (chars + 16 * texts) // 4 + 1


CALIBRATION_BOUNDS = (0.5, 2.0)
"""How far the provider's report may move the estimate: a stub or provider that reports
nothing useful (0 tokens) cannot make the estimate absurd."""


def calibrated(estimate: int, last_estimate: int, last_reported: int) -> int:
    """`estimate` scaled by the last call's reported / estimated input tokens."""
    if last_estimate <= 0 or last_reported <= 0:
        return estimate
    low, high = CALIBRATION_BOUNDS
    return round(estimate * min(high, max(low, last_reported / last_estimate)))


def last_answer(messages: list[Message]) -> str | None:
    for m in reversed(messages):
        if m.role == "assistant" and m.content and m.content.strip():
            return m.content
    return None


def progress_summary(messages: list[Message], step: int, reason: str, tool_calls: int) -> str:
    """A stopped run's output when the model never gave an answer: what it did, briefly."""
    calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
    recent = ", ".join(c.name for c in calls[-8:]) or "none"
    return f"Stopped at step {step} ({reason}) before a final answer. {tool_calls} tool call(s); last: {recent}."


def openai_message(message: Message) -> dict[str, Any]:
    """One message in the chat-completions wire format."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content or ""}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    elif out["content"] is None:
        out["content"] = ""
    return out


class WireContext:
    """The transcript in wire format, each message rendered once rather than at every call, and
    encoded for the call's digest once (`encode`): a 200-step run sends ~600 messages per call.
    Messages are never changed in place (an edit replaces one), which is what makes the cache exact."""

    def __init__(self) -> None:
        self._rendered: dict[int, tuple[Message, dict[str, Any]]] = {}
        self._encoded: dict[int, tuple[dict[str, Any], bytes]] = {}

    def render(self, messages: list[Message]) -> list[dict[str, Any]]:
        rendered: dict[int, tuple[Message, dict[str, Any]]] = {}
        for message in messages:
            hit = self._rendered.get(id(message))
            # `is` guards against a new message reusing a dropped one's id.
            rendered[id(message)] = hit if hit is not None and hit[0] is message else (message, openai_message(message))
        self._rendered = rendered
        kept = {id(wire) for _, wire in rendered.values()}
        self._encoded = {key: hit for key, hit in self._encoded.items() if key in kept}
        return [wire for _, wire in rendered.values()]

    def encode(self, wire: dict[str, Any]) -> bytes:
        """`encode_message(wire)` (workflows/context_handoff.py), from the cache for a message
        this context rendered."""
        hit = self._encoded.get(id(wire))
        if hit is not None and hit[0] is wire:
            return hit[1]
        encoded = encode_message(wire)
        self._encoded[id(wire)] = (wire, encoded)
        return encoded
