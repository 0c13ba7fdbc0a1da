"""The peer a user would pick instead: LangGraph with its SQLite checkpointer.

The classic two-node agent graph (model -> tools -> model ... -> END) over a message
list, compiled with `AsyncSqliteSaver`, one thread per agent. LangGraph checkpoints after
every node; `durability` is LangGraph's own setting (its default, "async", writes a
checkpoint while the next node runs). A run is resumed by invoking the same thread again
with no input, as LangGraph documents.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from bench.task import ModelClient, PeerAgent, assistant_message, run_tools
from workflows.types import ToolCall

DEFAULT_DURABILITY = "async"
"""LangGraph's default (`Pregel.stream`), spelled out so RESULTS.md can name it."""


class State(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def build_graph(agent: PeerAgent, model: ModelClient, saver: AsyncSqliteSaver) -> Any:
    async def call_model(state: State) -> dict[str, Any]:
        reply = await model.complete(agent, state["messages"])
        return {"messages": [assistant_message(reply)]}

    async def call_tools(state: State) -> dict[str, Any]:
        calls = [
            ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in state["messages"][-1]["tool_calls"]
        ]
        return {"messages": await run_tools(agent, calls)}

    def route(state: State) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    graph = StateGraph(State)
    graph.add_node("model", call_model)
    graph.add_node("tools", call_tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


@contextlib.asynccontextmanager
async def open_saver(db: Path) -> AsyncIterator[AsyncSqliteSaver]:
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        yield saver


async def run_thread(
    agent: PeerAgent,
    model: ModelClient,
    saver: AsyncSqliteSaver,
    thread_id: str,
    steps: int,
    durability: str = DEFAULT_DURABILITY,
) -> str:
    """Run (or resume) one agent's thread to its end; the final answer."""
    graph = build_graph(agent, model, saver)
    # Two graph steps per agent step, plus the start and the final answer.
    config: Any = {"configurable": {"thread_id": thread_id}, "recursion_limit": 2 * steps + 10}
    started = await saver.aget_tuple(config) is not None
    given = None if started else {"messages": agent.opening()}
    state = await graph.ainvoke(given, config, durability=durability)
    return state["messages"][-1].get("content") or ""
