"""A run's first look at its workspace, in one local activity (`open_run`).

At its start a run checks that its workspace lies in the worker's roots, takes the snapshot
of step 0 (the workspace as the run found it) and lists the skills the model may load. Where
nothing runs between them (no tools or MCP servers to resolve) and the run has no host,
`open_run` does all three: one local activity and one workflow activation where there were
three of each, in the run's first workflow task (docs/fleet.md measures it). The check's
refusal closes the run as `check_workspace`'s does; a snapshot or a skill listing it could
not give is asked of `snapshot_workspace` or `discover_skills` alone, which retry and report
as they always have.
"""

from __future__ import annotations

from pydantic import BaseModel

from workflows.options import SKILLS_TIMEOUT, WORKSPACE_CHECK_TIMEOUT
from workflows.skills import SkillCatalog, SkillCatalogRequest
from workflows.snapshots import SNAPSHOT_TIMEOUT, SnapshotRequest, SnapshotTaken

OPEN_RUN_ACTIVITY = "open_run"
OPEN_RUN_TIMEOUT = WORKSPACE_CHECK_TIMEOUT + SNAPSHOT_TIMEOUT + SKILLS_TIMEOUT
"""Room for each of its parts, one after another."""


class RunOpening(BaseModel):
    workspace: str
    snapshot: SnapshotRequest | None = None
    """Step 0's snapshot, when the run takes one."""
    skills: SkillCatalogRequest | None = None
    """The skill catalog, when the run lists skills."""


class RunOpened(BaseModel):
    snapshot: SnapshotTaken | None = None
    """None: not asked for, or not taken (the run then asks `snapshot_workspace`)."""
    skills: SkillCatalog | None = None
    """None: not asked for, or not listed (the run then asks `discover_skills`)."""
