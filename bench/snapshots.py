"""`python -m bench snapshots`: what a workspace snapshot costs per step, two ways.

A 2,000-file repository (100 folders x 20 files of ~1 KB), one file changed per step (a line
appended, as an agent's edit would), a snapshot after each: ms per step (median and p95) and
the bytes the store grew by per step, against the bytes changed. Two stores:
- `own`: activities/snapshots.py (sha256 blobs, delta manifests, a stat cache);
- `git`: git's object model through the `git` binary (`add -A`, `write-tree`, `commit-tree`
  on a private GIT_DIR and index), what a store built on git would do per step.

Then a run's first snapshot (step 0): into an empty store; a later run's on the same worker,
which takes the stat cache from the run before's; a later run's on a new worker (the store
kept), which reads and hashes every file and finds its blobs there.

`--runs N --files F`: one store serving N runs in turn, as one worker does, each a workspace of
F files with one changed per step: CPU ms per snapshot, which tells whether every run's latest
snapshot stays in the worker's memory (a run that is not reads its manifests back).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from activities.snapshots import Store

FOLDERS = 100
FILES_PER_FOLDER = 20


def make_workspace(root: Path) -> None:
    for d in range(FOLDERS):
        folder = root / f"pkg{d:03d}"
        folder.mkdir(parents=True)
        for f in range(FILES_PER_FOLDER):
            (folder / f"module_{f:02d}.py").write_text(f"# module {d}.{f}\n" + "x = 1\n" * 160)


def change_one(root: Path, step: int) -> int:
    path = root / f"pkg{step % FOLDERS:03d}" / f"module_{step % FILES_PER_FOLDER:02d}.py"
    with path.open("a") as f:
        f.write(f"step_{step} = {step}\n")
    return path.stat().st_size


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Figures:
    """Per step: wall ms, CPU ms (this process and its children: load on a shared machine
    stretches the first, hardly the second), store bytes added, bytes of the changed file."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.grown: list[int] = []
        self.changed: list[int] = []

    def measure(self, snapshot: Callable[[], object], store: Path, changed: int) -> None:
        before = tree_bytes(store)
        started, cpu = time.perf_counter(), _cpu_s()
        snapshot()
        self.wall.append((time.perf_counter() - started) * 1000)
        self.cpu.append((_cpu_s() - cpu) * 1000)
        self.grown.append(tree_bytes(store) - before)
        self.changed.append(changed)


def _cpu_s() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def bench_own(workspace: Path, store_root: Path, steps: int) -> Figures:
    store = Store(store_root)
    digest = store.take(str(workspace), None, chain="bench")[0]
    figures = Figures()

    def snapshot() -> None:
        nonlocal digest
        digest = store.take(str(workspace), digest, chain="bench")[0]

    for step in range(1, steps + 1):
        figures.measure(snapshot, store_root, change_one(workspace, step))
    return figures


def bench_git(workspace: Path, git_dir: Path, steps: int) -> Figures:
    env = {**os.environ, "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(workspace)}
    env.update({"GIT_INDEX_FILE": str(git_dir / "index"), "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b"})
    env.update({"GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"})
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True)

    def snapshot(parent: str | None) -> str:
        subprocess.run(["git", "add", "-A", "."], check=True, env=env, cwd=workspace)
        tree = subprocess.run(["git", "write-tree"], check=True, env=env, capture_output=True, text=True).stdout.strip()
        args = ["git", "commit-tree", tree, "-m", "step"] + (["-p", parent] if parent else [])
        return subprocess.run(args, check=True, env=env, capture_output=True, text=True).stdout.strip()

    commit = snapshot(None)
    figures = Figures()

    def step_snapshot() -> None:
        nonlocal commit
        commit = snapshot(commit)

    for step in range(1, steps + 1):
        figures.measure(step_snapshot, git_dir / "objects", change_one(workspace, step))
    return figures


