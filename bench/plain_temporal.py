"""The fleet benchmark's peer: a plain Temporal agent loop whose model call is a regular activity.

What a Temporal user would write in 40 lines: the transcript is the workflow's state and
goes, whole, into every model call's input (so history grows with the square of the
steps, which at 4 steps does not matter); the tools are regular activities too. It does
the benchmark agent's work with the same parts as the other peers (bench/task.py). Its
worker runs with durable-agent's worker options (runner, slots), so that only the two
workflows differ: `python -m bench.plain_temporal --task-queue Q`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from bench.task import ModelClient, PeerAgent, assistant_message, run_tool
    from workflows.types import ModelReply, ToolCall

PLAIN_WORKFLOW = "PlainAgentLoop"
TIMEOUT = timedelta(seconds=120)


class PlainCall(BaseModel):
    goal: str
    workspace: str
    messages: list[dict[str, Any]] = []
    tool_call: ToolCall | None = None


@workflow.defn(name=PLAIN_WORKFLOW)
class PlainAgentLoop:
    @workflow.run
    async def run(self, call: PlainCall) -> str:
        messages = list(call.messages)
        while True:
            request = call.model_copy(update={"messages": messages})
            reply = await workflow.execute_activity(
                "plain_call_model", request, result_type=ModelReply, start_to_close_timeout=TIMEOUT
            )
            messages.append(assistant_message(reply))
            if not reply.tool_calls:
                return reply.content or ""
            results = await asyncio.gather(
                *(
                    workflow.execute_activity(
                        "plain_tool",
                        call.model_copy(update={"tool_call": c}),
                        result_type=dict,
                        start_to_close_timeout=TIMEOUT,
                    )
                    for c in reply.tool_calls
                )
            )
            messages.extend(results)


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
    from worker import WORKFLOW_RUNNER

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    client = await connect()
    activities = PlainActivities()
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[PlainAgentLoop],
        activities=[activities.call_model, activities.tool],
        workflow_runner=WORKFLOW_RUNNER,
        **worker_settings(task_queue).slots(),  # type: ignore[arg-type]
    ):
        print("plain worker polling", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task-queue", required=True)
    asyncio.run(serve(parser.parse_args().task_queue))
    os._exit(0)  # skip interpreter teardown: the core bridge can abort there (sdk-python#300)


if __name__ == "__main__":
    main()
