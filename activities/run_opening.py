"""`open_run`: the workspace check, step 0's snapshot and the skill catalog in one local
activity (workflows/run_opening.py says when a run asks for it).

It is made of the worker's own `check_workspace`, `snapshot_workspace` and `discover_skills`,
whichever those are: a worker given tools of other roots checks those roots here too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

from temporalio import activity

from activities.snapshots import within_time_left
from workflows.options import SKILLS_TIMEOUT
from workflows.run_opening import OPEN_RUN_ACTIVITY, RunOpened, RunOpening
from workflows.skills import SkillCatalog, SkillCatalogRequest
from workflows.snapshots import SnapshotRequest, SnapshotTaken

Check = Callable[[str], Awaitable[None]]
Snapshot = Callable[[SnapshotRequest], Awaitable[SnapshotTaken]]
Skills = Callable[[SkillCatalogRequest], Awaitable[SkillCatalog]]


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
            snapshot = await within_time_left(
                partial(self._snapshot, opening.snapshot), "snapshot of step 0 with the workspace check", then_s
            )
        skills = None
        if opening.skills is not None:
            skills = await within_time_left(
                partial(self._skills, opening.skills), "skill listing with the workspace check"
            )
        return RunOpened(snapshot=snapshot, skills=skills)
