"""CPU per model call, streamed against unstreamed, on the worker's side of the call.

`python -m bench stream [--calls N] [--rounds R]`: the stub model runs in a child process
(its CPU is not counted), and this process makes N calls per round in each mode through
`call_model`'s own code (the SDK's client, the request, the reply's assembly and checks),
alternating modes round by round; CPU is `time.process_time()` of this process. Replies:
a typical agent turn (a sentence and a tool call with ~500 characters of arguments) and a
long one (4,000 characters of text), sent in events of 4 characters, each its own HTTP
chunk, as OpenAI sends ~1 token per event: all in one write by default, or one write per
event `--interval-ms` apart (as a model produces them, so the worker waits for them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from activities.model import ModelActivities, _reply, _request, post_chat_completion
from activities.model_clients import openai_sdk
from activities.model_stream import StreamProgress
from durable_agent.model_server import ModelServer, Reply

REPLIES = {
    "typical": Reply(
        content="I'll write the module with its docstring, then run the tests.",
        tool_calls=[("write_file", {"path": "calc.py", "content": "def average(numbers):\n    return 1\n" * 14})],
    ),
    "long": Reply(content="All tests pass. " * 250),
}
CONTEXT = [{"role": "system", "content": "You are a careful engineer. " * 20}] + [
    {"role": "user" if i % 2 else "assistant", "content": f"step {i}: " + "output line\n" * 30} for i in range(20)
]


def serve(reply: str, interval_ms: float) -> None:
    """The child process: the stub, answering every call with REPLIES[reply]."""
    with ModelServer(lambda request: REPLIES[reply]) as server:
        server.stream_interval_s = interval_ms / 1000
        print(server.base_url, flush=True)
        sys.stdin.read()


async def calls(client: Any, streamed: bool, count: int) -> float:
    """CPU seconds of `count` calls, one after another."""
    model = ModelActivities(client)
    request = _request("gpt-4.1-mini", CONTEXT, ["read_file", "write_file", "run_command"], [])
    started = time.process_time()
    for _ in range(count):
        if streamed:
            reply = await model._streamed_reply(client, "gpt-4.1-mini", request, StreamProgress())
        else:
            reply = _reply("gpt-4.1-mini", await post_chat_completion(client, request), request["messages"])
        assert reply is not None and reply.output_tokens > 0
    return time.process_time() - started


async def measure(reply: str, count: int, rounds: int, interval_ms: float) -> dict[str, list[float]]:
    child = subprocess.Popen(
        [sys.executable, "-m", "bench", "stream", "--serve", reply, "--interval-ms", str(interval_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base_url = child.stdout.readline().strip()  # type: ignore[union-attr]
        client = openai_sdk().AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        await calls(client, True, 20)  # warm up both paths and the connection pool
        await calls(client, False, 20)
        ms: dict[str, list[float]] = {"unstreamed": [], "streamed": []}
        for _ in range(rounds):
            for mode in ms:
                ms[mode].append(await calls(client, mode == "streamed", count) / count * 1000)
        await client.close()
        return ms
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per round and mode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--interval-ms", type=float, default=0.0, help="the stub's wait between events (0: one write per reply)"
    )
    parser.add_argument("--serve", choices=list(REPLIES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.interval_ms)
        return
    rows = {}
    for reply in REPLIES:
        ms = asyncio.run(measure(reply, args.calls, args.rounds, args.interval_ms))
        plain, streamed = statistics.median(ms["unstreamed"]), statistics.median(ms["streamed"])
        rows[reply] = {
            "unstreamed_ms": round(plain, 3),
            "streamed_ms": round(streamed, 3),
            "ratio": round(streamed / plain, 2),
        }
        print(
            f"{reply:>8} reply: CPU per call, median of {args.rounds} rounds of {args.calls}: "
            f"unstreamed {plain:.2f} ms, streamed {streamed:.2f} ms ({streamed / plain:.2f}x); "
            f"rounds {[round(x, 2) for x in ms['unstreamed']]} / {[round(x, 2) for x in ms['streamed']]}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
