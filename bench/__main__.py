"""`python -m bench <name> [options]`: one of COMMANDS below (see bench/README.md)."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "compare": ("bench.compare", "durable-agent against its peers; writes bench/RESULTS.md"),
    "chaos": ("bench.chaos", "worker kills and server restarts under load; checks nothing is lost or doubled"),
    "fleet": ("bench.fleet", "many agents against a slow model, beside a plain Temporal loop"),
    "hosts": ("bench.hosts", "runs pinned to two hosts in their own mount namespaces: every call on its host"),
    "modes": ("bench.modes", "stateless, manual checkpoint and durable-agent under the same kills"),
    "history": ("bench.history", "history bytes per step on one long run"),
    "recovery": ("bench.recovery", "time from a worker SIGKILL to the next step, over repeated kills"),
    "long-run": ("bench.long_run", "1,000 steps in a bounded context: request, carry and history sizes"),
    "replay": ("bench.replay", "a new worker's replay of a run, with and without the SDK's sandbox"),
    "sandbox": ("bench.sandbox", "what run_command's bubblewrap sandbox costs per command"),
    "stream": ("bench.stream", "CPU per model call, streamed against unstreamed"),
    "live": ("bench.live", "what the live view of model replies costs per model call, on against off"),
    "tools": ("bench.tool_calls", "a call of the user's own @tool against the built-in write_file"),
    "mcp": ("bench.mcp", "a call of an MCP server's tool in a run, against a direct mcp call and write_file"),
    "snapshots": ("bench.snapshots", "workspace snapshot cost per step: own store against git's objects"),
    "clients": ("bench.clients", "CPU per model call with many in flight: one connection pool or several"),
    "redaction": ("bench.redaction", "what redaction costs per KiB of tool output, ordinary and hex-like"),
    "eager": ("bench.eager", "eager activity execution on and off, on two servers side by side"),
    "outage": ("bench.outage", "200 runs wait out a model endpoint outage: probes per minute per worker, exact end"),
    "pair": ("bench.pair", "this checkout's durable-agent against another checkout's, runs alternating"),
    "steps": ("bench.steps", "where a 0 ms step's time goes, from history: durable-agent beside the plain loops"),
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print("usage: python -m bench <name> [options]\n")
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:<9} {what}")
        sys.exit(0 if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") else 2)
    module, _ = COMMANDS[sys.argv[1]]
    sys.argv = [f"python -m bench {sys.argv[1]}", *sys.argv[2:]]  # each module parses its own options
    importlib.import_module(module).main()


if __name__ == "__main__":
    main()
