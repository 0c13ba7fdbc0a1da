"""The offline demo run: the demo model in this process, a worker it kills and replaces.

The demo proves the product's one promise on the user's own machine. When step
KILL_DURING_STEP's model call arrives (steps before it are finished), the worker is
SIGKILLed (no cleanup, like an OOM kill) and a fresh one starts; it replays the run's
history and continues, and the model-call count at the end shows that no finished step
was redone. The kill is triggered by the model call itself, not by the follower's
polling, so it lands at the same point of the run on every machine.

The worker runs on a task queue of its own, so no other worker (with a real model) can
take the demo's calls, and the demo's worker takes no one else's.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections import Counter
from types import TracebackType
from typing import Any

from temporalio.client import Client

from durable_agent import demo_model
from durable_agent.connection import home
from durable_agent.console import Console
from durable_agent.launch import wait_until_polling
from durable_agent.model_server import ModelServer, Reply, count_assistant_turns
from durable_agent.processes import kill_hard, spawn_worker, stop_gently

KILL_DURING_STEP = 3
RESTART_DELAY_S = 0.5


class Demo:
    """Owns the demo model server and the demo worker for the length of one `run`."""

    def __init__(self, console: Console, address: str, run_id: str) -> None:
        self.console = console
        self.address = address
        self.queue = f"durable-agent-demo-{run_id}"
        self.model = ModelServer(self._respond)
        self.log = home() / "demo-worker.log"
        self.worker: subprocess.Popen[bytes] | None = None
        self._killed = threading.Event()
        self._never = threading.Event()
        # The crash runs in the model server's thread: the lock keeps it from starting a
        # worker after __exit__ stopped the last one (an orphan that would outlive us).
        self._lock = threading.Lock()
        self._closing = False
        # Lines from the model server's thread, printed by the follower in step order.
        self._notes: queue.SimpleQueue[str] = queue.SimpleQueue()

    def __enter__(self) -> Demo:
        self.model.start()
        self.worker = self._spawn()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        with self._lock:
            self._closing = True
            if self.worker is not None:
                stop_gently(self.worker)
        self.model.stop()

    async def wait_ready(self, client: Client) -> None:
        """Wait for the first worker to poll: one that cannot start is reported, not waited on."""
        if self.worker is not None:
            await wait_until_polling(client, self.queue, self.worker, self.log)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return spawn_worker(
            {
                "OPENAI_BASE_URL": self.model.base_url,
                "OPENAI_API_KEY": "offline-demo",  # the openai SDK insists on a key; the demo ignores it
                "DURABLE_AGENT_TASK_QUEUE": self.queue,
                "TEMPORAL_ADDRESS": self.address,
            },
            self.log,
        )

    def _respond(self, request: dict[str, Any]) -> Reply:
        step = count_assistant_turns(request) + 1
        if step == KILL_DURING_STEP and not self._killed.is_set():
            self._killed.set()
            self._crash_worker(step)
            # The caller is dead: a reply would only hit a closed socket. This request is
            # never answered; its (daemon) thread ends with the process.
            self._never.wait()
        return demo_model.respond(request)

    def _crash_worker(self, step: int) -> None:
        with self._lock:
            if self._closing or self.worker is None:
                return
            kill_hard(self.worker)
        self._notes.put(
            f"durability demo: killed the worker (pid {self.worker.pid}) with SIGKILL while step {step}'s "
            "model call was in flight; everything it held in memory is gone"
        )
        time.sleep(RESTART_DELAY_S)
        with self._lock:
            if self._closing:
                return
            self.worker = self._spawn()
        self._notes.put(
            f"durability demo: started a new worker (pid {self.worker.pid}); it replays the run's history "
            f"and retries step {step}'s model call (steps before it are not run again)"
        )

    def on_progress(self, printed_through: int) -> None:
        """The follower's hook: print the kill's notes once the steps before it are shown."""
        if printed_through < KILL_DURING_STEP - 1:
            return
        while not self._notes.empty():
            self.console.line(self._notes.get())

    def report(self) -> str:
        """Calls the demo model received, per step: the proof that nothing finished was redone."""
        calls = Counter(count_assistant_turns(request) + 1 for request in self.model.requests)
        repeated = sorted(step for step, count in calls.items() if count > 1)
        redone = [step for step in repeated if step != KILL_DURING_STEP]
        text = f"durability demo: the demo model got {sum(calls.values())} calls for {len(calls)} steps"
        if repeated == [KILL_DURING_STEP]:
            text += f" (step {KILL_DURING_STEP}'s call twice: it was in flight when the worker died)"
        return text + f"; finished steps redone after the kill: {len(redone)}"
