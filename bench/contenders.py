"""The four implementations behind one interface, so every measurement is made the same way.

Each contender runs the benchmark agent in processes of its own (the model stub and the
Temporal server belong to the shared `Bench`): `run` for timed runs, and
`begin` / `kill` / `restart` / `finish` for the recovery benchmark.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any

import psutil
from temporalio.client import Client, WorkflowHandle

from bench.harness import Bench, bench_input
from bench.plain_temporal import PLAIN_WORKFLOW, PlainCall, spawn_plain_worker
from bench.task import goal_for
from durable_agent.runs import start_agent


@dataclass
class Figures:
    wall_s: float
    cpu_s: float | None
    bytes: int | None
    outputs: list[str]
    extra: dict[str, Any]


class PeerContender:
    """A peer implementation (see bench/peer_process.py), one process per run."""

    LABELS = {
        "jsonl": "plain loop + JSONL log",
        "snapshot": "plain loop + fsynced snapshot",
        "langgraph": "LangGraph + SQLite",
        "langgraph-sync": 'LangGraph + SQLite, durability="sync"',
        "stateless": "stateless (restarts from zero)",
        "checkpoint": "manual checkpoint every 10 steps",
    }
    BYTES = {
        "jsonl": "size of the JSONL session log",
        "snapshot": "size of the JSON snapshot file",
        "langgraph": "size of the SQLite file (WAL folded in when the saver closes)",
        "langgraph-sync": "size of the SQLite file (WAL folded in when the saver closes)",
        "stateless": "size of the JSONL session log (never read back)",
        "checkpoint": "size of the JSON snapshot file",
    }
    cpu_scope = "the peer process (loop, openai client, checkpointing) and its `bash` children"
    measures_recovery = True
    resumes = "no: the crashed process must be run again on the same state (log, snapshot, thread)"

    def __init__(self, impl: str, bench: Bench) -> None:
        self.impl = impl
        self.name = self.LABELS[impl]
        self.bytes_scope = self.BYTES[impl]
        self.bench = bench
        self._process: asyncio.subprocess.Process | None = None
        self._kill_args: tuple[Path, int, int] | None = None

    async def prepare(self) -> None:
        pass

    async def run(self, steps: int, agents: int) -> Figures:
        folder = self._folder()
        await self._spawn(folder, steps, agents)
        return await self.finish_figures()

    async def begin(self, steps: int) -> Path:
        self._kill_args = (self._folder(), steps, 1)
        await self._spawn(*self._kill_args)
        return self._kill_args[0] / "agent-0" / "ws" / "ledger.txt"

    async def kill(self) -> None:
        assert self._process is not None
        self._process.kill()
        await self._process.wait()

    async def restart(self) -> None:
        assert self._kill_args is not None, "begin() first"
        await self._spawn(*self._kill_args)

    async def finish(self) -> str:
        return (await self.finish_figures()).outputs[0]

    async def finish_figures(self) -> Figures:
        assert self._process is not None
        out, err = await self._process.communicate()
        if self._process.returncode != 0:
            raise RuntimeError(f"{self.name} failed ({self._process.returncode}):\n{err.decode()[-3000:]}")
        result = json.loads(out)
        return Figures(result["wall_s"], result["cpu_s"], result["bytes"], result["outputs"], {})

    def _folder(self) -> Path:
        return self.bench.home / f"{self.impl}-{uuid.uuid4().hex[:8]}"

    async def _spawn(self, folder: Path, steps: int, agents: int) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.peer_process",
            "--impl",
            self.impl,
            "--folder",
            str(folder),
            "--steps",
            str(steps),
            "--agents",
            str(agents),
            env={**os.environ, "OPENAI_BASE_URL": self.bench.model.base_url, "OPENAI_API_KEY": "bench"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )


class WorkerContender:
    """A Temporal contender: one worker process of its own on the bench's dev server.
    Subclasses say how to start the worker and a run, and what a single run persisted."""

    name: str
    resumes = "yes: any running or new worker continues the run; nothing is re-submitted"
    measures_recovery = True

    def __init__(self, bench: Bench, client: Client) -> None:
        self.bench = bench
        self.client = client
        self._worker: Popen[bytes] | None = None
        self._workspaces: dict[str, Path] = {}

    async def prepare(self) -> None:
        """A worker, warmed up by a short run (its start-up is not part of any figure)."""
        self._worker = self._spawn_worker()
        await self.run(3, 1)

    async def run(self, steps: int, agents: int) -> Figures:
        worker, server = self._live_worker().pid, self.bench.server.process.pid
        cpu0, wall0 = {pid: _cpu_s(pid) for pid in (worker, server)}, time.perf_counter()
        handles = await asyncio.gather(*(self._start(i, steps) for i in range(agents)))
        outputs = await asyncio.gather(*(self._output(h) for h in handles))
        wall_s = time.perf_counter() - wall0
        cpu = {pid: _cpu_s(pid) - before for pid, before in cpu0.items()}
        extra: dict[str, Any] = {"worker_cpu_s": cpu[worker], "server_cpu_s": cpu[server]}
        size = None
        if agents == 1:
            size, persisted = await self._persisted(handles[0])
            extra.update(persisted)
        return Figures(wall_s, sum(cpu.values()), size, list(outputs), extra)

    async def begin(self, steps: int) -> Path:
        self._handle = await self._start(0, steps)
        return self._workspaces[self._handle.id] / "ledger.txt"

    async def kill(self) -> None:
        self.bench.kill_worker(self._live_worker())

    async def restart(self) -> None:
        self._worker = self._spawn_worker()

    async def finish(self) -> str:
        return await self._output(self._handle)

    def _spawn_worker(self) -> Popen[bytes]:
        raise NotImplementedError

    async def _start(self, index: int, steps: int) -> WorkflowHandle:
        raise NotImplementedError

    async def _output(self, handle: WorkflowHandle) -> str:
        raise NotImplementedError

    async def _persisted(self, handle: WorkflowHandle) -> tuple[int, dict[str, Any]]:
        """History bytes of a single run, and figures to keep beside them."""
        return (await history_bytes(self.client, handle.id))[0], {}

    def _live_worker(self) -> Popen[bytes]:
        assert self._worker is not None and self._worker.poll() is None, f"the {self.name} worker is not running"
        return self._worker


class DurableContender(WorkerContender):
    """durable-agent: one worker process (`python worker.py`) on the bench's dev server."""

    name = "durable-agent"
    cpu_scope = "the worker process and its `bash` children + the Temporal dev server process"
    bytes_scope = "historySizeBytes, summed over the run's continue-as-new chain"

    def _spawn_worker(self) -> Popen[bytes]:
        return self.bench.start_worker()

    async def _start(self, index: int, steps: int) -> WorkflowHandle:
        workspace = self.bench.workspace()
        workflow_id = f"bench-{uuid.uuid4().hex[:10]}"
        self._workspaces[workflow_id] = workspace
        agent = bench_input(goal_for(index, steps), workspace, steps)
        return await start_agent(self.client, agent, workflow_id, self.bench.task_queue)

    async def _output(self, handle: WorkflowHandle) -> str:
        return (await handle.result()).output

    async def _persisted(self, handle: WorkflowHandle) -> tuple[int, dict[str, Any]]:
        size, chain = await history_bytes(self.client, handle.id)
        return size, {"journal_bytes": journal_bytes(self._workspaces[handle.id]), "runs_in_chain": chain}


