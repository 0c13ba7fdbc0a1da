"""The Temporal peer of `bench fleet` and `bench compare`: a plain agent loop whose model call is a regular activity.

What a Temporal user would write in 40 lines: the transcript is the workflow's state and
goes, whole, into every model call's input (so history grows with the square of the
steps, which at 4 steps does not matter); the tools are regular activities too, a reply's
calls all at once (`asyncio.gather`) or, with `PlainCall.tools_in_order`, one after another. It does
the benchmark agent's work with the same parts as the other peers (bench/task.py). Its
worker runs with durable-agent's worker options (runner, slots), so that only the two
workflows differ: `python -m bench.plain_temporal --task-queue Q`.

With `PlainCall.product_tools` the same loop calls durable-agent's own tool activities
(`write_file` and `run_command` of activities/tools: the journal, the bubblewrap sandbox,
the cgroup and rlimits, the run files) instead of the peers' plain `bash -c` and file
write, so that the fleet row can tell the orchestration's cost from the tools'.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

if TYPE_CHECKING:
    from bench.harness import Bench

with workflow.unsafe.imports_passed_through():
    from activities.tools import ToolActivities
    from bench.task import ModelClient, PeerAgent, assistant_message, run_tool
    from workflows.compaction import run_folder
    from workflows.tool_specs import parse_tool_call
    from workflows.types import AgentInput, ModelReply, ToolCall, ToolCallInput, ToolOutcome

PLAIN_WORKFLOW = "PlainAgentLoop"
TIMEOUT = timedelta(seconds=120)


class PlainCall(BaseModel):
    goal: str
    workspace: str
    messages: list[dict[str, Any]] = []
    tool_call: ToolCall | None = None
    product_tools: bool = False
    """Run the tools as durable-agent's activities (module docstring)."""
    tools_in_order: bool = False
    """Run a reply's tool calls one after another, as durable-agent does (a command may use the
    file a write of the same reply made), not all at once."""

    @classmethod
    def start(cls, goal: str, workspace: str, product_tools: bool = False, tools_in_order: bool = False) -> PlainCall:
        """A run's input: the transcript opens as durable-agent's does."""
        opening = PeerAgent.create(goal, workspace).opening()
        return cls(
            goal=goal, workspace=workspace, messages=opening, product_tools=product_tools, tools_in_order=tools_in_order
        )


@workflow.defn(name=PLAIN_WORKFLOW)
class PlainAgentLoop:
    @workflow.run
    async def run(self, call: PlainCall) -> str:
        messages = list(call.messages)
        step = 0
        while True:
            step += 1
            request = call.model_copy(update={"messages": messages})
            reply = await workflow.execute_activity(
                "plain_call_model", request, result_type=ModelReply, start_to_close_timeout=TIMEOUT
            )
            messages.append(assistant_message(reply))
            if not reply.tool_calls:
                return reply.content or ""
            run_tool = self._product_tool if call.product_tools else self._plain_tool
            if call.tools_in_order:
                for tool_call in reply.tool_calls:
                    messages.append(await run_tool(call, step, tool_call))
            else:
                messages.extend(await asyncio.gather(*(run_tool(call, step, c) for c in reply.tool_calls)))

    @staticmethod
    async def _plain_tool(call: PlainCall, step: int, tool_call: ToolCall) -> dict[str, Any]:
        return await workflow.execute_activity(
            "plain_tool",
            call.model_copy(update={"tool_call": tool_call}),
            result_type=dict,
            start_to_close_timeout=TIMEOUT,
        )

    @staticmethod
    async def _product_tool(call: PlainCall, step: int, tool_call: ToolCall) -> dict[str, Any]:
        """durable-agent's activity for the call, given the input its workflow would give it."""
        info = workflow.info()
        tools = AgentInput(goal=call.goal, workspace=call.workspace).enabled_tools()
        arguments = parse_tool_call(tool_call.name, tool_call.arguments, tools).model_dump(exclude_none=True)
        request = ToolCallInput(
            call_id=tool_call.id,
            idempotency_key=f"{info.run_id}:{step}:{tool_call.id}",
            workspace=call.workspace,
            arguments=arguments,
            run_folder=run_folder(info.workflow_id, info.run_id),
            step=step,
        )
        outcome = await workflow.execute_activity(
            tool_call.name, request, result_type=ToolOutcome, start_to_close_timeout=TIMEOUT
        )
        text = outcome.output if outcome.ok else f"ERROR: {outcome.error}"
        return {"role": "tool", "tool_call_id": tool_call.id, "content": text}


class PlainActivities:
    def __init__(self) -> None:
        self._model: ModelClient | None = None

    @activity.defn(name="plain_call_model")
    async def call_model(self, call: PlainCall) -> ModelReply:
        self._model = self._model or ModelClient()
        return await self._model.complete(PeerAgent.create(call.goal, call.workspace), call.messages)

    @activity.defn(name="plain_tool")
    async def tool(self, call: PlainCall) -> dict[str, Any]:
        assert call.tool_call is not None
        return await run_tool(PeerAgent.create(call.goal, call.workspace), call.tool_call)


async def serve(task_queue: str) -> None:
    from durable_agent.connection import connect
    from durable_agent.worker_settings import worker_settings
    from worker import watch_commands_by_pidfd

    watch_commands_by_pidfd()  # as durable-agent's worker waits for its commands
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    client = await connect()
    async with plain_worker(client, task_queue, **worker_settings(task_queue).slots()):
        print("plain worker polling", flush=True)
        await stop.wait()


def plain_worker(client: Client, task_queue: str, **options: Any) -> Worker:
    """The plain loop's worker: its workflow, its two activities and durable-agent's two tools."""
    from worker import WORKFLOW_RUNNER

    activities, tools = PlainActivities(), ToolActivities()
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[PlainAgentLoop],
        activities=[activities.call_model, activities.tool, tools.write_file, tools.run_command],
        workflow_runner=WORKFLOW_RUNNER,
        **options,
    )


def spawn_plain_worker(b: Bench, task_queue: str) -> subprocess.Popen[bytes]:
    """`python -m bench.plain_temporal` on the bench's server and stub, stopped with the bench."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "bench.plain_temporal", "--task-queue", task_queue],
        env={**os.environ, **b.worker_env},
        stdout=open(b.home / f"plain-worker-{len(b.workers)}.log", "ab"),  # noqa: SIM115 (the process owns it)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    b.workers.append(worker)
    return worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task-queue", required=True)
    asyncio.run(serve(parser.parse_args().task_queue))
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
