"""The model's context in wire format: rendered once per message, always the current transcript."""

from __future__ import annotations

from workflows.context import WireContext, openai_message
from workflows.types import Message, ToolCall


def test_each_message_is_rendered_once_and_the_result_follows_the_transcript() -> None:
    call = ToolCall(id="c1", name="list_files", arguments="{}")
    messages = [
        Message(role="system", content="s"),
        Message(role="assistant", content=None, tool_calls=[call], step=1),
        Message(role="tool", content="a.txt", tool_call_id="c1", step=1),
    ]
    wire = WireContext()
    first = wire.render(messages)
    assert first == [openai_message(m) for m in messages]
    assert first[1]["tool_calls"][0]["function"] == {"name": "list_files", "arguments": "{}"}
    assert first[2] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}

    messages.append(Message(role="assistant", content="done", step=2))
    second = wire.render(messages)
    assert all(a is b for a, b in zip(first, second[:3], strict=False))  # not rendered again
    assert second[3] == {"role": "assistant", "content": "done"}

    messages[1] = Message(role="user", content="replaced")  # a transcript rewritten in place
    third = wire.render(messages)
    assert third[1] == {"role": "user", "content": "replaced"} and len(third) == 4


def test_an_assistant_message_without_text_or_calls_sends_empty_text() -> None:
    assert openai_message(Message(role="assistant", content=None)) == {"role": "assistant", "content": ""}
