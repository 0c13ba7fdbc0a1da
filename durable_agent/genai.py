"""Names and attributes of the OpenTelemetry GenAI spans, one place for live and replayed.

A run's spans follow the GenAI semantic conventions: `invoke_agent` for the run (its whole
continue-as-new chain), `chat {model}` for each model call, `execute_tool {name}` for each
tool call. The live spans (durable_agent/telemetry.py) and the spans `durable-agent trace`
re-emits from history (durable_agent/history.py) take their attributes from here.

Message content and tool arguments are recorded only when the user opts in with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`, redacted as history is.
"""

from __future__ import annotations

import json
import os
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.redaction import worker_redactor
from activities.tools.command import INTERRUPTED
from workflows.types import ModelCallInput, ModelReply, ToolCallInput, ToolOutcome

PROVIDER = "openai"
"""`gen_ai.provider.name`: every model is called through the openai SDK's chat completions."""

AGENT_NAME = "durable-agent"
INVOKE_AGENT = "invoke_agent"
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

Attributes = dict[str, Any]


def capture_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("true", "1", "yes")


def error_type(error: BaseException) -> str:
    """`error.type`: the application error's type (`ModelHttp429`, ...) or the class name."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type:
            return cause.type
        cause = cause.__cause__
    return type(error).__name__


def _redacted(text: str) -> str:
    """Content on a span is redacted as history is, with this process's secrets."""
    return worker_redactor().text(text)


def chat_span_name(model: str) -> str:
    return f"chat {model}"


def chat_attributes(request: ModelCallInput | None, reply: ModelReply | None, error: str | None) -> Attributes:
    """A `chat` span's attributes; `request` is None when replayed (history has no input)."""
    model = request.model if request is not None else (reply.model if reply is not None else "")
    attributes: Attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": model,
    }
    if reply is not None:
        attributes["gen_ai.response.model"] = reply.model
        attributes["gen_ai.usage.input_tokens"] = reply.input_tokens
        attributes["gen_ai.usage.output_tokens"] = reply.output_tokens
        if reply.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [reply.finish_reason]
    if error is not None:
        attributes["error.type"] = error
    if capture_content():
        if request is not None and request.messages:  # empty when the context went by reference
            attributes["gen_ai.input.messages"] = _redacted(json.dumps(request.messages))
        if reply is not None:
            attributes["gen_ai.output.messages"] = _redacted(reply.model_dump_json(include={"content", "tool_calls"}))
    return attributes


def tool_span_name(tool: str) -> str:
    return f"execute_tool {tool}"


def tool_outcome(outcome: ToolOutcome | None) -> str:
    """`durable_agent.tool.outcome`: ok, error (the model was told), interrupted (a worker
    died mid-command, durable_agent/takeover.py) or failed (the activity raised)."""
    if outcome is None:
        return "failed"
    if outcome.ok:
        return "ok"
    return "interrupted" if (outcome.error or "").startswith(INTERRUPTED) else "error"


def tool_attributes(tool: str, request: ToolCallInput, outcome: ToolOutcome | None, error: str | None) -> Attributes:
    attributes: Attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": request.call_id,
        "durable_agent.tool.outcome": tool_outcome(outcome),
    }
    if error is not None:
        attributes["error.type"] = error
    if capture_content():
        attributes["gen_ai.tool.call.arguments"] = _redacted(json.dumps(request.arguments))
        if outcome is not None:
            attributes["gen_ai.tool.call.result"] = _redacted(outcome.output if outcome.ok else (outcome.error or ""))
    return attributes


def riders(request: ToolCallInput, outcome: ToolOutcome | None) -> list[tuple[str, ToolCallInput, ToolOutcome]]:
    """The file calls that ran inside a command's activity, before it, each with its outcome
    (workflows/tool_steps.py, `_riders`): each is a tool call of its own in spans and metrics."""
    if outcome is None or len(outcome.riding) != len(request.riding):
        return []
    return [(r.tool, r.call, done) for r, done in zip(request.riding, outcome.riding, strict=True)]


def invoke_agent_attributes(workflow_id: str, result: Any, error: str | None) -> Attributes:
    """The run's span: its id, final state and usage (`result` is an `AgentResult`)."""
    attributes: Attributes = {
        "gen_ai.operation.name": INVOKE_AGENT,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.agent.name": AGENT_NAME,
        "gen_ai.agent.id": workflow_id,
        "gen_ai.conversation.id": workflow_id,
    }
    if result is not None:
        attributes.update(
            {
                "gen_ai.usage.input_tokens": result.usage.input_tokens,
                "gen_ai.usage.output_tokens": result.usage.output_tokens,
                "durable_agent.state": result.state,
                "durable_agent.stop_reason": result.stop_reason,
                "durable_agent.steps": result.steps,
                "durable_agent.cost_usd": result.usage.cost_usd,
            }
        )
    if error is not None:
        attributes["error.type"] = error
    return attributes
