"""A write tool's call at most once per idempotency key, and a retry told what it did.

A user's write tool and an MCP server's write tool take this one path. The journal
(activities/journal.py) holds the call's start record, on disk before the call acts, and its
outcome once it ends: a retry answers from the journal and never acts again.

A retry that finds the call begun and not ended cannot know how far it got, unless the
attempt that began it is still running in this worker process. That happens when the server
gave up on an attempt whose worker lives: its heartbeats did not arrive within the heartbeat
timeout (a stalled machine, a slow network), and the server scheduled the retry, here or on
another worker. The call itself goes on (`_outlived`: only a requested cancel stops it), and
a retry in the same process waits for it and reports its outcome. A retry in another process
reports the outcome as unknown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity

from activities.heartbeat import heartbeating
from activities.journal import Journal, JournalFull
from workflows.types import ToolOutcome

IN_FLIGHT: dict[str, asyncio.Task[ToolOutcome]] = {}
"""This process's write calls that have begun and not ended, by idempotency key."""


async def write_once(
    journal: Journal,
    key: str,
    record: dict[str, Any],
    act: Callable[[], Awaitable[ToolOutcome]],
    unknown: ToolOutcome,
) -> ToolOutcome:
    """The call's recorded outcome; else the outcome of its attempt still running here;
    else `unknown` if an attempt began it; else `act()`, journaled (`record` in its start record)."""
    recorded, begun = await asyncio.to_thread(_recorded, journal, key)
    if recorded is not None:
        return recorded
    if begun:
        running = IN_FLIGHT.get(key)
        if running is None:
            return unknown
        async with heartbeating("waiting for the earlier attempt, still running on this worker", release_sticky=False):
            return await _outlived(running)
    try:
        await asyncio.to_thread(_begin, journal, key, record)
    except JournalFull as e:
        return ToolOutcome(ok=False, error=str(e))
    running = asyncio.create_task(_acted(journal, key, act))
    IN_FLIGHT[key] = running
    running.add_done_callback(lambda ended: _ended(key, ended))
    return await _outlived(running)


def _recorded(journal: Journal, key: str) -> tuple[ToolOutcome | None, bool]:
    """One thread hop: the recorded outcome, and whether an attempt began the call."""
    recorded = journal.completed(key)
    return recorded, recorded is None and journal.started(key) is not None


def _begin(journal: Journal, key: str, record: dict[str, Any]) -> None:
    journal.ensure_room()
    journal.start(key, record)  # durable before the tool acts


async def _acted(journal: Journal, key: str, act: Callable[[], Awaitable[ToolOutcome]]) -> ToolOutcome:
    outcome = await act()
    await asyncio.to_thread(journal.complete, key, outcome)
    return outcome


def _ended(key: str, ended: asyncio.Task[ToolOutcome]) -> None:
    IN_FLIGHT.pop(key, None)
    if not ended.cancelled():
        ended.exception()  # seen: the attempt that awaited it may have been cancelled meanwhile


async def _outlived(running: asyncio.Task[ToolOutcome]) -> ToolOutcome:
    """The call's outcome. The activity may be cancelled meanwhile; the call is cancelled with
    it only when someone asked (the run cancelled, the activity paused or reset, the worker
    shutting down): when the server lost or timed out the attempt, the call ends on its own,
    its outcome journaled for the retry."""
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        why = activity.cancellation_details()
        if why is None or not (why.not_found or why.timed_out):
            running.cancel()
        raise
