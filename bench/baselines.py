"""The plain in-process loops durable-agent is measured against.

* `jsonl`: every message is appended to a JSONL session log and flushed (no fsync).
  Resumed by replaying the log: automatic per-step persistence, written by hand.
* `snapshot`: after every step the whole session is written as a JSON snapshot with the
  same atomic, fsynced write the tools use. Resumed from it: per-step persistence too.
* `stateless`: the seed's stateless mode. The session log is written for people to read,
  never read back: a run that is killed starts again from zero when run again.
* `checkpoint`: the seed's manual checkpoint mode. A snapshot every `CHECKPOINT_EVERY`
  steps; run again after a kill, it resumes from the last one and redoes the steps since.

They resume only when someone runs them again on the same folder; a step whose tool
results are not all recorded is dropped and asked of the model again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench.task import ModelClient, PeerAgent, assistant_message, atomic_write, dumps, incomplete_step, run_tools

Messages = list[dict[str, Any]]


class Store(Protocol):
    path: Path

    def load(self) -> Messages | None: ...
    def append(self, messages: Messages) -> None: ...
    def step_done(self, messages: Messages) -> None: ...


class JsonlLog:
    def __init__(self, folder: Path) -> None:
        self.path = folder / "session.jsonl"

    def load(self) -> Messages | None:
        if not self.path.exists():
            return None
        messages = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        # A torn last line is possible after a kill; everything before it is whole.
        drop = incomplete_step(messages)
        return messages[: len(messages) - drop] if drop else messages

    def append(self, messages: Messages) -> None:
        with self.path.open("a") as f:
            f.write("".join(dumps(m) + "\n" for m in messages))

    def step_done(self, messages: Messages) -> None:
        pass


class Snapshot:
    def __init__(self, folder: Path) -> None:
        self.path = folder / "snapshot.json"

    def load(self) -> Messages | None:
        return json.loads(self.path.read_bytes()) if self.path.exists() else None

    def append(self, messages: Messages) -> None:
        pass

    def step_done(self, messages: Messages) -> None:
        atomic_write(self.path, dumps(messages).encode())


class Stateless(JsonlLog):
    def load(self) -> Messages | None:
        return None


CHECKPOINT_EVERY = 10


class Checkpoint(Snapshot):
    def step_done(self, messages: Messages) -> None:
        steps = sum(1 for m in messages if m.get("role") == "assistant")
        if steps % CHECKPOINT_EVERY == 0:
            super().step_done(messages)


STORES: dict[str, Callable[[Path], Store]] = {
    "jsonl": JsonlLog,
    "snapshot": Snapshot,
    "stateless": Stateless,
    "checkpoint": Checkpoint,
}


async def run_loop(agent: PeerAgent, model: ModelClient, store: Store) -> str:
    """The agent loop: model call, then the tools it asked for, until it answers without tools."""
    messages = store.load()
    if messages is None:
        messages = agent.opening()
        store.append(messages)
    while True:
        reply = await model.complete(agent, messages)
        assistant = assistant_message(reply)
        store.append([assistant])
        if not reply.tool_calls:
            return reply.content or ""
        results = await run_tools(agent, reply.tool_calls)
        store.append(results)
        messages += [assistant, *results]
        store.step_done(messages)