def bench_many_runs(root: Path, runs: int, files: int, steps: int) -> list[float]:
    """CPU ms of each snapshot after the first of each run, the runs' steps taken in turn."""
    store = Store(root / "store")
    workspaces = [root / f"ws{n}" for n in range(runs)]
    latest: dict[Path, str] = {}
    for workspace in workspaces:
        workspace.mkdir()
        for f in range(files):
            (workspace / f"module_{f:04d}.py").write_text(f"# module {f}\n")
        latest[workspace] = store.take(str(workspace), None, chain=workspace.name)[0]
    cpu_ms: list[float] = []
    for step in range(1, steps + 1):
        for workspace in workspaces:
            (workspace / f"module_{step % files:04d}.py").write_text(f"step {step}\n")
            cpu = _cpu_s()
            latest[workspace] = store.take(str(workspace), latest[workspace], chain=workspace.name)[0]
            cpu_ms.append((_cpu_s() - cpu) * 1000)
    return cpu_ms


def bench_first_snapshots(workspace: Path, store_root: Path, runs: int = 5) -> dict[str, float]:
    """CPU ms of a run's first snapshot (step 0, no previous one), the workspace unchanged
    between runs but for one file: the first run's, into an empty store; the median of each
    later run's on the same worker; a run's on a new worker (a restart), the store kept."""
    time.sleep(0.05)  # the workspace's files older than the first snapshot's start: not "racy"

    def first_snapshot(store: Store, run: int) -> float:
        change_one(workspace, run)
        cpu = _cpu_s()
        store.take(str(workspace), None, chain=f"run-{run}")
        return (_cpu_s() - cpu) * 1000

    store = Store(store_root)
    empty_store = first_snapshot(store, 0)
    same_worker = statistics.median(first_snapshot(store, run) for run in range(1, runs + 1))
    new_worker = first_snapshot(Store(store_root), runs + 1)
    return {"into an empty store": empty_store, "same worker": same_worker, "new worker": new_worker}


def report(name: str, f: Figures) -> str:
    p95 = sorted(f.wall)[int(len(f.wall) * 0.95) - 1]
    over = statistics.mean(g - c for g, c in zip(f.grown, f.changed, strict=True))
    return (
        f"| {name} | {statistics.median(f.wall):.2f} | {p95:.2f} | {statistics.median(f.cpu):.2f} | "
        f"{statistics.mean(f.grown):,.0f} | {statistics.mean(f.changed):,.0f} | {over:+,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench snapshots", description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=1, help="with --files: runs served in turn by one store")
    parser.add_argument("--files", type=int, default=1000, help="files per run's workspace, with --runs")
    args = parser.parse_args()
    if args.runs > 1:
        with tempfile.TemporaryDirectory() as tmp:
            cpu_ms = bench_many_runs(Path(tmp), args.runs, args.files, args.steps)
        print(
            f"{args.runs} runs of {args.files} files, {args.steps} steps each, in turn: "
            f"median CPU ms per snapshot {statistics.median(cpu_ms):.2f}"
        )
        return
    print(f"{FOLDERS * FILES_PER_FOLDER} files, {args.steps} steps, one file changed per step")
    print("| store | median ms | p95 ms | median CPU ms | bytes added per step | bytes of the changed file | over it |")
    print("|---|---|---|---|---|---|---|")
    stores = (("own (activities/snapshots.py)", bench_own), ("git (add -A, write-tree, commit-tree)", bench_git))
    for name, run in stores:
        with tempfile.TemporaryDirectory() as tmp:
            workspace = Path(tmp) / "ws"
            make_workspace(workspace)
            print(report(name, run(workspace, Path(tmp) / "store", args.steps)), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        make_workspace(workspace)
        first = bench_first_snapshots(workspace, Path(tmp) / "store")
    print(
        f"a run's first snapshot (step 0), CPU ms: {first['into an empty store']:.1f} into an empty store; "
        f"a later run's {first['same worker']:.1f} on the same worker (median of 5), "
        f"{first['new worker']:.1f} on a new worker"
    )


if __name__ == "__main__":
    main()
