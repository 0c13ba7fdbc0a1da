"""Spotting a model that repeats the same failing tool call (a livelock)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

LIVELOCK_REPEATS = 3


def call_key(tool: str, arguments: dict[str, Any]) -> str:
    return tool + ":" + json.dumps(arguments, sort_keys=True, separators=(",", ":"))


class FailureStreak(BaseModel):
    error: str
    count: int
    step: int | None = None
    """The step of the last failure counted."""


class LivelockTracker(BaseModel):
    """Consecutive identical failures per (tool, arguments); a success clears the streak."""

    streaks: dict[str, FailureStreak] = Field(default_factory=dict)

    def record(self, key: str, error: str | None, step: int | None = None) -> int:
        """Record one outcome; returns how many times in a row it failed this same way.

        With `step`, a failure counts once per step: identical calls of one reply ran side
        by side, not one after another, so a second one in the same step returns 0."""
        if error is None:
            self.streaks.pop(key, None)
            return 0
        streak = self.streaks.get(key)
        if streak is None or streak.error != error:
            streak = FailureStreak(error=error, count=0)
        elif step is not None and streak.step == step:
            return 0
        streak.count += 1
        streak.step = step
        self.streaks[key] = streak
        return streak.count

    def clear(self, key: str) -> None:
        self.streaks.pop(key, None)
