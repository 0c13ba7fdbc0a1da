"""CPU per model call with many calls in flight: one client (one connection pool) against
the worker's clients (activities/model_clients.py).

`python -m bench clients [--calls 250] [--waves 4] [--rounds 3]`: the stub model runs in a
child process (its CPU is not counted) and answers every call after `--latency-ms`, so a
wave's calls are all in flight at once, as a fleet's are. Each wave is `--calls` streamed
calls through `call_model`'s stream reader; after a warm-up wave, CPU is
`time.process_time()` of this process over `--waves` waves, per call. The two set-ups
alternate, round by round, each with its own clients; the connections each opened are
counted by the stub.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from activities import model_stream
from activities.model import MAX_REPLY_BYTES
from activities.model_clients import ModelClients, new_openai_client
from activities.model_stream import StreamedReply, StreamProgress, stream_chat_completion
from durable_agent.model_server import ModelServer, Reply

REQUEST = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "next step"}]}
REPLY = Reply(content="Running the tests now.", tool_calls=[("run_command", {"command": "pytest -q"})])

Lease = Callable[[], AbstractAsyncContextManager[Any]]


def serve(latency_ms: float) -> None:
    """The child process: the stub, printing its address, then each `connections` asked for."""
    with ModelServer(lambda request: REPLY) as server:
        server.latency_s = latency_ms / 1000
        print(server.base_url, flush=True)
        for _ in sys.stdin:
            print(server.connections, flush=True)


def one_client() -> tuple[Lease, Any]:
    client = new_openai_client()

    @asynccontextmanager
    async def lease() -> AsyncIterator[Any]:
        yield client

    return lease, client


async def wave(lease: Lease, calls: int) -> None:
    async def call() -> None:
        async with lease() as client:
            reply = StreamedReply(MAX_REPLY_BYTES)
            await stream_chat_completion(client, REQUEST, reply, StreamProgress())
        assert reply.done

    await asyncio.gather(*(call() for _ in range(calls)))
    while model_stream._tails:  # every body read to its end: its connection back in the pool
        await asyncio.sleep(0.01)


async def cpu_ms_per_call(lease: Lease, calls: int, waves: int) -> float:
    await wave(lease, calls)  # warm-up: the connections are made
    started = time.process_time()
    for _ in range(waves):
        await wave(lease, calls)
    return (time.process_time() - started) / (calls * waves) * 1000


async def measure(calls: int, waves: int, rounds: int, latency_ms: float) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, "-m", "bench", "clients", "--serve", "--latency-ms", str(latency_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    def connections() -> int:
        stdin.write("\n")
        stdin.flush()
        return int(stdout.readline())

    try:
        base_url = stdout.readline().strip()
        os.environ.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="bench")
        ms: dict[str, list[float]] = {"one client": [], "worker's clients": []}
        opened: dict[str, list[int]] = {name: [] for name in ms}
        pools: list[int] = []
        for _ in range(rounds):
            for name in ms:
                before = connections()
                if name == "one client":
                    lease, client = one_client()
                    ms[name].append(await cpu_ms_per_call(lease, calls, waves))
                    await client.close()
                else:
                    clients = ModelClients()
                    ms[name].append(await cpu_ms_per_call(clients.lease, calls, waves))
                    pools.append(clients.clients())
                opened[name].append(connections() - before)
        return {"cpu_ms_per_call": ms, "connections_opened": opened, "clients": pools}
    finally:
        stdin.close()
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=250, help="calls in flight at once (one wave)")
    parser.add_argument("--waves", type=int, default=4, help="measured waves per round and set-up")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=500, help="the stub's time to answer")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.latency_ms)
        return
    figures = asyncio.run(measure(args.calls, args.waves, args.rounds, args.latency_ms))
    for name, rounds in figures["cpu_ms_per_call"].items():
        print(
            f"{name:>16}: {statistics.median(rounds):.2f} ms CPU per call (median of {args.rounds} rounds of "
            f"{args.waves} waves of {args.calls}; rounds {[round(x, 2) for x in rounds]}), "
            f"connections opened per round {figures['connections_opened'][name]}"
        )
    print(json.dumps({"calls": args.calls, **figures}))


if __name__ == "__main__":
    main()
