"""Heartbeating while an activity waits, so a killed worker's call is retried in seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity

INTERVAL_S = 0.5
"""Half a second against a 2 s heartbeat timeout: the SDK throttles sends to 80 % of it."""


@asynccontextmanager
async def heartbeating(*details: Any) -> AsyncIterator[None]:
    """Heartbeat from a background task for as long as the block runs.

    The work inside must not block the event loop (use `asyncio.to_thread`), or the
    heartbeats starve and the server times the activity out.
    """

    async def beat() -> None:
        while True:
            activity.heartbeat(*details)
            await asyncio.sleep(INTERVAL_S)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
