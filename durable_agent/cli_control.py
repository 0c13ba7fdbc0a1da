"""The control verbs: `pause`, `resume`, `message`, `approve` and `resolve`, each one signal or
update to a live run (the README's table gives the Temporal CLI's equivalent of each)."""

from __future__ import annotations

import argparse
import typing

from durable_agent import cli_resolve
from durable_agent.cli_base import EXIT_OK, CliError, command, run_handle
from durable_agent.console import Console
from workflows.types import ApprovalDecision, PauseRequest, Resolution, UserMessage


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pause = command(commands, "pause", pause_run, "pause a run before its next step", with_id=True)
    pause.add_argument("--reason", help="why (shown by status)")
    command(commands, "resume", resume_run, "resume a paused run", with_id=True)
    message = command(commands, "message", message_run, "add a user message before the next model call", with_id=True)
    message.add_argument("text")
    approve = command(commands, "approve", approve_call, "approve (or --deny) a pending tool call", with_id=True)
    approve.add_argument("call_id", help="the call id status shows, e.g. 4:call_3_0")
    approve.add_argument("--deny", action="store_true", help="deny it: the model is told")
    approve.add_argument("--note", help="a note the model sees with the decision")
    resolve = command(commands, "resolve", resolve_run, "decide how a run that needs attention goes on")
    resolve.add_argument("id", nargs="?", help="the run's workflow id (or --all)")
    cli_resolve.add_options(resolve)
    resolve.add_argument("action", choices=typing.get_args(Resolution.model_fields["action"].annotation))
    resolve.add_argument("--note", help="a note the model sees with the decision")
    resolve.add_argument(
        "--call", help="the call to decide, as status shows it (e.g. 4:call_3_0); without it, every open report"
    )


async def pause_run(args: argparse.Namespace, console: Console) -> int:
    handle, _ = await run_handle(args.id, running=True)
    await handle.signal("pause", PauseRequest(reason=args.reason))
    console.line(
        f"pause sent to {args.id}: it stops before its next step (resume with `durable-agent resume {args.id}`)"
    )
    return EXIT_OK


async def resume_run(args: argparse.Namespace, console: Console) -> int:
    handle, _ = await run_handle(args.id, running=True)
    await handle.signal("resume")
    console.line(f"resume sent to {args.id}")
    return EXIT_OK


async def message_run(args: argparse.Namespace, console: Console) -> int:
    text = UserMessage(text=args.text)
    handle, _ = await run_handle(args.id, running=True)
    await handle.signal("add_message", text)
    console.line(f"message sent to {args.id}: the model sees it before its next call")
    return EXIT_OK


async def approve_call(args: argparse.Namespace, console: Console) -> int:
    decision = ApprovalDecision(call_id=args.call_id, approved=not args.deny, note=args.note)
    handle, _ = await run_handle(args.id, running=True)
    outcome = await handle.execute_update("approve", decision, result_type=str)
    console.line(f"{args.id}: {outcome}")
    return EXIT_OK


async def resolve_run(args: argparse.Namespace, console: Console) -> int:
    if args.all != (args.id is None):
        raise CliError("resolve takes either a run's ID or --all")
    if args.all:
        return await cli_resolve.resolve_all(args, console)
    resolution = Resolution(action=args.action, note=args.note, call_id=args.call)
    handle, _ = await run_handle(args.id, running=True)
    outcome = await handle.execute_update("resolve", resolution, result_type=str)
    console.line(f"{args.id}: {outcome}")
    return EXIT_OK
