"""`durable-agent gc` against real runs on a real server: dry run against real removal,
open runs kept, and hostile layouts (symlinks out, FIFOs) refused with nothing outside touched.
Judged by the files on disk."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer
from tests.helpers import start, wait_for
from tests.scripts import ByGoal, Script, answer, tools
from tests.test_cli import cli_env, durable_agent, one_line_error
from tests.test_run_files import LONG_OUTPUT, RESERVED, bytes_at_rest, chain_of


def snapshot(root: Path) -> dict[str, int]:
    """Every file under `root` (symlinks not followed) and its size."""
    return {str(p.relative_to(root)): p.lstat().st_size for p in root.rglob("*") if not p.is_dir() or p.is_symlink()}


def plant_chain(workspace: Path, kind: str, age_days: float = 30) -> Path:
    """Files of a chain Temporal never knew, last written `age_days` ago."""
    chain = workspace / RESERVED / kind / f"gone-{uuid.uuid4()}"
    chain.mkdir(parents=True)
    (chain / "old.txt").write_bytes(b"x" * 1000)
    past = time.time() - age_days * 86_400
    os.utime(chain / "old.txt", (past, past))
    return chain


async def test_gc_dry_run_removes_nothing_then_removes_what_closed_runs_left(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model_server.responder = ByGoal(
        {
            "closed": Script([tools(("run_command", LONG_OUTPUT)), answer("done")]),
            "killed": Script([tools(("write_file", {"path": "k.txt", "content": "k"})), tools(("list_files", {}))]),
            "open": Script([tools(("write_file", {"path": "o.txt", "content": "o"})), tools(("list_files", {}))]),
        }
    )
    gated = {"tools": ["list_files"]}
    closed = await start(client, task_queue, goal="closed", workspace=str(workspace))
    killed = await start(client, task_queue, goal="killed", workspace=str(workspace), approval=gated)
    still_open = await start(client, task_queue, goal="open", workspace=str(workspace), approval=gated)
    assert (await closed.result()).state == "completed"
    for handle in (killed, still_open):
        await wait_for(handle, lambda s: len(s.pending_approvals) == 1)
    await killed.terminate("gone")  # closed from outside: no cleanup ran
    outputs = RESERVED + "/outputs/"
    killed_journal = workspace / RESERVED / "journal" / chain_of(killed)
    open_journal = workspace / RESERVED / "journal" / chain_of(still_open)
    closed_outputs = workspace / outputs / chain_of(closed)
    old_archive = plant_chain(workspace, "archive")
    assert killed_journal.is_dir() and open_journal.is_dir() and closed_outputs.is_dir()
    before = snapshot(workspace)
    env = cli_env()

    dry = await durable_agent("gc", str(tmp_path), "--dry-run", "--outputs-older-than", "0s", env=env)
    assert dry.returncode == 0, dry
    assert snapshot(workspace) == before  # nothing removed
    expected = bytes_at_rest(killed_journal) + bytes_at_rest(closed_outputs)
    assert f"would remove  {killed_journal}: " in dry.stdout and f"would remove  {closed_outputs}: " in dry.stdout
    assert f"kept          {open_journal}: run {still_open.id}: open" in dry.stdout
    assert f"kept          {old_archive}: " in dry.stdout and "archives go only with --archives" in dry.stdout
    assert f"total: would remove 4 files, {expected:,} bytes" in dry.stdout, dry.stdout

    real = await durable_agent("gc", str(tmp_path), "--outputs-older-than", "0s", env=env)
    assert real.returncode == 0, real
    assert f"total: removed 4 files, {expected:,} bytes" in real.stdout, real.stdout
    assert not killed_journal.exists() and not closed_outputs.exists()
    assert list(open_journal.rglob("*.done.json"))  # the open run's exactly-once records stay
    assert old_archive.is_dir()

    archives = await durable_agent("gc", str(workspace), "--archives", "--older-than", "20d", env=env)
    assert archives.returncode == 0 and not old_archive.exists(), archives
    assert f"removed       {old_archive}: 1 files, 1,000 bytes" in archives.stdout, archives.stdout
    assert (workspace / "k.txt").read_text() == "k"  # the workspace's own files are never touched
    await still_open.terminate("test over")


async def test_gc_refuses_hostile_layouts_and_touches_nothing_outside(temporal_server: object, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    bait = plant_chain(outside, "journal")  # looks like ours, old, unknown: gc would remove it if it went there
    secret = outside / "secret.txt"
    secret.write_text("keep me")
    root = tmp_path / "root"
    linked = root / "reserved-is-a-link"
    linked.mkdir(parents=True)
    (linked / RESERVED).symlink_to(outside / RESERVED)
    chain_linked = root / "chain-is-a-link"
    (chain_linked / RESERVED / "journal").mkdir(parents=True)
    (chain_linked / RESERVED / "journal" / f"x-{uuid.uuid4()}").symlink_to(bait)
    file_linked = root / "file-is-a-link"
    swapped = plant_chain(file_linked, "outputs")
    (swapped / "old.txt").unlink()
    (swapped / "old.txt").symlink_to(secret)
    with_fifo = root / "fifo"
    fifo_chain = plant_chain(with_fifo, "journal")
    os.mkfifo(fifo_chain / "pipe.done.json")
    (root / "walk-into-outside").symlink_to(outside)  # a folder link: never entered
    healthy = plant_chain(root / "healthy", "outputs")
    fresh = plant_chain(root / "fresh", "journal", age_days=0)  # unknown to Temporal, but recent
    before = snapshot(outside)

    result = await durable_agent("gc", str(root), "--outputs-older-than", "1d", env=cli_env(), timeout_s=60)
    assert result.returncode == 1, result
    assert f"refused       {linked}: {linked}/{RESERVED} is a symlink" in result.stdout, result.stdout
    assert "is a symlink; durable-agent never follows or removes it" in result.stdout
    assert f"{swapped}/old.txt is a symlink" in result.stdout
    assert f"{fifo_chain}/pipe.done.json is a FIFO (named pipe)" in result.stdout
    assert "refused 4" in result.stdout
    assert snapshot(outside) == before and secret.read_text() == "keep me"
    assert os.path.islink(swapped / "old.txt") and fifo_chain.is_dir()
    assert not healthy.exists()  # the rest of the tree is still collected
    assert fresh.exists() and f"kept          {fresh}: " in result.stdout and "last written 0m ago" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


async def test_gc_usage_errors_are_one_line(temporal_server: object, tmp_path: Path) -> None:
    env = cli_env()
    one_line_error(await durable_agent("gc", "--archives", env=env), 2, "--archives needs --older-than")
    one_line_error(await durable_agent("gc", "--older-than", "3d", env=env), 2, "give --archives too")
    one_line_error(await durable_agent("gc", str(tmp_path / "nope"), env=env), 2, "not a folder:")
    bad_age = await durable_agent("gc", str(tmp_path), "--outputs-older-than", "soon", env=env)
    one_line_error(bad_age, 2, "is not an age")
    no_server = await durable_agent("gc", str(tmp_path), env=cli_env(TEMPORAL_ADDRESS="127.0.0.1:1"))
    one_line_error(no_server, 2, "no Temporal server")
