"""Workspace snapshots at step boundaries, as the workflow sees them: a digest per step.

The `snapshot_workspace` local activity (activities/snapshots.py) stores the workspace's files
outside it and returns a digest; history holds that digest in the activity's marker, never
the files. `Carry.snapshot` holds the latest one, the parent of the next (a delta costs only
what changed). `durable-agent steps`, `diff`, `fork` and `rewind` read them back from history.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio.common import RetryPolicy

SNAPSHOT_ACTIVITY = "snapshot_workspace"
SNAPSHOT_TIMEOUT = timedelta(seconds=60)
SNAPSHOT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.1), maximum_attempts=3)
"""A snapshot that keeps failing (the store's disk is full) leaves that step without one:
the run goes on, and a fork of that step is refused."""


class SnapshotRequest(BaseModel):
    workspace: str
    step: int
    previous: str | None = None
    """The chain's latest snapshot: the new one is stored as what changed since it."""
    chain: str = ""
    """The run chain's folder name (workflows/compaction.run_folder): the ref `gc` reads."""
    exclude: list[str] = Field(default_factory=list)
    """`AgentInput.snapshot_exclude`."""


class SnapshotTaken(BaseModel):
    digest: str
    step: int
    added_bytes: int = 0
    """What the store grew by: the changed files' new bytes and the manifest."""
