"""What every command group of the CLI shares: exit codes, the one-line error, how a
command is added to the parser, and a run's handle."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.console import Console
from durable_agent.launch import connect_client
from workflows.types import AgentResult

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 0, 1, 2, 130, 141
Handler = Callable[[argparse.Namespace, Console], Coroutine[Any, Any, int]]


class CliError(Exception):
    """A failure the user can act on: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help: str,
    with_id: bool = False,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        name, help=help, description=help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.set_defaults(handler=handler)
    if with_id:
        parser.add_argument("id", help="the run's workflow id")
    return parser


async def run_handle(run_id: str, running: bool = False) -> tuple[WorkflowHandle[Any, AgentResult], bool]:
    """The run's handle and whether it is still running; `running=True` insists that it is."""
    client = await connect_client()
    handle = client.get_workflow_handle(run_id, result_type=AgentResult)
    try:
        description = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no run with id {run_id!r}") from None
        raise
    is_running = description.status == WorkflowExecutionStatus.RUNNING
    if running and not is_running:
        state = description.status.name.lower() if description.status else "closed"
        raise CliError(f"run {run_id} has already ended ({state})", EXIT_REFUSED)
    return handle, is_running
