"""`durable-agent mcp`: the MCP servers this worker's configuration names, and their tools.

One connection per server, started as a run's would be (in the sandbox unless `sandbox:
false`), in a fresh empty folder as its workspace, so that listing touches no one's files.
Each tool is shown as the model would see it, with its effect and whether it asks for approval.
"""

from __future__ import annotations

import argparse
import tempfile

from activities.mcp_config import CONFIG_ENV, McpConfig, McpConfigError, McpServer
from activities.mcp_sessions import McpSession, McpUnavailable, reason_of
from activities.mcp_tools import list_tools, spec_of
from durable_agent.console import Console
from durable_agent.render import table

EXIT_OK, EXIT_UNREACHABLE, EXIT_BAD_CONFIG = 0, 1, 2


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    about = f"list the MCP servers of {CONFIG_ENV} and their tools (one connection each)"
    commands.add_parser("mcp", help=about, description=about).set_defaults(handler=list_servers)


async def list_servers(args: argparse.Namespace, console: Console) -> int:
    try:
        config = McpConfig.from_env()
    except McpConfigError as e:
        console.error(str(e))
        return EXIT_BAD_CONFIG
    if not config.servers:
        console.line(f"no MCP servers configured: {CONFIG_ENV} names none (docs/mcp.md)")
        return EXIT_OK
    failed = 0
    for name, server in config.servers.items():
        console.line(f"{name}: {_kind(server)}")
        try:
            rows = await _tools(name, server)
        except Exception as e:  # noqa: BLE001 - whatever the server did, say it and go on
            console.line(f"  cannot list its tools: {e if isinstance(e, McpUnavailable) else reason_of(e)}")
            failed += 1
            continue
        console.lines(["  " + line for line in table([("TOOL", "EFFECT", "APPROVAL", "DESCRIPTION"), *rows])])
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def _tools(name: str, server: McpServer) -> list[tuple[str, ...]]:
    with tempfile.TemporaryDirectory(prefix="durable-agent-mcp-") as folder:
        session = McpSession(name, server, folder)
        await session.open()
        try:
            specs = [spec_of(name, server, tool) for tool in await list_tools(session)]
        finally:
            await session.close()
    return [(s.name, s.effect, "yes" if s.approval else "no", s.description.splitlines()[0][:60]) for s in specs]


def _kind(server: McpServer) -> str:
    if not server.stdio:
        return f"http {server.url}"
    network = ", with network" if server.network else ", no network"
    confined = f"sandboxed{network}" if server.sandbox else "unsandboxed"
    return f"stdio `{' '.join([server.command or '', *server.args])}` ({confined})"
