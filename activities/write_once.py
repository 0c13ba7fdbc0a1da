"""A write tool's call at most once per idempotency key, and a retry told what it did.

A user's write tool and an MCP server's write tool take this one path. The journal
(activities/journal.py) holds the call's start record, on disk before the call acts, and its
outcome once it ends: a retry answers from the journal and never acts again. A retry that
finds the call begun and not ended reports its outcome as unknown, unless the call still runs
in this process (its attempt given up by the server while the worker lived:
activities/calls_here.py): then it waits for it and reports its outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from activities.calls_here import CALLS_HERE
from activities.journal import Journal, JournalFull
from workflows.types import ToolOutcome


async def write_once(
    journal: Journal,
    key: str,
    record: dict[str, Any],
    act: Callable[[], Awaitable[ToolOutcome]],
    unknown: ToolOutcome,
) -> ToolOutcome:
    """The call's outcome: of its attempt still running here, else recorded, else `unknown`
    if an attempt began it, else of `act()`, journaled (`record` in its start record)."""
    if (outcome := await CALLS_HERE.joined(key)) is not None:
        return outcome
    recorded, begun = await asyncio.to_thread(_recorded, journal, key)
    if recorded is not None:
        return recorded
    if begun:
        return unknown
    try:
        await asyncio.to_thread(_begin, journal, key, record)
    except JournalFull as e:
        return ToolOutcome(ok=False, error=str(e))
    return await CALLS_HERE.run(key, _acted(journal, key, act))


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
