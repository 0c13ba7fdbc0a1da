"""`durable-agent gc`, the snapshot store's part: closed chains' snapshots, by age.

Each chain has one ref in the store (activities/snapshots.py): its latest snapshot, from which
its earlier ones are reached through their parents. A ref goes once its chain has been closed
longer than `--snapshots-older-than` (a chain Temporal does not know, and the state kept before
a rewind, age from the ref's last write); then every manifest and blob no remaining ref reaches
goes, except those younger than `SWEEP_GRACE_S`: a worker writing a snapshot now has stored its
blobs (or stamped a stored one it reuses) before the manifest and ref that will reach them.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.snapshots import SnapshotError, Store
from durable_agent.gc import chains_in_use

SWEEP_GRACE_S = 3_600.0
ASIDE = ".gc"
"""An object's name while gc removes it (`_removed_if_old`)."""
_CHAIN = re.compile(r"^(.+)-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
"""workflows/compaction.run_folder: the workflow id (its unsafe characters replaced) and the chain's first run id."""


class SnapshotSweep(BaseModel):
    lines: list[str]
    files: int = 0
    bytes: int = 0


async def collect(client: Client, store: Store, older_than_s: float, dry_run: bool) -> SnapshotSweep:
    if not dry_run:
        _put_back_aside(store)
    # Below too: a rewind of an id with `/` wrote its "before" ref in a folder, up to 2ec1192.
    listed = (store.root / "refs").rglob("*") if (store.root / "refs").is_dir() else []
    refs = sorted(ref for ref in listed if ref.is_file())
    sweep = SnapshotSweep(lines=[])
    verb = "would remove" if dry_run else "removed"
    gone: list[Path] = []
    for ref in refs:
        try:
            closed_at, text = await _closed_at(client, ref)
        except FileNotFoundError:
            continue  # removed by another gc meanwhile
        age = time.time() - closed_at if closed_at is not None else None
        if age is None or age < older_than_s:
            sweep.lines.append(f"kept          snapshots of {ref.name}: {text}")
            continue
        sweep.lines.append(f"{verb:13} snapshots of {ref.name}: {text}, {age / 86_400:.1f}d ago")
        gone.append(ref)
    _sweep_left_copies(store, sweep, verb, dry_run)
    if not gone:
        return sweep
    kept_refs = [r for r in refs if r not in gone]
    for path, size in _unreachable(store, kept_refs, sweep.lines).items():
        if dry_run or _removed_if_old(path):
            sweep.files, sweep.bytes = sweep.files + 1, sweep.bytes + size
    for ref in gone if not dry_run else []:
        ref.unlink(missing_ok=True)
    return sweep


async def _closed_at(client: Client, ref: Path) -> tuple[float | None, str]:
    """When the ref's chain closed (None: open), and how that was found."""
    written = ref.stat().st_mtime
    match = _CHAIN.match(ref.name)
    if match is None:
        return written, "not a run chain's (the files kept before a rewind)"
    first_run_id = match.group(2)
    # The id as its runs have it (second line; refs written before name it only made safe).
    workflow_id = (ref.read_text().split("\n")[1:] or [match.group(1)])[0]
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return written, f"run {workflow_id} unknown to Temporal"
    of = f"run {workflow_id}"
    if description.raw_description.workflow_execution_info.first_run_id != first_run_id:
        in_use = await chains_in_use(client, workflow_id)
        if isinstance(in_use, str):
            return None, f"{of}: {in_use}"
        if ref.name not in in_use:
            return written, f"{of}: a later chain reused its id"
        of += " (a later chain goes on with its snapshots)"  # a conversation's next turn, a rewound run
    if description.status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW, None):
        return None, f"{of}: open"
    closed = description.close_time.timestamp() if description.close_time else written
    return max(closed, written), f"{of}: {description.status.name.lower()}"


