"""An MCP server for tests/test_mcp.py, written with the SDK's `MCPServer` (FastMCP): stdio, or
streamable HTTP with `--http PORT`.

Each start appends a line to `starts.log` in its working directory (the run's workspace when
sandboxed): the tests count server starts by effect. Paths are relative to that directory.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
import uuid
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

READ = ToolAnnotations(read_only_hint=True)
SAFE_WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False)

app = MCPServer("fixture")


@app.tool(annotations=READ)
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@app.tool(annotations=READ)
def getenv(name: str) -> str:
    """A variable of the server's environment, or (unset)."""
    return os.environ.get(name, "(unset)")


@app.tool(annotations=READ)
def authorization(ctx: Context) -> str:
    """The Authorization header of an HTTP call."""
    return (ctx.headers or {}).get("authorization", "(none)")


@app.tool(annotations=READ)
def read_path(path: str) -> str:
    """Read a file (any path: the sandbox decides what it sees)."""
    try:
        return Path(path).read_text()
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"


@app.tool(annotations=READ)
def connect(port: int) -> str:
    """Open a TCP connection to 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return "connected"
    except OSError as e:
        return f"no connection: {e}"


@app.tool(annotations=SAFE_WRITE)
def append_line(path: str, line: str, hold_s: float = 0) -> str:
    """Append a line to a file, then hold the call for hold_s seconds."""
    with open(path, "a") as f:
        f.write(line + "\n")
    time.sleep(hold_s)
    return f"appended to {path}"


@app.tool()
def delete_file(path: str) -> str:
    """Delete a file (destructive: no annotations say otherwise)."""
    os.remove(path)
    return f"deleted {path}"


@app.tool(annotations=READ)
def crash_once(marker: str) -> str:
    """Exit the server during the call the first time (the marker file does not exist yet)."""
    if not os.path.exists(marker):
        Path(marker).write_text("crashed\n")
        os._exit(3)
    return "survived"


@app.tool(annotations=READ)
def tally(path: str, hold_first_s: float = 0) -> str:
    """Count the calls in a file (a test's probe of retries); hold the first call for hold_first_s."""
    with open(path, "a") as f:
        f.write("call\n")
    calls = len(Path(path).read_text().splitlines())
    if calls == 1:
        time.sleep(hold_first_s)
    return f"{calls} call(s)"


@app.tool(annotations=SAFE_WRITE)
def append_then_crash(path: str, line: str) -> str:
    """Append a line, then exit the server before answering."""
    with open(path, "a") as f:
        f.write(line + "\n")
    os._exit(3)


@app.tool(annotations=READ)
async def hang() -> str:
    """Never answer."""
    await asyncio.sleep(3600)
    return "woke"


@app.tool(annotations=READ)
async def slow(seconds: float, ctx: Context) -> str:
    """Take a while, reporting progress every half second; a cancelled call leaves `cancelled.txt`."""
    steps = max(int(seconds * 2), 1)
    try:
        for i in range(steps):
            await ctx.report_progress(i, steps, f"step {i + 1} of {steps}")
            await asyncio.sleep(0.5)
    except asyncio.CancelledError:
        Path("cancelled.txt").write_text("the client cancelled the call\n")
        raise
    return f"slept {seconds:g} s"


@app.tool(annotations=READ)
def big(chars: int) -> str:
    """A long answer, and a secret-looking token in it."""
    return "x" * chars + " sk-" + "A1" * 20


if __name__ == "__main__":
    with open("starts.log", "a") as log:
        log.write(f"{uuid.uuid4().hex}\n")
    if sys.argv[1:2] == ["--http"]:  # --http PORT: streamable HTTP on 127.0.0.1:PORT/mcp
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
