"""What every benchmark needs: its own dev server, the step-scripted model, real workers."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

from activities.workspace import ROOTS_ENV
from bench.task import agent_of
from durable_agent.model_server import ModelServer, Reply, count_assistant_turns
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer, free_port, start_server
from workflows.types import AgentInput


def bench_input(goal: str, workspace: Path, steps: int, **overrides: Any) -> AgentInput:
    """The benchmark agent's run input: limits far enough out that no soft tier or stop
    changes what the model is sent; everything else is the product's default."""
    limits = {
        "soft_steps": steps + 5,
        "hard_steps": steps + 10,
        "max_model_calls": steps + 10,
        "max_tool_calls": 3 * steps,
        "max_tokens": 10**9,
    }
    return AgentInput.model_validate({"goal": goal, "workspace": str(workspace), "limits": limits, **overrides})


class StepScript:
    """The benchmark agent: each step writes a file and runs a short command, for `steps` steps.

    The command appends the step number to ledger.txt, so duplicated side effects show.
    """

    STEP_TOKENS = {"input_tokens": 50, "output_tokens": 20}
    """The usage each tool step's reply reports (the final answer reports 50 and 5)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.hooks: dict[int, Any] = {}
        """turn -> callable run (in the HTTP thread) when that turn is first asked for."""

    def __call__(self, request: dict[str, Any]) -> Reply:
        turn = count_assistant_turns(request)
        hook = self.hooks.pop(turn, None)
        if hook is not None:
            hook()
        if turn >= self.steps:
            return Reply(content=f"finished {self.steps} steps", input_tokens=50, output_tokens=5)
        n = turn + 1
        return Reply(
            tool_calls=[
                ("write_file", {"path": f"out/step-{n}.txt", "content": f"step {n}\n"}),
                ("run_command", {"command": f"echo {n} >> ledger.txt"}),
            ],
            **self.STEP_TOKENS,
        )


class RecheckingScript(StepScript):
    """The benchmark agent, plus what a real model does when a command reports an error.

    durable-agent never re-runs a command whose worker died mid-command; it tells the model
    to "check its effects before re-running it". This model does exactly that, in the next
    step and without an extra turn: `grep -qx N ledger.txt || echo N >> ledger.txt`.
    """

    def __init__(self, steps: int) -> None:
        super().__init__(steps)
        self.rechecks: set[tuple[str, int, int]] = set()
        """(agent, turn, step) of each re-check asked for: the ledger command of that step,
        or an earlier re-check of it, was reported interrupted in the turn before. A re-check
        that is itself interrupted is re-checked again at the next turn: one more tool call
        (the 43 against 42 of issue #29). A turn asked again (a model call retried after a
        kill) asks for the same re-checks, which count once."""

    def rechecks_of(self, agent: str) -> list[tuple[int, int]]:
        """(turn, step) of the agent's re-checks, one per tool call its run made for them."""
        return sorted((turn, step) for who, turn, step in self.rechecks if who == agent)

    def __call__(self, request: dict[str, Any]) -> Reply:
        reply = super().__call__(request)
        failed = failed_ledger_writes(request)
        turn = count_assistant_turns(request)
        self.rechecks.update((agent_of(request), turn, n) for n in failed)
        rechecks = [("run_command", {"command": f"grep -qx {n} ledger.txt || echo {n} >> ledger.txt"}) for n in failed]
        if rechecks and not reply.tool_calls:  # the last step's command: settle it before finishing
            return Reply(tool_calls=rechecks, **self.STEP_TOKENS)
        reply.tool_calls = [*reply.tool_calls, *rechecks]
        return reply


def failed_ledger_writes(request: dict[str, Any]) -> list[int]:
    """Step numbers whose ledger command, in the latest step, came back as an error."""
    messages = request.get("messages", [])
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        return []
    commands = {
        c["id"]: c["function"]["arguments"]
        for c in messages[last].get("tool_calls") or []
        if c["function"]["name"] == "run_command"
    }
    failed = [
        commands[m["tool_call_id"]]
        for m in messages[last + 1 :]
        if m.get("tool_call_id") in commands and str(m.get("content", "")).startswith("ERROR:")
    ]
    return [int(n) for arguments in failed for n in re.findall(r"echo (\d+) >>", arguments)]


@dataclass
class Bench:
    server: EmbeddedServer
    model: ModelServer
    task_queue: str
    home: Path
    workers: list[Popen[bytes]] = field(default_factory=list)
    keep: bool = False
    """Leave `home` (server database, worker logs, workspaces) on disk for a post-mortem."""

    @property
    def worker_env(self) -> dict[str, str]:
        return {
            "TEMPORAL_ADDRESS": self.server.address,
            "DURABLE_AGENT_TASK_QUEUE": self.task_queue,
            "OPENAI_BASE_URL": self.model.base_url,
            "OPENAI_API_KEY": "bench",
        }

    def start_worker(self, **env: str) -> Popen[bytes]:
        """A worker process; `env` changes its settings (a task queue, slot counts)."""
        worker = spawn_worker({**self.worker_env, **env}, self.home / f"worker-{len(self.workers)}.log")
        self.workers.append(worker)
        return worker

    def worker_log(self, worker: Popen[bytes]) -> Path:
        return self.home / f"worker-{self.workers.index(worker)}.log"

    def kill_worker(self, worker: Popen[bytes]) -> None:
        kill_hard(worker)

    def stop_server(self, sig: int = signal.SIGKILL) -> None:
        """Stop the dev server with `sig`; `start_server_again` brings it back."""
        self.server.stop(sig)

    def start_server_again(self) -> None:
        """A new dev server process on the same SQLite file and port."""
        host, port = self.server.address.rsplit(":", 1)
        self.server = start_server(self.home / "temporal", port=int(port), ui_port=None, persistent=True)

    def workspace(self) -> Path:
        path = self.home / f"ws-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        return path


@contextlib.contextmanager
def bench(script: Any, latency_s: float = 0.0, persistent: bool = True) -> Iterator[Bench]:
    home = Path(tempfile.mkdtemp(prefix="durable-agent-bench-"))
    server = start_server(home / "temporal", port=free_port(), ui_port=None, persistent=persistent)
    earlier_address = os.environ.get("TEMPORAL_ADDRESS")
    earlier_roots = os.environ.get(ROOTS_ENV)
    os.environ["TEMPORAL_ADDRESS"] = server.address
    os.environ[ROOTS_ENV] = str(home)  # the bench's workspaces (Bench.workspace)
    model = ModelServer(script, latency_s=latency_s).start()
    b = Bench(server=server, model=model, task_queue=f"bench-{uuid.uuid4().hex[:8]}", home=home)
    try:
        yield b
    except BaseException:
        b.keep = True
        raise
    finally:
        for worker in b.workers:
            stop_gently(worker, timeout_s=5)
        model.stop()
        b.server.stop()  # the one running now: start_server_again may have replaced it
        # Put back the caller's server (the test suite's session server, for instance).
        for name, earlier in (("TEMPORAL_ADDRESS", earlier_address), (ROOTS_ENV, earlier_roots)):
            if earlier is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = earlier
        if b.keep:
            print(f"benchmark files kept in {home}", flush=True)
        else:
            shutil.rmtree(home, ignore_errors=True)
