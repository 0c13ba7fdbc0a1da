"""`durable-agent agents`: the agent files a run can name, with where each was found.

The listing reads the same folders, in the same order, as the worker's `load_agent`
(activities/agents.py): the workspace's `agents/` first, then DURABLE_AGENT_AGENTS_DIR.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from activities.agents import AGENTS_DIR_ENV, AgentFile, agent_files, agents_dir, read_agent
from durable_agent.console import Console
from durable_agent.render import table
from workflows.agents import AgentFileError

EXIT_OK, EXIT_BAD_FILE = 0, 1
"""1: a file listed cannot be used (a run naming it would close at its start)."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    about = "list the agent files (agents/NAME.md) a run can name with --agent, and where each was found"
    parser = commands.add_parser("agents", help=about, description=about)
    parser.set_defaults(handler=list_agents)
    parser.add_argument(
        "--workspace", type=Path, default=Path.cwd(), help="the workspace whose agents/ is read (default: here)"
    )


async def list_agents(args: argparse.Namespace, console: Console) -> int:
    folder = agents_dir()
    files = agent_files(str(args.workspace.expanduser().resolve()), folder)
    if not files:
        console.line(f"no agent files in {args.workspace}/agents/" + (f" or {folder}" if folder else ""))
        if not folder:
            console.line(f"({AGENTS_DIR_ENV} is not set)")
        return EXIT_OK
    rows: list[tuple[str, ...]] = [("NAME", "DESCRIPTION", "FOUND IN")]
    notes: list[str] = []
    first: dict[str, AgentFile] = {}
    for file in files:
        description, problem = _describe(file)
        winner = first.setdefault(file.name, file)
        shadow = "" if winner is file else f" (shadowed by {winner.shown})"
        rows.append((file.name, description, file.shown + shadow))
        if problem:
            notes.append(f"{file.shown}: cannot be used: {problem}")
    console.lines(table(rows))
    if notes:
        console.lines(["", *notes])
    return EXIT_BAD_FILE if notes else EXIT_OK


def _describe(file: AgentFile) -> tuple[str, str | None]:
    """(description, problem): a broken file is listed too, with what is wrong with it."""
    try:
        definition = read_agent(file)
    except (AgentFileError, OSError) as e:
        message = str(e).removeprefix(f"{file.shown}: ")
        return "(cannot be used: see below)", message
    return _shorten(definition.description), None


def _shorten(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