def _sweep_left_copies(store: Store, sweep: SnapshotSweep, verb: str, dry_run: bool) -> None:
    """The copies of large files a killed worker left in `blobs/incoming/` (activities/snapshots.py
    `_put_streamed`), older than SWEEP_GRACE_S: at every gc, whatever chain it removes."""
    incoming = store.root / "blobs" / "incoming"
    young = time.time() - SWEEP_GRACE_S
    listed = incoming.iterdir() if incoming.is_dir() else iter(())
    left = {path: st for path in listed if (st := _stat(path)) and st.st_mtime < young}
    if not left:
        return
    size = sum(st.st_size for st in left.values())
    sweep.lines.append(f"{verb:13} {len(left)} copies of large files a stopped worker left: {size:,} bytes")
    sweep.files, sweep.bytes = sweep.files + len(left), sweep.bytes + size
    for path in left if not dry_run else []:
        path.unlink(missing_ok=True)


def _stat(path: Path) -> os.stat_result | None:
    """None for a file gone since it was listed (a copy or object a worker finished meanwhile)."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _put_back_aside(store: Store) -> None:
    """The objects a gc killed between its two renames left aside (`X.gc`, `X.gc.gc`): back
    under their name, or dropped where a worker wrote `X` again (the same bytes). Before any
    walk: a kept chain may reach one."""
    for kind in ("manifests", "blobs"):
        for folder in (store.root / kind).glob("[0-9a-f][0-9a-f]"):
            for path in folder.glob(f"*{ASIDE}"):
                target = path.with_name(path.name.split(".", 1)[0])
                if target.exists():
                    path.unlink(missing_ok=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(path, target)


def _removed_if_old(path: Path) -> bool:
    """Remove an object found old and unreached, unless a worker stamped it since (a snapshot
    reusing it: activities/snapshots.py `_kept`). Renamed first: a stamp after the rename finds
    no object and writes it again; one before it shows in the second look, and it goes back."""
    aside = path.with_name(f"{path.name}{ASIDE}")
    try:
        os.rename(path, aside)
        stamped = os.stat(aside).st_mtime >= time.time() - SWEEP_GRACE_S
    except FileNotFoundError:
        return False  # gone, or put back by another gc meanwhile
    if stamped:
        os.rename(aside, path)  # the same bytes as any copy written meanwhile: named by them
        return False
    aside.unlink(missing_ok=True)
    return True


def _unreachable(store: Store, refs: list[Path], lines: list[str]) -> dict[Path, int]:
    """The objects no ref reaches, older than SWEEP_GRACE_S, with their sizes; none when a kept
    chain lacks a manifest (what its earlier snapshots reach is unknown), said in `lines`."""
    reached = _reached(store, refs, lines)
    if reached is None:
        return {}
    young = time.time() - SWEEP_GRACE_S
    found = {}
    for kind in ("manifests", "blobs"):
        for folder in sorted((store.root / kind).glob("[0-9a-f][0-9a-f]")):  # not `incoming`
            for path in folder.iterdir():
                if path.name.endswith(ASIDE):
                    continue  # left by a killed gc: put back before the walk (`_put_back_aside`)
                if folder.name + path.name not in reached and (st := _stat(path)) and st.st_mtime < young:
                    found[path] = st.st_size
    return found


def _reached(store: Store, refs: list[Path], lines: list[str]) -> set[str] | None:
    """The digests of every manifest and blob the refs reach through the parents; None (said
    in `lines`) when a manifest is missing."""
    walked: set[str] = set()
    reached: set[str] = set()
    for ref in refs:
        digest: str | None = ref.read_text().split("\n")[0].strip()
        while digest and digest not in walked:
            walked.add(digest)
            reached.add(digest)
            try:
                manifest = store.manifest(digest)
            except SnapshotError as e:
                lines.append(f"not swept     snapshots of {ref.name} are damaged ({e}): no object is removed")
                return None
            entries = manifest.get("files") or manifest.get("changes") or {}
            reached.update(entry[-1] for entry in entries.values() if entry is not None)
            digest = manifest["parent"]
    return reached
