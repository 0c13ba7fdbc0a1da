"""`durable-agent gc`: the journals, saved outputs, archives and snapshots of closed runs."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from durable_agent.cli_base import EXIT_OK, EXIT_REFUSED, CliError, command
from durable_agent.console import Console
from durable_agent.launch import connect_client

GC_HELP = """what goes, per run (a chain of runs across continue-as-new):
  journal        as soon as Temporal says the run is closed (a closing run removes its
                 own; this catches runs terminated from outside or killed by a failure)
  saved outputs  once the run has been closed longer than --outputs-older-than
  archive        only with --archives --older-than AGE: it is the transcript `recall` and
                 `export` read once Temporal's retention has dropped the run's history
A run Temporal does not know (retention expired, another namespace) counts as closed
when its newest file was written; its journal then waits for the outputs' age too.
Symlinks, FIFOs and devices inside .durable-agent/ are refused (exit 1), never followed.
"""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gc = command(
        commands,
        "gc",
        collect_garbage,
        "remove the journals and saved outputs (and, asked, the archives) of closed runs",
        epilog=GC_HELP,
    )
    gc.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="workspaces, or folders holding them (default: the workspace roots, DURABLE_AGENT_WORKSPACE_ROOTS)",
    )
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    gc.add_argument(
        "--outputs-older-than", default="7d", metavar="AGE", help="saved outputs of runs closed this long ago (7d)"
    )
    gc.add_argument("--archives", action="store_true", help="remove archives too (needs --older-than)")
    gc.add_argument("--snapshots-older-than", default="7d", metavar="AGE", help="workspace snapshots (7d)")
    gc.add_argument("--older-than", metavar="AGE", help="with --archives: of runs closed this long ago, e.g. 30d")


async def collect_garbage(args: argparse.Namespace, console: Console) -> int:
    from activities import run_files
    from activities.run_files import HostileLayout
    from activities.snapshots import Store
    from durable_agent import gc, snapshot_gc

    policy = _gc_policy(args)
    paths = _gc_paths(args.paths)
    client = await connect_client()
    verb = "would remove" if args.dry_run else "removed"
    files = size = kept = refused = 0
    for path in paths:
        for workspace in gc.find_workspaces(path):
            try:
                found = run_files.scan(workspace)
            except (HostileLayout, OSError) as e:
                console.line(f"refused       {workspace}: {e}")
                refused += 1
                continue
            for chain in found:
                verdict = gc.judge(chain, await gc.chain_state(client, chain), policy, time.time())
                shown = chain.path if chain.chain else f"{chain.path} (loose files)"
                if not verdict.remove:
                    console.line(f"kept          {shown}: {verdict.state.text}, {verdict.reason}")
                    kept += 1
                    continue
                try:
                    removed = chain if args.dry_run else gc.remove(verdict)
                except (HostileLayout, OSError) as e:
                    console.line(f"refused       {shown}: {e}")
                    refused += 1
                    continue
                console.line(
                    f"{verb:13} {shown}: {removed.files} files, {removed.bytes:,} bytes "
                    f"({verdict.state.text}, {verdict.reason})"
                )
                files, size = files + removed.files, size + removed.bytes
    snapshots = await snapshot_gc.collect(client, Store(), gc.parse_age(args.snapshots_older_than), args.dry_run)
    console.lines(snapshots.lines)
    files, size = files + snapshots.files, size + snapshots.bytes
    dry = " (dry run: nothing removed)" if args.dry_run else ""
    console.line(f"total: {verb} {files} files, {size:,} bytes; kept {kept} folder(s); refused {refused}{dry}")
    return EXIT_REFUSED if refused else EXIT_OK


def _gc_policy(args: argparse.Namespace) -> Any:
    from durable_agent.gc import GcPolicy, parse_age

    if args.archives and not args.older_than:
        raise CliError("--archives needs --older-than AGE (e.g. 30d): archives are a run's long-term transcript")
    if args.older_than and not args.archives:
        raise CliError("--older-than is the age of archives to remove: give --archives too")
    try:
        outputs = parse_age(args.outputs_older_than)
        archives = parse_age(args.older_than) if args.archives else None
        parse_age(args.snapshots_older_than)  # read again by collect_garbage: refused here, before any work
    except ValueError as e:
        raise CliError(str(e)) from None
    return GcPolicy(outputs_after_s=outputs, archives_after_s=archives)


def _gc_paths(given: list[str]) -> list[str]:
    from activities.workspace import workspace_roots

    paths = [os.path.realpath(p) for p in given] or workspace_roots()
    missing = [p for p, real in zip(given, paths, strict=False) if not os.path.isdir(real)]
    if missing:
        raise CliError(f"not a folder: {missing[0]}")
    return paths