class PlainTemporalContender(WorkerContender):
    """The 40-line Temporal loop of bench/plain_temporal.py, one worker process of its own;
    with `product_tools`, calling durable-agent's tool activities instead of the peers'
    `bash -c` and file write. Beside durable-agent it shows what Temporal itself costs
    per step, and what durable-agent's tools do."""

    cpu_scope = "the plain worker process and its `bash` children + the Temporal dev server process"
    bytes_scope = "historySizeBytes of the run (every model call's input holds the whole transcript)"
    measures_recovery = False
    """Left out of `compare`'s kills: with the client's default timeouts (no heartbeat, a
    120 s start-to-close), a kill during a tool or model call waits out those 120 s."""

    def __init__(self, bench: Bench, client: Client, product_tools: bool = False) -> None:
        super().__init__(bench, client)
        self.name = "plain Temporal loop" + (" + durable-agent's tools" if product_tools else "")
        self.product_tools = product_tools
        self._queue = f"{bench.task_queue}-plain{'-tools' if product_tools else ''}"

    def _spawn_worker(self) -> Popen[bytes]:
        return spawn_plain_worker(self.bench, self._queue)

    async def _start(self, index: int, steps: int) -> WorkflowHandle:
        workspace = self.bench.workspace()
        call = PlainCall.start(goal_for(index, steps), str(workspace), self.product_tools)
        workflow_id = f"plain-{uuid.uuid4().hex[:10]}"
        self._workspaces[workflow_id] = workspace
        return await self.client.start_workflow(PLAIN_WORKFLOW, call, id=workflow_id, task_queue=self._queue)

    async def _output(self, handle: WorkflowHandle) -> str:
        return await handle.result()


def _cpu_s(pid: int) -> float:
    """User + system CPU of the process and its reaped children (the commands it ran)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _children_cpu_s(pid: int) -> float:
    """User + system CPU of the process's reaped children only (commands, sandboxes, helpers)."""
    t = psutil.Process(pid).cpu_times()
    return t.children_user + t.children_system


async def history_bytes(client: Client, workflow_id: str) -> tuple[int, int]:
    """historySizeBytes summed over the workflow's continue-as-new chain, and the chain's length."""
    sizes = []
    async for run in client.list_workflows(f'WorkflowId="{workflow_id}"'):
        described = await client.get_workflow_handle(workflow_id, run_id=run.run_id).describe()
        sizes.append(described.raw_description.workflow_execution_info.history_size_bytes)
    return sum(sizes), len(sizes)


def journal_bytes(workspace: Path) -> int:
    """The tool journal durable-agent keeps in the workspace: persisted too, outside history."""
    return sum(p.stat().st_size for p in (workspace / ".durable-agent").rglob("*") if p.is_file())
