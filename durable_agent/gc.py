"""`durable-agent gc`: remove what closed run chains left under their workspaces' `.durable-agent/`.

What goes, per chain (activities/run_files.py has the layout):
- the journal, once Temporal says the chain is closed: it only served exactly-once;
- saved outputs, once the chain has been closed longer than `--outputs-older-than` (7 days);
- the archive, only with `--archives --older-than AGE`: it is the chain's transcript once
  Temporal's retention has dropped the history.
A chain Temporal does not know (its retention expired, or it ran in another namespace) is
taken as closed when its newest file changed: its journal and outputs go after the outputs'
grace, its archive after AGE. Files from before per-chain folders are such chains.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities import run_files
from activities.run_files import LEGACY, ChainFiles
from activities.workspace import RESERVED_DIR
from workflows.compaction import run_folder
from workflows.types import WORKFLOW_TYPE

DAY_S = 86_400.0
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": DAY_S}
_CHAIN_NAME = re.compile(
    r"^(?P<workflow_id>.+)-(?P<run_id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$"
)
SKIPPED_FOLDERS = {"node_modules", "__pycache__"}
"""Never descended into while looking for workspaces (nor any hidden folder)."""


class GcPolicy(BaseModel):
    outputs_after_s: float = 7 * DAY_S
    archives_after_s: float | None = None
    """None: archives are kept."""


class ChainState(BaseModel):
    closed: bool
    closed_at: float | None = None
    """When Temporal says it closed (epoch seconds); None when Temporal does not know it."""
    text: str


class Verdict(BaseModel):
    files: ChainFiles
    state: ChainState
    remove: bool
    reason: str


def parse_age(text: str) -> float:
    """`30d`, `12h`, `90m`, `45s` as seconds."""
    match = _AGE.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an age: write a number and a unit, e.g. 30d, 12h, 90m")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def find_workspaces(path: str) -> Iterator[str]:
    """Folders under `path` (itself included) holding a `.durable-agent` entry of any kind;
    symlinked folders are never entered."""
    for folder, subfolders, files in os.walk(path, followlinks=False):
        if RESERVED_DIR in subfolders or RESERVED_DIR in files:
            yield folder
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS)


async def chain_state(client: Client, files: ChainFiles) -> ChainState:
    workflow_id = files.workflow_id or _workflow_id_from_name(files.chain)
    if workflow_id is None:
        return _unknown("files from before per-run folders")
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return _unknown(f"run {workflow_id} unknown to Temporal (retention expired, or another namespace)")
    info = description.raw_description.workflow_execution_info
    if run_folder(workflow_id, info.first_run_id) != files.chain:
        in_use = await chains_in_use(client, workflow_id)
        if isinstance(in_use, str):
            return ChainState(closed=False, text=f"run {workflow_id}: {in_use}; kept")
        if files.chain in in_use:  # a later turn of a conversation, or a rewound run, goes on with them
            return _latest_run_state(description, workflow_id)
        # The id was reused by a later chain, which starts only once ours has closed.
        started = info.start_time.ToSeconds()
        return ChainState(
            closed=True, closed_at=started, text=f"run {workflow_id}: closed before a later run reused its id"
        )
    return _latest_run_state(description, workflow_id)


def _latest_run_state(description: WorkflowExecutionDescription, workflow_id: str) -> ChainState:
    if description.status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW, None):
        return ChainState(closed=False, text=f"run {workflow_id}: open")
    closed_at = description.close_time.timestamp() if description.close_time else None
    return ChainState(closed=True, closed_at=closed_at, text=f"run {workflow_id}: {description.status.name.lower()}")


async def chains_in_use(client: Client, workflow_id: str) -> set[str] | str:
    """The chains (run folder names, which snapshot refs share) of earlier runs whose files the
    id's latest chain goes on with, as its first input's carry names them: a conversation's
    later turn (`durable-agent continue`) keeps `first_run_id`, a rewound run the earlier
    chain's `archive_dir` (and stands on its snapshots). A string says why they cannot be
    told here (an input this process cannot decode: kept, never taken for another chain's)."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        async for event in handle.fetch_history_events(page_size=1):
            started = event.workflow_execution_started_event_attributes
            if started.workflow_type.name != WORKFLOW_TYPE:
                return set()  # another workflow under the id: no chain of ours goes on
            [given] = await client.data_converter.decode(started.input.payloads, [dict])
            carry = given.get("carry") or {}
            first, archive = carry.get("first_run_id"), carry.get("archive_dir")
            named = (first and run_folder(workflow_id, first), archive and os.path.basename(archive))
            return {name for name in named if name}
    except Exception as e:  # noqa: BLE001 - a missing key, a history gone: nothing is taken for closed
        return f"its latest run's input cannot be read here ({type(e).__name__}: {e})"
    return set()


def _workflow_id_from_name(chain: str) -> str | None:
    """A folder written before `chain.json` existed: its name holds the id, when the id had only safe characters."""
    match = _CHAIN_NAME.match(chain)
    return match.group("workflow_id") if match and chain != LEGACY else None


def _unknown(text: str) -> ChainState:
    return ChainState(closed=True, closed_at=None, text=text)


def judge(files: ChainFiles, state: ChainState, policy: GcPolicy, now: float) -> Verdict:
    """Whether the chain's folder of this kind goes now, and why."""
    if not state.closed:
        return Verdict(files=files, state=state, remove=False, reason="kept")
    grace = _grace(files.kind, state, policy)
    if grace is None:
        return Verdict(files=files, state=state, remove=False, reason="archives go only with --archives")
    age = now - (state.closed_at if state.closed_at is not None else files.newest_mtime)
    since = "closed" if state.closed_at is not None else "last written"
    if age < grace:
        return Verdict(
            files=files, state=state, remove=False, reason=f"{since} {_age(age)} ago, kept for {_age(grace)}"
        )
    return Verdict(files=files, state=state, remove=True, reason=f"{since} {_age(age)} ago")


def _grace(kind: str, state: ChainState, policy: GcPolicy) -> float | None:
    if kind == "archive":
        return policy.archives_after_s
    if kind == "journal" and state.closed_at is not None:
        return 0.0  # no call of a closed chain can be retried
    return policy.outputs_after_s


def remove(verdict: Verdict) -> ChainFiles:
    return run_files.remove_chain(verdict.files.workspace, verdict.files.kind, verdict.files.chain)


def _age(seconds: float) -> str:
    if seconds >= DAY_S:
        return f"{seconds / DAY_S:.1f}d"
    if seconds >= 3_600:
        return f"{seconds / 3_600:.1f}h"
    return f"{max(seconds, 0.0) / 60:.0f}m"
