"""The tool activities, run through ActivityEnvironment: no Temporal server needed.

Process-group assertions read /proc and ignore zombies: PID 1 in many containers does
not reap orphans, so killed background processes may linger as zombies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.activity import ActivityCancellationDetails
from temporalio.testing import ActivityEnvironment

from activities import calls_here
from activities.calls_here import CALLS_HERE
from activities.journal import Journal, key_digest
from activities.run_files import step_journal_path
from activities.snapshots import SnapshotActivities, Store
from activities.tools import INTERRUPTED, ToolActivities, output
from activities.tools.sandbox import UNSANDBOXED_CONSENT, UNSANDBOXED_ENV, CommandLaunch, PlainHome
from tests.helpers import host_processes_named, until
from workflows.snapshots import SnapshotRequest
from workflows.types import RidingCall, ToolCallInput, ToolOutcome

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TOOLS = ToolActivities(kill_grace_s=1.0, max_list_entries=50, max_search_matches=20)


async def run_tool(
    workspace: Path,
    tool: str,
    *,
    key: str | None = None,
    output_chars: int = 8_000,
    env: ActivityEnvironment | None = None,
    **arguments: Any,
) -> ToolOutcome:
    input = ToolCallInput(
        call_id="call-1",
        idempotency_key=key or uuid.uuid4().hex,
        workspace=str(workspace),
        arguments=arguments,
        output_chars=output_chars,
    )
    return await (env or ActivityEnvironment()).run(getattr(TOOLS, tool), input)


def live_members(pgid: int) -> list[int]:
    members = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            state, _ppid, group = stat.rsplit(")", 1)[1].split()[:3]
            if group == str(pgid) and state != "Z":
                members.append(int(entry.name))
    return members


async def started_pgid(workspace: Path, key: str, within_s: float = 30.0) -> int:
    """Wait until the command of `key` has been launched; its process group id."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        record = Journal(workspace).started(key)
        if record and record.get("pgid"):
            return int(record["pgid"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"command {key} did not start within {within_s} s")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@pytest.fixture
def outside(tmp_path: Path, workspace: Path) -> Path:
    """A folder next to the workspace, reachable from it only through symlinks."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("SECRET\n")
    (workspace / "link_file").symlink_to(folder / "secret.txt")
    (workspace / "link_dir").symlink_to(folder)
    (workspace / "dangling").symlink_to(folder / "new.txt")
    return folder


# --- read_file ---------------------------------------------------------------------


async def test_read_file_numbers_lines(workspace: Path) -> None:
    (workspace / "a.txt").write_text("alpha\nbeta\n")
    outcome = await run_tool(workspace, "read_file", path="a.txt")
    assert outcome.ok
    assert outcome.output == "     1\talpha\n     2\tbeta"


async def test_read_file_honours_offset_and_limit(workspace: Path) -> None:
    (workspace / "a.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    outcome = await run_tool(workspace, "read_file", path="a.txt", offset=3, limit=2)
    assert outcome.output.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "[showing lines 3-4 of 10; read more with offset=5]" in outcome.output


async def test_read_file_truncates_by_lines_and_says_how_long_the_file_is(workspace: Path) -> None:
    (workspace / "big.txt").write_text("".join(f"line {n}\n" for n in range(1, 10_001)))
    outcome = await run_tool(workspace, "read_file", path="big.txt", output_chars=1_000)
    assert outcome.ok
    assert len(outcome.output) < 1_100
    assert outcome.output.startswith("     1\tline 1\n")
    assert re.search(r"\[showing lines 1-\d+ of 10,000; read more with offset=\d+\]", outcome.output)


async def test_read_file_past_the_end(workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\n")
    outcome = await run_tool(workspace, "read_file", path="a.txt", offset=5)
    assert not outcome.ok
    assert outcome.error == "offset 5 is past the end of a.txt, which has 1 lines"


async def test_read_file_missing(workspace: Path) -> None:
    outcome = await run_tool(workspace, "read_file", path="nope.txt")
    assert not outcome.ok
    assert outcome.error == "nope.txt: no such file or folder"


async def test_read_file_of_a_folder(workspace: Path) -> None:
    (workspace / "sub").mkdir()
    outcome = await run_tool(workspace, "read_file", path="sub")
    assert not outcome.ok
    assert "sub: is a folder" in (outcome.error or "")


@pytest.mark.parametrize("content", [b"\x89PNG\x00\x00data", b"caf\xe9 latin-1\n"], ids=["nul", "not-utf8"])
async def test_read_file_binary(workspace: Path, content: bytes) -> None:
    (workspace / "blob").write_bytes(content)
    outcome = await run_tool(workspace, "read_file", path="blob")
    assert not outcome.ok
    assert (
        outcome.error == f"blob is a binary file ({len(content)} bytes), not UTF-8 text; "
        "it cannot be read or edited as text"
    )


# --- sandbox -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("read_file", {"path": "../outside/secret.txt"}, "path escapes the workspace: ../outside/secret.txt"),
        ("read_file", {"path": "sub/../../outside/secret.txt"}, "path escapes the workspace"),
        (
            "read_file",
            {"path": "{outside}/secret.txt"},
            "path is outside the workspace: {outside}/secret.txt",
        ),
        ("read_file", {"path": "link_file"}, "path escapes the workspace through a symlink: link_file"),
        ("read_file", {"path": "link_dir/secret.txt"}, "through a symlink: link_dir/secret.txt"),
        ("write_file", {"path": "link_dir/new.txt", "content": "x"}, "through a symlink"),
        ("write_file", {"path": "dangling", "content": "x"}, "through a symlink: dangling"),
        ("write_file", {"path": "../new.txt", "content": "x"}, "path escapes the workspace: ../new.txt"),
        ("edit_file", {"path": "link_file", "old_text": "SECRET", "new_text": "x"}, "through a symlink"),
        ("list_files", {"path": "link_dir"}, "through a symlink"),
        ("list_files", {"path": ".."}, "path escapes the workspace: .."),
        ("search_files", {"pattern": "SECRET", "path": "link_dir"}, "through a symlink"),
    ],
)
async def test_paths_may_not_leave_the_workspace(
    workspace: Path, outside: Path, tool: str, arguments: dict[str, Any], message: str
) -> None:
    arguments = {k: str(v).format(outside=outside) if k == "path" else v for k, v in arguments.items()}
    outcome = await run_tool(workspace, tool, **arguments)
    assert not outcome.ok
    assert message.format(outside=outside) in (outcome.error or "")
    assert (outside / "secret.txt").read_text() == "SECRET\n"
    assert not (outside / "new.txt").exists()
    assert not (workspace.parent / "new.txt").exists()


async def test_absolute_path_inside_and_inner_symlinks_are_fine(workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello\n")
    (workspace / "alias").symlink_to(workspace / "a.txt")
    assert (await run_tool(workspace, "read_file", path=str(workspace / "a.txt"))).ok
    assert (await run_tool(workspace, "read_file", path="alias")).output == "     1\thello"


async def test_the_journal_folder_is_read_only_for_the_model(workspace: Path) -> None:
    outcome = await run_tool(workspace, "write_file", path=".durable-agent/journal/x.json", content="{}")
    assert not outcome.ok
    assert ".durable-agent/" in (outcome.error or "")
    assert not (workspace / ".durable-agent" / "journal" / "x.json").exists()


async def test_missing_workspace(tmp_path: Path) -> None:
    outcome = await run_tool(tmp_path / "gone", "read_file", path="a.txt")
    assert not outcome.ok
    assert outcome.error == f"workspace folder does not exist: {tmp_path / 'gone'}"


async def test_bad_arguments_are_a_tool_error(workspace: Path) -> None:
    outcome = await run_tool(workspace, "read_file", limit=0)
    assert not outcome.ok
    assert outcome.error is not None
    assert outcome.error.startswith("bad arguments for read_file: path: Field required")


# --- write_file and edit_file --------------------------------------------------------


async def test_write_file_creates_parent_folders(workspace: Path) -> None:
    outcome = await run_tool(workspace, "write_file", path="src/pkg/mod.py", content="x = 1\ny = 2\n")
    assert outcome.ok
    assert outcome.output == "wrote src/pkg/mod.py (12 bytes, 2 lines)"
    assert (workspace / "src/pkg/mod.py").read_text() == "x = 1\ny = 2\n"


async def test_write_file_keeps_permissions_of_the_file_it_replaces(workspace: Path) -> None:
    script = workspace / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    assert (await run_tool(workspace, "write_file", path="run.sh", content="new")).ok
    assert script.read_text() == "new"
    assert script.stat().st_mode & 0o777 == 0o755


async def test_edit_file_replaces_a_unique_occurrence(workspace: Path) -> None:
    (workspace / "a.py").write_text("def f():\n    return 1\n")
    outcome = await run_tool(workspace, "edit_file", path="a.py", old_text="return 1", new_text="return 2")
    assert outcome.ok
    assert outcome.output == "replaced 1 occurrence of old_text in a.py"
    assert (workspace / "a.py").read_text() == "def f():\n    return 2\n"


async def test_edit_file_old_text_not_found(workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 1\n")
    outcome = await run_tool(workspace, "edit_file", path="a.py", old_text="y = 1", new_text="y = 2")
    assert not outcome.ok
    assert (outcome.error or "").startswith("old_text was not found in a.py")


async def test_edit_file_ambiguous_without_replace_all(workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 1\nx = 1\nx = 1\n")
    outcome = await run_tool(workspace, "edit_file", path="a.py", old_text="x = 1", new_text="x = 2")
    assert not outcome.ok
    assert (outcome.error or "").startswith("old_text occurs 3 times in a.py")
    assert (workspace / "a.py").read_text() == "x = 1\nx = 1\nx = 1\n"


async def test_edit_file_replace_all(workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 1\nx = 1\nx = 1\n")
    outcome = await run_tool(workspace, "edit_file", path="a.py", old_text="1", new_text="2", replace_all=True)
    assert outcome.output == "replaced 3 occurrences of old_text in a.py"
    assert (workspace / "a.py").read_text() == "x = 2\nx = 2\nx = 2\n"


async def test_edit_file_of_a_binary_file(workspace: Path) -> None:
    (workspace / "blob").write_bytes(b"a\x00b")
    outcome = await run_tool(workspace, "edit_file", path="blob", old_text="a", new_text="b")
    assert not outcome.ok
    assert "binary file (3 bytes)" in (outcome.error or "")


async def test_edit_file_retried_with_the_same_key_applies_once(workspace: Path) -> None:
    (workspace / "a.txt").write_text("a a\n")
    edit = {"path": "a.txt", "old_text": "a", "new_text": "aa", "replace_all": True}
    first = await run_tool(workspace, "edit_file", key="edit-1", **edit)
    again = await run_tool(workspace, "edit_file", key="edit-1", **edit)
    assert again == first
    assert (workspace / "a.txt").read_text() == "aa aa\n"


async def test_edit_file_crash_between_write_and_record_applies_once(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "a.txt").write_text("a a\n")
    edit = {"path": "a.txt", "old_text": "a", "new_text": "aa", "replace_all": True}
    record = Journal.complete

    def crash_once(self: Journal, key: str, outcome: ToolOutcome) -> None:
        monkeypatch.setattr(Journal, "complete", record)
        raise OSError(errno.EIO, "simulated I/O error after the edit was written")

    monkeypatch.setattr(Journal, "complete", crash_once)
    with pytest.raises(OSError):  # transient: raised so that Temporal retries
        await run_tool(workspace, "edit_file", key="edit-2", **edit)
    assert (workspace / "a.txt").read_text() == "aa aa\n"

    retried = await run_tool(workspace, "edit_file", key="edit-2", **edit)
    assert retried.ok
    assert retried.output == "replaced 2 occurrences of old_text in a.txt"
    assert (workspace / "a.txt").read_text() == "aa aa\n"


# --- list_files and search_files -----------------------------------------------------


async def test_list_files_sorted_relative_and_skips_internal_folders(workspace: Path, outside: Path) -> None:
    for name in ["b.txt", "a/z.py", "a/y.txt", ".git/config", ".durable-agent/journal/x.json"]:
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text("x")
    outcome = await run_tool(workspace, "list_files")
    assert outcome.output.splitlines() == ["a/y.txt", "a/z.py", "b.txt", "dangling", "link_dir", "link_file"]

    only_py = await run_tool(workspace, "list_files", pattern="**/*.py")
    assert only_py.output == "a/z.py"
    inside_a = await run_tool(workspace, "list_files", path="a", pattern="*.txt")
    assert inside_a.output == "a/y.txt"


async def test_list_files_caps_entries(workspace: Path) -> None:
    for n in range(60):
        (workspace / f"f{n:02}.txt").write_text("x")
    lines = (await run_tool(workspace, "list_files")).output.splitlines()
    assert lines[:2] == ["f00.txt", "f01.txt"]
    assert len(lines) == 51
    assert lines[-1].startswith("[more than 50 entries; showing the first 50")


async def test_list_files_of_a_file_or_missing_folder(workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    assert (await run_tool(workspace, "list_files", path="a.txt")).error == "a.txt is a file, not a folder"
    assert (await run_tool(workspace, "list_files", path="nope")).error == "no such folder: nope"


async def test_search_files(workspace: Path, outside: Path) -> None:
    (workspace / "a.py").write_text("def foo():\n    return 1\n")
    (workspace / "docs").mkdir()
    (workspace / "docs/b.txt").write_text("nothing\nfoo bar\n")
    (workspace / "image.bin").write_bytes(b"foo\x00")
    (workspace / ".git").mkdir()
    (workspace / ".git/config").write_text("foo\n")

    outcome = await run_tool(workspace, "search_files", pattern=r"fo+")
    assert outcome.output.splitlines() == ["a.py:1: def foo():", "docs/b.txt:2: foo bar"]
    only_py = await run_tool(workspace, "search_files", pattern="foo", glob="*.py")
    assert only_py.output == "a.py:1: def foo():"
    in_file = await run_tool(workspace, "search_files", pattern="foo", path="docs/b.txt")
    assert in_file.output == "docs/b.txt:2: foo bar"


async def test_search_files_does_not_follow_symlinks_out(workspace: Path, outside: Path) -> None:
    outcome = await run_tool(workspace, "search_files", pattern="SECRET")
    assert outcome.ok
    assert outcome.output == "no matches for 'SECRET' in ."


async def test_search_files_caps_matches(workspace: Path) -> None:
    (workspace / "many.txt").write_text("hit\n" * 100)
    lines = (await run_tool(workspace, "search_files", pattern="hit")).output.splitlines()
    assert len(lines) == 21
    assert lines[-1].startswith("[stopped after 20 matches")


async def test_search_files_bad_regex(workspace: Path) -> None:
    outcome = await run_tool(workspace, "search_files", pattern="foo(")
    assert not outcome.ok
    assert (outcome.error or "").startswith("invalid regular expression 'foo(': missing )")


# --- run_command ---------------------------------------------------------------------


async def test_run_command_reports_exit_code_stdout_and_stderr(workspace: Path) -> None:
    outcome = await run_tool(workspace, "run_command", command="pwd; echo oops >&2")
    assert outcome.ok
    assert outcome.output == f"exit code: 0\n{os.path.realpath(workspace)}\noops\n"


async def test_run_command_nonzero_exit_is_a_normal_result(workspace: Path) -> None:
    outcome = await run_tool(workspace, "run_command", command="echo failing; exit 3")
    assert outcome.ok
    assert outcome.output == "exit code: 3\nfailing\n"


async def test_run_command_gets_no_stdin_and_no_worker_secrets(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    outcome = await run_tool(workspace, "run_command", command='cat; echo "key=${OPENAI_API_KEY:-unset}"')
    assert outcome.output == "exit code: 0\nkey=unset\n"


def unique_sleep() -> tuple[str, str]:
    """A `sleep` whose duration (300 s and a unique fraction) marks it among the host's
    processes: `$$` in the sandbox is a pid of its own namespace, not of the host."""
    seconds = f"300.{uuid.uuid4().int % 10**9}"
    return f"sleep {seconds}", f"sleep\0{seconds}"  # the second: its /proc cmdline


async def test_run_command_timeout_kills_the_whole_process_group(workspace: Path) -> None:
    sleep, marker = unique_sleep()
    began = time.monotonic()
    command = f"{sleep} & touch child-started; {sleep}"
    outcome = await run_tool(workspace, "run_command", command=command, timeout_s=1)
    assert time.monotonic() - began < 15
    assert not outcome.ok
    assert (outcome.error or "").startswith("command timed out after 1 s; it and every process it started")
    assert (workspace / "child-started").exists()  # the background sleep had been started
    assert host_processes_named(marker) == []


async def test_run_command_background_children_do_not_outlive_it(workspace: Path) -> None:
    sleep, marker = unique_sleep()
    key = uuid.uuid4().hex
    # The command waits for the test's go: its group, the background sleep in it, are seen alive.
    command = f"{sleep} >/dev/null 2>&1 & until [ -e go ]; do sleep 0.05; done"
    task = asyncio.create_task(run_tool(workspace, "run_command", key=key, command=command))
    pgid = await started_pgid(workspace, key)
    await until(lambda: len(host_processes_named(marker)) == 1)
    assert live_members(pgid)  # the journal's pgid is a host group (the sandbox's own)
    (workspace / "go").touch()
    outcome = await asyncio.wait_for(task, 60)
    assert outcome.ok and outcome.output.startswith("exit code: 0\n"), outcome
    assert host_processes_named(marker) == [] and live_members(pgid) == []


async def test_run_command_caps_huge_output_and_saves_it_whole(workspace: Path) -> None:
    command = "echo START; yes | head -c 5000000; echo; echo END"
    outcome = await run_tool(workspace, "run_command", command=command, output_chars=2_000)
    total = len("START\n") + 5_000_000 + len("\nEND\n")
    assert outcome.ok
    assert len(outcome.output) < 2_200
    assert outcome.output.startswith("exit code: 0\nSTART\ny\ny\n")
    assert outcome.output.endswith("y\n\nEND\n")
    assert f"… {total:,} bytes total, " in outcome.output
    assert outcome.output_bytes == total
    assert outcome.full_output_ref is not None
    assert outcome.full_output_ref.startswith(".durable-agent/outputs/")
    assert f"full output: {outcome.full_output_ref} …" in outcome.output
    assert (workspace / outcome.full_output_ref).stat().st_size == total


async def test_run_command_heartbeats_while_running(workspace: Path) -> None:
    # Without a heartbeat timeout (as here) a call beats every second, the first after one.
    env = ActivityEnvironment()
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(time.monotonic())
    started = time.monotonic()
    await run_tool(workspace, "run_command", env=env, command="sleep 2.4")
    assert len(beats) >= 2
    assert beats[0] - started >= 0.9


async def test_a_command_over_before_its_first_beat_sends_no_heartbeat(workspace: Path) -> None:
    env = ActivityEnvironment()
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(time.monotonic())
    outcome = await run_tool(workspace, "run_command", env=env, command="true")
    assert outcome.ok
    assert beats == []


async def test_cancellation_kills_the_process_group(workspace: Path) -> None:
    env = ActivityEnvironment()
    key = uuid.uuid4().hex
    task = asyncio.create_task(run_tool(workspace, "run_command", key=key, env=env, command="sleep 300 & sleep 300"))
    pgid = await started_pgid(workspace, key)
    assert live_members(pgid)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    assert not live_members(pgid)
    # The record says what happened, so a later attempt with this key does not run it again.
    again = await run_tool(workspace, "run_command", key=key, command="sleep 300 & sleep 300")
    assert (again.error or "").startswith("the command was cancelled")


async def test_same_key_runs_the_command_once(workspace: Path) -> None:
    first = await run_tool(workspace, "run_command", key="cmd-1", command="echo x >> ledger.txt; echo ran")
    again = await run_tool(workspace, "run_command", key="cmd-1", command="echo x >> ledger.txt; echo ran")
    assert again == first
    assert (workspace / "ledger.txt").read_text() == "x\n"


async def test_start_record_without_completion_is_not_run_again(workspace: Path) -> None:
    # A worker that died between journalling the start and launching the command.
    Journal(workspace).start("cmd-2", {"command": "echo x >> ledger.txt"})
    outcome = await run_tool(workspace, "run_command", key="cmd-2", command="echo x >> ledger.txt")
    assert not outcome.ok
    assert (outcome.error or "").startswith(INTERRUPTED)
    assert not (workspace / "ledger.txt").exists()


def record_fsyncs(monkeypatch: pytest.MonkeyPatch, workspace: Path) -> list[tuple[str, bool]]:
    """Every fsync from now on: the synced path (relative to the workspace) and whether the
    command's ledger existed yet."""
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((os.path.relpath(path, workspace), (workspace / "ledger.txt").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


async def test_a_command_is_journalled_on_disk_before_it_runs(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # After a machine crash, the start record is what stops a second run; the rest need not
    # wait for the disk: a lost done record leaves the start record, so the retry says
    # "interrupted" instead of running the command again.
    synced = record_fsyncs(monkeypatch, workspace)
    outcome = await run_tool(workspace, "run_command", key="cmd-sync", command="echo x >> ledger.txt")
    assert outcome.ok, outcome
    entry, folder = synced[0][0], synced[1][0]
    assert re.fullmatch(r"\.durable-agent/journal/\.[0-9a-f]{32}\.started\.json\.[0-9a-f]{8}\.tmp", entry), synced
    assert folder == ".durable-agent/journal"
    assert [ran for _, ran in synced[:2]] == [False, False]  # both on disk before the command ran
    assert len(synced) == 2, synced  # nothing else waits for the disk: not the done record
    assert not any(".done." in path for path, _ in synced)


async def test_file_writes_wait_for_no_disk_but_an_edit_journals_first(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch, workspace)
    assert (await run_tool(workspace, "write_file", path="a.txt", content="one\n")).ok
    assert synced == []  # atomic (temp file and rename), which a killed worker cannot tear
    assert (await run_tool(workspace, "edit_file", path="a.txt", old_text="one", new_text="two")).ok
    assert [".started.json." in path for path, _ in synced] == [True, False], synced
    assert synced[1][0] == ".durable-agent/journal"
    assert (workspace / "a.txt").read_text() == "two\n"


async def cancel_mid_command(tools: ToolActivities, call: ToolCallInput, details: ActivityCancellationDetails) -> None:
    """Run the call's first attempt and cancel it once its command has started."""
    env = ActivityEnvironment()
    attempt = asyncio.create_task(env.run(tools.run_command, call))
    await until(lambda: Path(call.workspace, "started.txt").exists())
    env.cancel(details)
    await asyncio.wait([attempt])
    assert attempt.cancelled() or isinstance(attempt.exception(), asyncio.CancelledError)


def slow_command(workspace: Path, key: str, sleep: str = "sleep 1") -> ToolCallInput:
    return chain_call(workspace, key, command=f"echo started > started.txt; {sleep}; echo done >> ledger.txt")


async def test_a_retry_after_a_spurious_heartbeat_timeout_waits_for_the_command(workspace: Path) -> None:
    # A worker too busy to send a command's first heartbeat in time: the server gives the
    # attempt up and retries it, while the command still runs in the same worker.
    tools = ToolActivities()
    call = slow_command(workspace, "busy-1")
    await cancel_mid_command(tools, call, ActivityCancellationDetails(timed_out=True))
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    outcome = await retry.run(tools.run_command, call)
    assert outcome.ok and outcome.output.startswith("exit code: 0"), outcome
    assert (workspace / "ledger.txt").read_text() == "done\n"  # ran once, to the end


async def test_a_cancellation_asked_for_still_stops_the_command(workspace: Path) -> None:
    tools = ToolActivities()
    sleep, marker = unique_sleep()  # 300 s: stopped by the cancel, however slow the machine
    call = slow_command(workspace, "stop-1", sleep)
    await cancel_mid_command(tools, call, ActivityCancellationDetails(cancel_requested=True))
    await until(lambda: host_processes_named(marker) == [])
    assert not (workspace / "ledger.txt").exists()
    again = await ActivityEnvironment().run(tools.run_command, call)
    assert not again.ok and (again.error or "").startswith("the command was cancelled"), again


def chain_call(workspace: Path, key: str, **arguments: Any) -> ToolCallInput:
    """A call of run chain "chain-1", step 1: journalled in that step's folder."""
    return ToolCallInput(
        call_id="c", idempotency_key=key, workspace=str(workspace), arguments=arguments, run_folder="chain-1", step=1
    )


async def test_a_file_tool_names_its_run_in_the_chain_folder(workspace: Path) -> None:
    # File tools run on a thread of their own; the activity's context goes with them.
    env = ActivityEnvironment()
    assert (await env.run(TOOLS.write_file, chain_call(workspace, "w-1", path="a.txt", content="x"))).ok
    identity = json.loads((workspace / ".durable-agent/journal/chain-1/chain.json").read_text())
    assert identity == {"workflow_id": env.info.workflow_id}


async def test_a_command_no_retry_collects_is_stopped_after_a_grace(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server gave the attempt up, and no retry came to this worker (the run closed, or
    # the retry went elsewhere): the command does not run on unwatched until its timeout.
    monkeypatch.setattr(calls_here, "ORPHAN_GRACE_S", 0.5)
    tools = ToolActivities()
    sleep, marker = unique_sleep()  # 300 s: gone within the wait below, it was stopped at the grace
    call = slow_command(workspace, "orphan-1", sleep)
    await cancel_mid_command(tools, call, ActivityCancellationDetails(timed_out=True))
    await until(lambda: "orphan-1" not in CALLS_HERE and host_processes_named(marker) == [])
    assert not (workspace / "ledger.txt").exists()
    again = await ActivityEnvironment().run(tools.run_command, call)
    assert not again.ok and (again.error or "").startswith("the command was cancelled"), again


async def test_a_cancellation_while_a_command_is_prepared_closes_its_launch(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[CommandLaunch] = []
    real_prepare, real_close = CommandLaunch.prepare, CommandLaunch.close

    preparing, cancelled = threading.Event(), threading.Event()

    def slow_prepare(*args: Any) -> CommandLaunch:
        preparing.set()
        cancelled.wait(timeout=30)  # in the preparing thread, while the activity is cancelled
        return real_prepare(*args)

    def close(launch: CommandLaunch) -> None:
        closed.append(launch)
        real_close(launch)

    monkeypatch.setattr(CommandLaunch, "prepare", staticmethod(slow_prepare))
    monkeypatch.setattr(CommandLaunch, "close", close)
    call = chain_call(workspace, "prep-1", command="echo x >> ledger.txt")
    env = ActivityEnvironment()
    attempt = asyncio.create_task(env.run(ToolActivities().run_command, call))
    await until(preparing.is_set, within_s=30)
    env.cancel(ActivityCancellationDetails(cancel_requested=True))
    cancelled.set()
    await asyncio.wait([attempt])
    assert len(closed) == 1  # the cgroup and the rest of the launch, made after the cancel
    assert not (workspace / "ledger.txt").exists()
    again = await ActivityEnvironment().run(ToolActivities().run_command, call)
    assert not again.ok and (again.error or "").startswith("the command was cancelled"), again


async def test_an_empty_done_record_reads_as_absent(workspace: Path) -> None:
    # What a machine crash can leave of a record written without fsync. A command falls back
    # on its start record (synced before it ran), which its step's folder still holds.
    first = await run_tool_in_chain(workspace, "run_command", "cmd-e", command="echo x >> ledger.txt")
    assert first.ok
    step = step_journal_path(str(workspace), "chain-1", 1)
    (step / f"{key_digest('cmd-e')}.done.json").write_bytes(b"")
    again = await run_tool_in_chain(workspace, "run_command", "cmd-e", command="echo x >> ledger.txt")
    assert not again.ok and (again.error or "").startswith(INTERRUPTED), again
    assert (workspace / "ledger.txt").read_text() == "x\n"
    assert (await run_tool_in_chain(workspace, "write_file", "w-e", path="a.txt", content="one")).ok
    (step / f"{key_digest('w-e')}.done.json").write_bytes(b"")
    (workspace / "a.txt").write_text("changed")
    assert (await run_tool_in_chain(workspace, "write_file", "w-e", path="a.txt", content="one")).ok
    assert (workspace / "a.txt").read_text() == "one"  # written again: the same bytes


async def test_an_empty_start_record_still_stops_a_second_run(workspace: Path) -> None:
    # The update that adds the command's process group replaces the synced start record
    # without a sync of its own: a machine crash can leave it empty, never absent.
    step = step_journal_path(str(workspace), "chain-1", 1)
    step.mkdir(parents=True)
    (step / f"{key_digest('cmd-s')}.started.json").write_bytes(b"")
    outcome = await run_tool_in_chain(workspace, "run_command", "cmd-s", command="echo x >> ledger.txt")
    assert not outcome.ok and (outcome.error or "").startswith(INTERRUPTED), outcome
    assert not (workspace / "ledger.txt").exists()


async def run_tool_in_chain(workspace: Path, tool: str, key: str, **arguments: Any) -> ToolOutcome:
    return await ActivityEnvironment().run(getattr(TOOLS, tool), chain_call(workspace, key, **arguments))


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from temporalio.testing import ActivityEnvironment
    from activities.tools import ToolActivities
    from workflows.types import ToolCallInput

    call = ToolCallInput.model_validate_json(sys.argv[1])
    asyncio.run(ActivityEnvironment().run(ToolActivities().run_command, call))
    """
)


SLEEP_S = 301  # a duration no other test's command sleeps, to find its process by name


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_worker_killed_mid_command_the_retry_kills_its_group_and_does_not_rerun(
    workspace: Path, sandboxed: bool
) -> None:
    command = f'echo scratch > "$TMPDIR/scratch"; sleep {SLEEP_S}; echo ran >> ledger.txt'
    sleeping = f"sleep\0{SLEEP_S}\0"  # the command's own process, inside the sandbox or not
    call = ToolCallInput(
        call_id="call-1", idempotency_key="cmd-3", workspace=str(workspace), arguments={"command": command}
    )
    env = {**os.environ} if sandboxed else {**os.environ, UNSANDBOXED_ENV: UNSANDBOXED_CONSENT}
    worker = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, call.model_dump_json()], cwd=PROJECT_ROOT, env=env)
    try:
        pgid = await started_pgid(workspace, "cmd-3")
        # bubblewrap asks to die with its parent only once it runs, so a kill in the moment
        # after its exec would leave it running (the retry then kills it, as unsandboxed);
        # this test kills the worker once the command itself runs.
        await until(lambda: bool(host_processes_named(sleeping)))
        home = Journal(workspace).started("cmd-3").get("home")  # type: ignore[union-attr]
    finally:
        worker.kill()
        worker.wait()
    # An unsandboxed command's HOME and TMPDIR, which the killed worker could not remove.
    assert (home is None) == sandboxed and (sandboxed or os.path.exists(f"{home}/scratch"))
    if sandboxed:
        # bubblewrap dies with its parent, and its PID namespace with it.
        await until(lambda: not live_members(pgid) and not host_processes_named(sleeping))
        expected = "it is no longer running"
    else:
        assert live_members(pgid), "the orphaned command should outlive its SIGKILLed worker"
        expected = "it was still running and has now been killed"

    retried = await run_tool(workspace, "run_command", key="cmd-3", command=command)
    assert not retried.ok
    assert retried.error == f"{INTERRUPTED} ({expected})"
    assert not live_members(pgid) and not host_processes_named(sleeping)
    assert not (workspace / "ledger.txt").exists()
    assert home is None or not os.path.lexists(home)
    assert await run_tool(workspace, "run_command", key="cmd-3", command=command) == retried


def test_a_retry_removes_only_a_home_of_its_own_making(tmp_path: Path) -> None:
    """The home a start record names is removed only if it is a folder PlainHome makes: never
    another path, nor a symlink to one, whatever a record of an older version says."""
    made = PlainHome.create()
    link = f"{made.folder}-link"
    os.symlink(tmp_path, link)
    try:
        for named in ("/etc", f"{tempfile.gettempdir()}/not-a-home", f"{made.folder}/{PlainHome.PREFIX}x", link, 7):
            assert PlainHome.left_by({"home": named}) is None, named
        assert PlainHome.left_by({"home": made.folder}) == made
    finally:
        os.unlink(link)
        made.remove()


async def test_read_file_never_holds_a_huge_line_in_memory(workspace: Path) -> None:
    with open(workspace / "one-line.txt", "wb") as f:
        f.write(b"a" * 50 * 2**20 + b"\nsecond line\n")
    tracemalloc.start()
    try:
        outcome = await run_tool(workspace, "read_file", path="one-line.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.ok and "line clipped" in outcome.output and "     2\tsecond line" in outcome.output
    assert peak < 8 * 2**20, f"peak {peak:,} bytes"


async def test_edit_file_refuses_a_file_too_large_to_hold(workspace: Path) -> None:
    with open(workspace / "big.txt", "wb") as f:
        f.truncate(17 * 2**20)
    outcome = await run_tool(workspace, "edit_file", path="big.txt", old_text="a", new_text="b")
    assert not outcome.ok and "over edit_file's 16 MiB" in (outcome.error or "")


async def test_a_saved_output_keeps_its_first_bytes_and_says_what_it_did_not_save(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "SAVED_OUTPUT_MAX_BYTES", 100_000)
    outcome = await run_tool(workspace, "run_command", command="seq 1 100000")  # 588,895 bytes
    assert outcome.ok and outcome.full_output_ref
    assert (workspace / outcome.full_output_ref).stat().st_size == 100_000
    assert "its first 100,000 bytes saved" in outcome.output and "488,895 not saved" in outcome.output


async def test_the_oldest_saved_outputs_make_room_and_say_they_were_dropped(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "SAVED_OUTPUT_MAX_BYTES", 100_000)
    monkeypatch.setattr(output, "OUTPUTS_MAX_BYTES", 250_000)
    saved = workspace / ".durable-agent" / "outputs"
    saved.mkdir(parents=True)
    for age, name in enumerate(["old.txt", "older.txt"]):
        (saved / name).write_bytes(b"x" * 100_000)
        os.utime(saved / name, (time.time() - 100 * (age + 1),) * 2)
    # A new output may save a quarter of the folder's 250,000 bytes: 200,000 held leave too little room.
    outcome = await run_tool(workspace, "run_command", command="seq 1 20000")
    assert outcome.full_output_ref
    assert (saved / "older.txt").read_text().startswith("[dropped: this output held 100,000 bytes")
    assert (saved / "old.txt").stat().st_size == 100_000
    assert "1 earlier saved output(s) (100,000 bytes) were replaced by a note: older.txt" in outcome.output
    assert sum(p.stat().st_size for p in saved.iterdir()) <= 250_000


async def test_a_steps_last_call_takes_the_snapshot_after_acting_or_leaves_it_to_the_run(
    tmp_path: Path, workspace: Path
) -> None:
    """The snapshot holds the call's own effect; a store that refuses leaves the outcome as it
    is, without a snapshot (the run then takes it in `snapshot_workspace`)."""
    store = Store(tmp_path / "store")
    tools = ToolActivities(roots=[str(tmp_path)], snapshots=SnapshotActivities([str(tmp_path)], store))
    request = SnapshotRequest(workspace=str(workspace), step=3)
    call = ToolCallInput(
        call_id="c", idempotency_key="k1", workspace=str(workspace), arguments={"command": "echo hi > b.txt"}
    )
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, started_time=datetime.now(UTC), start_to_close_timeout=timedelta(seconds=30)
    )
    outcome = await env.run(tools.run_command, call.model_copy(update={"snapshot": request}))
    assert outcome.ok and outcome.snapshot is not None and outcome.snapshot.step == 3
    assert {path: entry[-1] for path, entry in store.files(outcome.snapshot.digest).items()} == {
        "b.txt": hashlib.sha256(b"hi\n").hexdigest()
    }

    not_a_folder = tmp_path / "not-a-folder"
    not_a_folder.write_text("a file where the store's folder should be: it refuses every write, even root's")
    tools = ToolActivities(roots=[str(tmp_path)], snapshots=SnapshotActivities([str(tmp_path)], Store(not_a_folder)))
    write = call.model_copy(
        update={"idempotency_key": "k2", "arguments": {"path": "c.txt", "content": "c"}, "snapshot": request}
    )
    outcome = await env.run(tools.write_file, write)
    assert outcome.ok and outcome.snapshot is None and (workspace / "c.txt").read_text() == "c"

    # Less than its margin left of the attempt's time: the call answers without a snapshot.
    tools = ToolActivities(roots=[str(tmp_path)], snapshots=SnapshotActivities([str(tmp_path)], store))
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC) - timedelta(seconds=25))
    late = call.model_copy(update={"idempotency_key": "k3", "arguments": {"command": "true"}, "snapshot": request})
    outcome = await env.run(tools.run_command, late)
    assert outcome.ok and outcome.snapshot is None


async def test_a_commands_riding_file_calls_run_before_it_in_its_activity_once_each(
    tmp_path: Path, workspace: Path
) -> None:
    """The step's file calls run in order inside the command's activity, before the command;
    each is journaled on its own key, so a retry of the activity neither repeats an edit nor
    runs the command again; a call the model can act on (a path outside the workspace) is
    that call's error, and the others and the command go on."""
    (workspace / "a.txt").write_text("x")
    tools = ToolActivities(roots=[str(tmp_path)])

    def rider(tool: str, key: str, **arguments: str) -> RidingCall:
        call = ToolCallInput(call_id=key, idempotency_key=f"step/{key}", workspace=str(workspace), arguments=arguments)
        return RidingCall(tool=tool, call=call)

    command = ToolCallInput(
        call_id="cmd",
        idempotency_key="step/cmd",
        workspace=str(workspace),
        arguments={"command": "cat a.txt b.txt; echo ran >> ran.txt"},
        riding=[
            rider("edit_file", "edit", path="a.txt", old_text="x", new_text="xx"),
            rider("write_file", "escape", path="../escaped.txt", content="out"),
            rider("write_file", "write", path="b.txt", content="b"),
        ],
    )
    first = await ActivityEnvironment().run(tools.run_command, command)
    assert first.ok and first.output.splitlines()[-1] == "xxb", first.output  # the command saw both files
    assert [o.ok for o in first.riding] == [True, False, True]
    assert first.riding[1].error == "path escapes the workspace: ../escaped.txt"
    assert not (tmp_path / "escaped.txt").exists()

    again = await ActivityEnvironment().run(tools.run_command, command)  # the activity retried
    assert (workspace / "a.txt").read_text() == "xx" and (workspace / "ran.txt").read_text() == "ran\n"
    assert [o.output for o in again.riding] == [o.output for o in first.riding] and again.output == first.output

    # A disk fault a retry may cure fails the attempt before the command begins.
    def eio(*_: object) -> ToolOutcome:
        raise OSError(errno.EIO, "Input/output error")

    tools._file_tools["write_file"] = eio
    write = rider("write_file", "step2-write", path="c.txt", content="c")
    faulty = command.model_copy(update={"idempotency_key": "step2/cmd", "riding": [write]})
    with pytest.raises(OSError, match="Input/output error"):
        await ActivityEnvironment().run(tools.run_command, faulty)
    assert (workspace / "ran.txt").read_text() == "ran\n"
