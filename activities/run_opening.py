"""`open_run`: the workspace check, step 0's snapshot and the skill catalog in one local
activity (workflows/run_opening.py says when a run asks for it).

It is made of the worker's own `check_workspace`, `snapshot_workspace` and `discover_skills`,
whichever those are: a worker given tools of other roots checks those roots here too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from temporalio import activity

from activities.snapshots import AFTER_TOOL_MARGIN_S, time_left_s
from workflows.options import SKILLS_TIMEOUT
from workflows.run_opening import OPEN_RUN_ACTIVITY, RunOpened, RunOpening
from workflows.skills import SkillCatalog, SkillCatalogRequest
from workflows.snapshots import SnapshotRequest, SnapshotTaken

Check = Callable[[str], Awaitable[None]]
Snapshot = Callable[[SnapshotRequest], Awaitable[SnapshotTaken]]
Skills = Callable[[SkillCatalogRequest], Awaitable[SkillCatalog]]
_T = TypeVar("_T")


class RunOpeningActivities:
    def __init__(self, check: Check, snapshot: Snapshot, skills: Skills) -> None:
        self._check = check
        self._snapshot = snapshot
        self._skills = skills

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.open_run]

    @activity.defn(name=OPEN_RUN_ACTIVITY)
    async def open_run(self, opening: RunOpening) -> RunOpened:
        """The check first: a refused workspace fails this activity as it fails `check_workspace`,
        before anything reads it. A part after it that fails, or would not end in time for
        the rest, is left out of the result, and the run asks its own activity for it."""
        await self._check(opening.workspace)
        snapshot = None
        if opening.snapshot is not None:
            then_s = SKILLS_TIMEOUT.total_seconds() if opening.skills is not None else 0.0
            snapshot = await _within_time_left(partial(self._snapshot, opening.snapshot), then_s, "step 0's snapshot")
        skills = None
        if opening.skills is not None:
            skills = await _within_time_left(partial(self._skills, opening.skills), 0.0, "the skills")
        return RunOpened(snapshot=snapshot, skills=skills)


async def _within_time_left(part: Callable[[], Awaitable[_T]], then_s: float, what: str) -> _T | None:
    """`part()`'s result; None, logged, when it fails or would leave less than the margin and
    `then_s` of the attempt's time."""
    left = time_left_s()
    budget = None if left is None else left - AFTER_TOOL_MARGIN_S - then_s
    try:
        if budget is not None and budget <= 0:
            raise TimeoutError("no time left for it")
        return await asyncio.wait_for(part(), budget)
    except Exception as e:  # noqa: BLE001 - its own activity, asked next, retries and reports it
        activity.logger.warning("%s not taken with the workspace check: %s", what, e or type(e).__name__)
        return None
