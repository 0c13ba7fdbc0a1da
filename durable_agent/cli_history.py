"""`durable-agent steps`, `diff` and `fork`: a run's steps, their files, and new runs from them.

Each reads the run chain's histories (durable_agent/step_history.py) and the snapshot store
(activities/snapshots.py); none needs a worker. The workflow's code, which the replay runs, is
imported by these commands only, not by every other command at start. Registered in cli.py's `build_parser` by
`add_history_commands`.
"""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from activities.snapshots import SnapshotError, Store, changed, unified_diff
from durable_agent.console import Console
from durable_agent.launch import LaunchError, connect_client

if TYPE_CHECKING:
    from durable_agent.step_history import ChainSteps, StepPoint

EXIT_OK, EXIT_FAILED = 0, 1
Handler = Callable[[argparse.Namespace, Console], Awaitable[int]]


def add_history_commands(commands: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """`command` is cli.py's `_command`, so these parse like every other command."""
    command(commands, "steps", list_steps, "one line per step: tool calls, files changed, tokens, cost", with_id=True)
    diff = command(commands, "diff", diff_steps, "the changes to the workspace's files of a step or a range", True)
    diff.add_argument("--step", type=int, help="the changes step N made")
    diff.add_argument("--from", dest="from_step", type=int, help="with --to: from after step A ...")
    diff.add_argument("--to", dest="to_step", type=int, help="... to after step B")
    fork = command(commands, "fork", fork_run, "start a new run from a step of this one, its files included", True)
    fork.add_argument(
        "--at-step", type=int, required=True, help="the step whose context and files the fork starts from"
    )
    fork.add_argument("--message", help="a user message the fork's model gets before its first call")
    fork.add_argument("--model", help="the fork's model (default: the source's)")
    fork.add_argument("--workspace", help="an empty or new folder for its files (default: beside the source's)")
    fork.add_argument("--id", dest="new_id", help="the fork's workflow id (default <id>-fork<N>-<random>)")
    fork.add_argument("--json", action="store_true", help="print the fork as JSON, for scripts")
    fork.add_argument("--fresh-budget", action="store_true", help="budgets count from 0, not the source's spend at N")
    back = command(commands, "rewind", rewind_run, "take a run back to a step, its files too (it waits paused)", True)
    back.add_argument("--to-step", type=int, required=True, help="the step whose context and files it goes back to")
    back.add_argument("--message", help="a user message the model gets before its next call")
    command(commands, "doctor", doctor_run, "the recovery checklist for a run, with the fix of each failure", True)
    edit = command(commands, "edit", edit_run, "edit a paused or needs-attention run's context (edit_context)", True)
    what = edit.add_mutually_exclusive_group(required=True)
    what.add_argument("--drop-step", type=int, help="drop an unfolded step's reply and tool results")
    what.add_argument("--replace-message", type=int, metavar="K", help="replace unfolded message K's text (--text)")
    what.add_argument("--compact", action="store_true", help="fold the older steps into the summary now")
    edit.add_argument("--text", help="with --replace-message: the new text")


async def list_steps(args: argparse.Namespace, console: Console) -> int:
    steps = await _steps(args.id)
    store = Store()
    for before, after in zip(steps.points, steps.points[1:], strict=False):
        console.line(step_line(steps, store, before, after))
    return EXIT_OK


def step_line(steps: ChainSteps, store: Store, before: StepPoint, after: StepPoint) -> str:
    from durable_agent.fork import describe_call

    calls = [c for t in steps.turns[before.turns_before : after.turns_before] for c in t.tool_calls]
    try:
        added, modified, deleted = changed(store.files(before.digest), store.files(after.digest))
        files = " ".join([*(f"+{p}" for p in added), *(f"~{p}" for p in modified), *(f"-{p}" for p in deleted)])
    except SnapshotError as e:
        files = f"({e})"
    tokens = after.carry.usage.tokens - before.carry.usage.tokens
    cost = after.carry.usage.cost_usd - before.carry.usage.cost_usd
    return (
        f"step {after.step}: calls: {'; '.join(describe_call(c) for c in calls) or 'none'} | "
        f"files: {files or 'unchanged'} | tokens {tokens:,} | ${cost:.4f}"
    )


async def diff_steps(args: argparse.Namespace, console: Console) -> int:
    if (args.step is None) == (args.from_step is None and args.to_step is None):
        raise LaunchError("give --step N, or --from A --to B")
    if args.step is None and (args.from_step is None or args.to_step is None):
        raise LaunchError("--from and --to go together")
    from durable_agent.fork import find_point

    steps = await _steps(args.id)
    first, last = (args.step - 1, args.step) if args.step is not None else (args.from_step, args.to_step)
    before, after = find_point(steps, args.id, first), find_point(steps, args.id, last)
    store = Store()
    try:
        text = unified_diff(store, store.files(before.digest), store.files(after.digest))
    except SnapshotError as e:
        raise LaunchError(str(e)) from None
    if text:
        console.line(text.removesuffix("\n"))
    return EXIT_OK


async def fork_run(args: argparse.Namespace, console: Console) -> int:
    from durable_agent.fork import ForkRequest, plan_fork, start_fork

    request = ForkRequest(
        source=args.id,
        step=args.at_step,
        message=args.message,
        model=args.model,
        workspace=args.workspace,
        new_id=args.new_id,
        fresh_budget=args.fresh_budget,
    )
    client = await connect_client()
    plan, _ = await plan_fork(client, request)
    if not args.json:
        console.line(f"calls of {args.id} after step {args.at_step} that the fork does not undo outside its files:")
        console.lines([f"  {line}" for line in plan.side_effects] or ["  none"])
    handle, warning = await start_fork(client, request, plan)
    if warning:
        console.error(warning)
    if args.json:
        fields = {"workflow_id": handle.id, "run_id": handle.result_run_id, "workspace": plan.workspace}
        fields |= {"source": args.id, "step": args.at_step, "side_effects": plan.side_effects}
        console.line(json.dumps(fields))
    else:
        console.line(f"forked {args.id} at step {args.at_step}: {handle.id} (workspace {plan.workspace})")
    return EXIT_OK


async def rewind_run(args: argparse.Namespace, console: Console) -> int:
    from durable_agent.fork import rewind

    def announce(effects: list[str]) -> None:
        console.line(f"calls of {args.id} after step {args.to_step} whose effects outside its files are not undone:")
        console.lines([f"  {line}" for line in effects] or ["  none"])

    done = await rewind(await connect_client(), args.id, args.to_step, args.message, announce)
    if done.warning:
        console.error(done.warning)
    console.line(
        f"rewound {args.id} to step {args.to_step} (run {done.run_id}), paused: `durable-agent resume {args.id}`; "
        f"the files before the rewind are snapshot {done.before}"
    )
    return EXIT_OK


async def edit_run(args: argparse.Namespace, console: Console) -> int:
    if (args.replace_message is None) != (args.text is None):
        raise LaunchError("--text goes with --replace-message, and only with it")
    payload = {"drop_step": args.drop_step, "replace_message": args.replace_message, "text": args.text}
    payload |= {"compact": args.compact, "by": f"{getpass.getuser()} (durable-agent edit)"}
    handle = (await connect_client()).get_workflow_handle(args.id)
    done = await handle.execute_update("edit_context", payload, result_type=str)
    console.line(f"{args.id}: {done}")
    return EXIT_OK


async def doctor_run(args: argparse.Namespace, console: Console) -> int:
    from durable_agent.doctor import diagnose

    checks = await diagnose(await connect_client(), args.id, await _steps(args.id))
    console.lines([check.line() for check in checks])
    return EXIT_OK if all(check.ok for check in checks) else EXIT_FAILED


async def _steps(workflow_id: str) -> ChainSteps:
    from durable_agent.step_history import chain_steps

    client = await connect_client()
    steps = await chain_steps(client, workflow_id)
    if not steps.points:
        raise LaunchError(f"{workflow_id} has no workspace snapshots (no run by that id, or none recorded)")
    return steps
