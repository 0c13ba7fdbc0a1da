"""The degradation ladder: what a run gives up, in order, as it nears its limits.

Rungs, in the seed's order: compress the context (`compaction`), skip optional work by
telling the model to wrap up (`soft_warning`), switch to the fallback model
(`fallback_model`), and at the hard tier stop cleanly (`stop`). How far up a run is
follows its pressure: 0 when the first budget enters its soft tier, 1 at the hard limit
of the budget nearest to it. Each rung is climbed once, in order, when the pressure
reaches its threshold; a jump past several climbs them all, in order, at that step.
"""

from __future__ import annotations

from workflows.limits import Spend, budget_fractions
from workflows.types import Limits

RUNGS: tuple[tuple[str, float], ...] = (
    ("compaction", 0.0),
    ("soft_warning", 1 / 3),
    ("fallback_model", 2 / 3),
)
"""(rung, pressure at which it is climbed); `stop` is the hard tier (workflows/limits.py)."""


def pressure(spend: Spend, limits: Limits, early_soft_tier: bool = False) -> float | None:
    """How far into the soft tier the run is: None before it, 0 at its start, 1 at a hard limit.

    A token spike (`early_soft_tier`) puts the run at the start of the soft tier at least.
    """
    levels: list[float] = []
    if spend.step >= limits.soft_steps:
        band = limits.hard_steps - limits.soft_steps
        levels.append(1.0 if band <= 0 else (spend.step - limits.soft_steps) / band)
    band = 1.0 - limits.soft_ratio
    for name, used in budget_fractions(spend, limits).items():
        if name != "steps" and used >= limits.soft_ratio:
            levels.append(1.0 if band <= 0 else (used - limits.soft_ratio) / band)
    if early_soft_tier:
        levels.append(0.0)
    return max(levels) if levels else None


def rungs_due(climbed: list[str], level: float | None) -> list[str]:
    """The rungs to climb now, in order: those not yet climbed whose threshold is reached."""
    if level is None:
        return []
    return [rung for rung, threshold in RUNGS if level >= threshold and rung not in climbed]
