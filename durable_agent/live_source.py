"""Where a follower reads the model's reply while it streams: from the worker that streams
it when that worker runs on this machine (its Unix socket, activities/live_replies.py: no
heartbeat and no server involved), else from the call's heartbeat details.

The run's pending call names its worker (`pid@host#tag`, durable_agent/takeover.py); a
worker found that way is asked directly until it no longer streams a call of the run.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle

from activities.heartbeat import LIVE_BEAT_S
from activities.host import machine_tag
from activities.live_replies import LiveAnswer, LivePull, live_socket_path
from durable_agent.connection import data_converter
from durable_agent.model_queue import MODEL_ACTIVITY
from durable_agent.takeover import parse_identity

ASK_EVERY_S = LIVE_BEAT_S
"""The reply at most this often, from the worker or the run's description (a server call):
the pace of the heartbeats that carry it, so a follower sees it alike wherever it runs. Each
question costs the worker ~0.1-0.5 ms of CPU (more under load): asked at every poll (0.4 s),
a followed 3 s reply cost it ~4 ms at load 8 (`python -m bench live --follower local`)."""
PULL_TIMEOUT_S = 1.0
"""A worker too busy to answer within this is read through its heartbeats this time."""
MAX_ANSWER_BYTES = 256 * 1024
"""An answer carries at most the live view's window of text (4,000 characters), escaped."""
RECEIVING = "receiving the reply"


class LiveSource:
    """The live reply of one run's model call: (attempt, details) while it streams, else None.
    `close()` ends its connections to workers."""

    def __init__(self, handle: WorkflowHandle[Any, Any], local: bool = True) -> None:
        self._handle = handle
        self._local = local
        """False: heartbeat details only (a follower on another machine than the worker)."""
        self._links: dict[Path, WorkerLink] = {}
        """The workers of this machine that ran the run's calls (usually one), each asked on one connection."""
        self._worker: WorkerLink | None = None
        """The worker that streams the call now, as last seen."""
        self._asked_at = -ASK_EVERY_S

    async def reply(self) -> tuple[int, dict[str, Any]] | None:
        """The reply so far; None while it is not streaming, or asked for less than ASK_EVERY_S ago."""
        if time.monotonic() - self._asked_at < ASK_EVERY_S:
            return None
        self._asked_at = time.monotonic()
        if self._worker is not None:
            answer = await self._worker.ask(self._handle.id)
            if answer is not None and answer.attempt is not None:
                return answer.attempt, answer.details or {}
            self._worker = None  # the call ended, or moved to another worker: look again
        return await self._from_server()

    def close(self) -> None:
        for link in self._links.values():
            link.close()

    async def _from_server(self) -> tuple[int, dict[str, Any]] | None:
        description = await self._handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name != MODEL_ACTIVITY:
                continue
            worker = self._local_worker(pending.last_worker_identity)
            answer = await worker.ask(self._handle.id) if worker else None
            if answer is not None and answer.attempt is not None:
                self._worker = worker
                return answer.attempt, answer.details or {}
            if not pending.heartbeat_details.payloads:
                continue
            decoded = await data_converter().decode(pending.heartbeat_details.payloads)
            if decoded and isinstance(decoded[0], dict) and decoded[0].get("phase") == RECEIVING:
                return pending.attempt, decoded[0]
        return None

    def _local_worker(self, identity: str) -> WorkerLink | None:
        holder = parse_identity(identity)
        if not self._local or holder is None or (holder.host, holder.tag) != (socket.gethostname(), machine_tag()):
            return None
        path = live_socket_path(holder.pid, holder.tag)
        if path is None:
            return None
        return self._links.setdefault(path, WorkerLink(path))


class WorkerLink:
    """One connection to a worker's socket, kept between questions: opening one per question
    cost the worker ~0.5 ms of CPU (accepting it, closing it), over ten times the answer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def ask(self, workflow_id: str) -> LiveAnswer | None:
        """The worker's answer for the run; None if it cannot be asked (gone, busy, not ours)."""
        fresh = self._streams is None
        try:
            async with asyncio.timeout(PULL_TIMEOUT_S):
                if self._streams is None:
                    self._streams = await asyncio.open_unix_connection(self.path, limit=MAX_ANSWER_BYTES)
                reader, writer = self._streams
                writer.write(LivePull(workflow_id=workflow_id).model_dump_json().encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
            if line:
                return LiveAnswer.model_validate_json(line)
        except (OSError, TimeoutError, ValueError):
            pass
        self.close()
        # A kept connection the worker closed meanwhile (idle, or restarted) is opened again once.
        return None if fresh else await self.ask(workflow_id)

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None
