"""The live view's short path: the worker streaming a followed run's model reply serves it,
on request, to a follower of the same machine over a Unix socket: no heartbeat, no server.

A heartbeat costs the Temporal server ~2 ms of CPU (a write of the run's state), whatever it
carries: beating within a second of each new line of a reply cost a followed call +5.5 to
+8.8 ms of CPU (`python -m bench live --line-chars 60`). The usual follower, `durable-agent
run` or `watch` on the worker's machine, asks the worker instead, at its own pace (about
every second, durable_agent/live_source.py); while one does, the call beats at the usual
pace. A follower on another machine finds no socket: it reads the heartbeat details, which
then carry each new line within a second, as before (activities/heartbeat.py, `live`).

The socket is the worker process's, in a folder only its user may enter
(`live_socket_path`); what it answers is redacted like a heartbeat's details.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from activities.host import LIVE_REPLIES_PREFIX, machine_tag, process_gone, user_folder
from activities.model_stream import StreamProgress
from activities.redaction import worker_redactor

PULLED_LATELY_S = 2.5
"""A follower asks about every second: one that has not asked for this long has gone (or is
busy), so the call's heartbeats carry the reply again, for any follower elsewhere. A call starts as
if asked at its start: a follower finds its worker within about a second
(durable_agent/live_source.py), and a live beat before that would cost the server in vain."""
MAX_REQUEST_BYTES = 4096
IDLE_S = 60.0
"""A follower keeps its connection and asks about every second while a call streams; one that asks
nothing for this long (its run is between calls, or it hangs) loses it, and opens a new one."""


class LivePull(BaseModel):
    """A follower's request: the reply of the model call the run streams now, if this worker does."""

    workflow_id: str


class LiveAnswer(BaseModel):
    """The call's attempt and its heartbeat details as a beat now would carry them (empty
    until the reply starts); both None when this worker makes no followed call of the run."""

    attempt: int | None = None
    details: dict[str, Any] | None = None


def live_socket_path(pid: int, tag: str) -> Path | None:
    """Where process `pid` of this machine (pid namespace `tag`) serves live replies; None
    where the folder is not private to this user (another user made it: its sockets could lie)."""
    folder = user_folder(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), LIVE_REPLIES_PREFIX)
    return None if folder is None else folder / f"live-{tag}-{pid}.sock"


class _Call:
    def __init__(self, attempt: int, progress: StreamProgress) -> None:
        self.attempt = attempt
        self.progress = progress
        self.pulled_at = time.monotonic()

    def pulled_lately(self) -> bool:
        return time.monotonic() - self.pulled_at < PULLED_LATELY_S


class LiveReplies:
    """The followed calls this process streams now, by run (a run makes one call at a time),
    and the socket that serves them, started with the first one on the running event loop."""

    def __init__(self) -> None:
        self._calls: dict[str, _Call] = {}
        self._server: asyncio.AbstractServer | None = None
        """Held for as long as the process serves: nothing else needs to reach it."""
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def serving(self, progress: StreamProgress) -> AsyncIterator[Callable[[], bool]]:
        """Serve the running call's reply while the block runs; yields whether a follower asked lately."""
        await self.start()
        info = activity.info()
        call = _Call(info.attempt, progress)
        self._calls[info.workflow_id] = call
        try:
            yield call.pulled_lately
        finally:
            if self._calls.get(info.workflow_id) is call:
                del self._calls[info.workflow_id]

    async def start(self) -> None:
        """Listen on this process's socket, once per event loop; without a private folder or
        a machine tag, followers read heartbeats only."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        tag = machine_tag()
        path = live_socket_path(os.getpid(), tag) if tag else None
        if path is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # our own name: a socket left by an earlier process with this pid, or loop
            self._server = await asyncio.start_unix_server(self._answer, path=path, limit=MAX_REQUEST_BYTES)
        except OSError as e:  # the live view is a nicety: the call goes on, its beats carry the reply
            activity.logger.warning("live replies are not served on %s: %s", path, e)
            return
        atexit.register(path.unlink, missing_ok=True)
        _remove_stale(path.parent, tag)

    def answer(self, request: LivePull) -> LiveAnswer:
        call = self._calls.get(request.workflow_id)
        if call is None:
            return LiveAnswer()
        call.pulled_at = time.monotonic()
        details = call.progress.details(sent=False)
        return LiveAnswer(attempt=call.attempt, details=worker_redactor().value(details))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answers each request line of a follower's connection until it closes or idles."""
        try:
            while True:
                async with asyncio.timeout(IDLE_S):
                    line = await reader.readline()
                if not line:
                    return
                writer.write(self.answer(LivePull.model_validate_json(line)).model_dump_json().encode() + b"\n")
                await writer.drain()
        except (OSError, TimeoutError, ValueError):
            pass  # a follower gone or confused: it asks again, or reads the heartbeat details
        except asyncio.CancelledError:
            pass  # the worker's loop ends with a follower connected: no traceback in its log
        finally:
            writer.close()


def _remove_stale(folder: Path, tag: str) -> None:
    """The sockets that SIGKILLed workers of this machine left behind (an exiting one removes its own)."""
    for stale in folder.glob(f"live-{tag}-*.sock"):
        pid = stale.name.removesuffix(".sock").rpartition("-")[2]
        if pid.isdigit() and process_gone(int(pid)):
            stale.unlink(missing_ok=True)


LIVE_REPLIES = LiveReplies()
"""One socket per worker process, for every worker it runs."""
