"""The benchmark agent task as the peers run it, built from durable-agent's own parts.

The peers (plain loops, LangGraph) must do the same work per step as durable-agent, so
only the orchestration differs: the same request body (system prompt, goal, the six tool
schemas, via `workflows.context` and `workflows.tool_specs`), the real `openai` SDK with
the worker's settings, the same argument validation, the same path checks and atomic
(fsynced) file write. What the peers do not get is durable-agent's idempotency journal and
its bubblewrap sandbox (they run commands as a plain `bash -c`): both are part of what
durable-agent costs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.model import _reply, post_chat_completion
from activities.model_clients import new_openai_client
from activities.workspace import Workspace
from workflows.context import initial_messages, openai_message
from workflows.tool_specs import RunCommandArgs, WriteFileArgs, openai_tool_schemas, parse_tool_call
from workflows.types import AgentInput, Message, ModelReply, ToolCall


def goal_for(index: int, steps: int) -> str:
    """Each agent's goal names it, so the stub's request log can be split per agent."""
    return f"bench agent {index}: do {steps} steps"


def agent_of(request: dict[str, Any]) -> str:
    """The goal of a recorded chat request (its first user message)."""
    return next((m.get("content") or "" for m in request.get("messages", []) if m.get("role") == "user"), "")


@dataclass(frozen=True)
class PeerAgent:
    """One agent's fixed parts, derived from the AgentInput durable-agent would be given."""

    goal: str
    workspace: Workspace
    tools: list[str]
    model: str

    @classmethod
    def create(cls, goal: str, workspace: str) -> PeerAgent:
        agent = AgentInput(goal=goal, workspace=workspace)
        return cls(goal, Workspace(workspace, [workspace]), agent.enabled_tools(), agent.model)

    def opening(self) -> list[dict[str, Any]]:
        """System prompt and goal, as durable-agent's workflow starts its transcript."""
        return [openai_message(m) for m in initial_messages(AgentInput(goal=self.goal, workspace=self.workspace.root))]


class ModelClient:
    """The real `openai` SDK, with the worker's client (no SDK retries, same timeout and connection pool)."""

    def __init__(self) -> None:
        self._client = new_openai_client()

    async def complete(self, agent: PeerAgent, messages: list[dict[str, Any]]) -> ModelReply:
        request = {"model": agent.model, "messages": messages, "tools": openai_tool_schemas(agent.tools)}
        response = await post_chat_completion(self._client, request)
        return _reply(agent.model, response, messages)


def assistant_message(reply: ModelReply) -> dict[str, Any]:
    return openai_message(Message(role="assistant", content=reply.content, tool_calls=reply.tool_calls))


async def run_tool(agent: PeerAgent, call: ToolCall) -> dict[str, Any]:
    """Run one tool call; the tool message to append. Only the benchmark's two tools exist."""
    args = parse_tool_call(call.name, call.arguments, agent.tools)
    if isinstance(args, WriteFileArgs):
        text = await asyncio.to_thread(_write_file, agent.workspace, args)
    elif isinstance(args, RunCommandArgs):
        text = await _run_command(agent.workspace, args)
    else:
        raise NotImplementedError(f"the benchmark agent does not use {call.name}")
    return {"role": "tool", "tool_call_id": call.id, "content": text}


async def run_tools(agent: PeerAgent, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Concurrently, as durable-agent runs a step's tool activities."""
    return list(await asyncio.gather(*(run_tool(agent, c) for c in calls)))


def _write_file(workspace: Workspace, args: WriteFileArgs) -> str:
    path = workspace.resolve(args.path, for_write=True)
    data = args.content.encode()
    atomic_write(path, data)
    return f"wrote {workspace.display(path)} ({len(data):,} bytes, {len(args.content.splitlines()):,} lines)"


async def _run_command(workspace: Workspace, args: RunCommandArgs) -> str:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        args.command,
        cwd=workspace.root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    out, _ = await process.communicate()
    return f"exit code: {process.returncode}\n{out.decode(errors='replace') or '(no output)'}"


def incomplete_step(messages: list[dict[str, Any]]) -> int:
    """How many trailing messages form a step whose tool results are not all there (0 if none).

    A loop resumed from its log drops them and asks the model again: it cannot know which
    of the step's tools already ran.
    """
    for back, message in enumerate(reversed(messages), start=1):
        if message.get("role") == "assistant":
            wanted = {c["id"] for c in message.get("tool_calls") or []}
            got = {m.get("tool_call_id") for m in messages[len(messages) - back + 1 :]}
            return 0 if wanted <= got else back
    return 0


class Clock:
    """Wall and CPU time since creation; CPU of this process and its reaped children (the commands)."""

    def __init__(self) -> None:
        self._wall0 = time.perf_counter()
        self._cpu0 = _cpu_s()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self._wall0, _cpu_s() - self._cpu0


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def atomic_write(path: Path, data: bytes) -> None:
    """The plain loops' file write: a temporary file renamed over `path`, as durable-agent's
    `write_file` replaces a file whole (without its journal or descriptors)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)
