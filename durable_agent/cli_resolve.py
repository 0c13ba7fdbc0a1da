"""`durable-agent resolve --all ACTION`: one decision for every run that needs attention.

After an outage that outlasted `limits.outage_wait_s`, or a bad key fixed on the workers,
many runs wait for the same decision. The runs are found by their `AgentState` search
attribute (only live ones: ExecutionStatus Running) and each gets the `resolve` update, a few
at a time; a run that was decided meanwhile (or left the state) is reported, not retried.
"""

from __future__ import annotations

import argparse
import asyncio

from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError

from durable_agent.console import Console
from durable_agent.launch import connect_client
from workflows.types import WORKFLOW_TYPE, Resolution

EXIT_OK, EXIT_SOME_FAILED = 0, 1
UPDATE_TIMEOUT_S = 30.0
"""The default of `--wait`: a run whose worker is gone cannot take the update; it is reported
after this long, the others go on."""
AT_ONCE = 20
"""Updates in flight at once: each waits for its run's worker to take it."""
STATES = ("needs_attention",)
"""The states `resolve` decides: a run leaves needs_attention with it."""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true", help="decide every live run in --state (instead of one ID)")
    parser.add_argument("--state", choices=STATES, default=STATES[0], help="with --all: the runs' state")
    parser.add_argument(
        "--query", help="with --all: a Temporal list filter the runs must also match, e.g. \"TaskQueue='team-a'\""
    )
    parser.add_argument(
        "--wait",
        type=seconds,
        default=UPDATE_TIMEOUT_S,
        metavar="S",
        help=f"with --all: how long each run's worker has to take the decision (default {UPDATE_TIMEOUT_S:g})",
    )


def seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


async def resolve_all(args: argparse.Namespace, console: Console) -> int:
    client = await connect_client()
    ids = await runs_in_state(client, args.state, args.query)
    if not ids:
        console.line(f"no live runs in state {args.state}")
        return EXIT_OK
    resolution = Resolution(action=args.action, note=args.note)
    gate = asyncio.Semaphore(AT_ONCE)

    async def decide(run_id: str) -> str | None:
        async with gate:
            try:
                handle = client.get_workflow_handle(run_id)
                update = handle.execute_update("resolve", resolution, result_type=str)
                outcome = await asyncio.wait_for(update, args.wait)
            except (WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError, RPCError, TimeoutError) as e:
                console.line(f"{run_id}: not resolved: {_reason(e, args.wait)}")
                return None
            console.line(f"{run_id}: {outcome}")
            return run_id

    done = [r for r in await asyncio.gather(*(decide(i) for i in ids)) if r is not None]
    console.line(f"{args.action}: {len(done)} of {len(ids)} run(s) in {args.state}")
    return EXIT_OK if len(done) == len(ids) else EXIT_SOME_FAILED


def _reason(error: Exception, wait_s: float) -> str:
    if isinstance(error, TimeoutError | WorkflowUpdateRPCTimeoutOrCancelledError):
        return f"no worker took the decision within {wait_s:g} s (is one running for its task queue?)"
    return str(error.cause if isinstance(error, WorkflowUpdateFailedError) else error)


async def runs_in_state(client: Client, state: str, extra: str | None = None) -> list[str]:
    """The live runs whose AgentState is `state` (and that match `extra`), each chain once."""
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Running' AND AgentState = '{state}'"
    if extra:
        query += f" AND ({extra})"
    return list(dict.fromkeys([run.id async for run in client.list_workflows(query)]))
