"""A failing or hostile tool call reaches the model as a tool error; it never fails the run
or stalls the worker (issue 13, items 1 and 2)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

import activities.tools as tool_activities
from activities.journal import JOURNAL_DIR, key_digest
from durable_agent.model_server import ModelServer, Reply
from tests.helpers import skip_without, start, wait_for
from tests.scripts import Script, answer, tool_results, tools
from workflows.compaction import run_folder
from workflows.types import ToolCallInput


async def test_a_corrupt_journal_entry_reaches_the_model_as_a_tool_error(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # write_file is a local activity: its non-retryable JournalCorrupt surfaces as an
    # ApplicationError, not an ActivityError; run_command (regular) fails the same way.
    model_server.responder = Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "x"}), ("run_command", {"command": "echo hi"})),
            answer("carried on"),
        ]
    )
    handle = await start(
        client, task_queue, goal="x", workspace=str(workspace), approval={"tools": ["write_file", "run_command"]}
    )
    status = await wait_for(handle, lambda s: len(s.pending_approvals) == 2)
    run_id = (await handle.describe()).run_id
    journal = workspace / JOURNAL_DIR / run_folder(handle.id, run_id) / "step-000001"
    journal.mkdir(parents=True)
    for pending in status.pending_approvals:
        call_id = pending.call_id.split(":", 1)[1]
        key = f"{handle.id}/{run_id}/1/{call_id}"
        (journal / f"{key_digest(key)}.done.json").write_text("{not json")
        await handle.execute_update("approve", {"call_id": pending.call_id, "approved": True})
    result = await handle.result()
    assert result.state == "completed" and result.output == "carried on"
    results = tool_results(model_server.requests[-1])
    assert len(results) == 2 and all("journal entry" in r and "unreadable" in r for r in results), results
    assert not (workspace / "a.txt").exists()


async def test_a_socket_is_refused_as_a_tool_error_and_the_run_goes_on(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(workspace / "sock"))
    try:
        model_server.responder = Script([tools(("read_file", {"path": "sock"})), answer("ok")])
        handle = await start(client, task_queue, goal="x", workspace=str(workspace))
        result = await asyncio.wait_for(handle.result(), 60)
    finally:
        listener.close()
    assert result.state == "completed"
    [error] = tool_results(model_server.requests[-1])
    assert error.startswith("ERROR:") and "sock" in error and "socket" in error, error
    assert len(model_server.requests) == 2


@pytest.mark.timeout(150)
async def test_hostile_files_neither_block_the_worker_nor_starve_another_run(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path, tmp_path: Path
) -> None:
    # One step of run A: a catastrophic regex over a long line, and 8 reads of named pipes
    # that no one writes to. Run B, on the same worker, must still finish its steps.
    (workspace / "long.txt").write_text("a" * 5_000 + "b\n")
    for i in range(8):
        os.mkfifo(workspace / f"pipe{i}")
    hostile = [("search_files", {"pattern": "(a+)+$"})] + [("read_file", {"path": f"pipe{i}"}) for i in range(8)]
    other = tmp_path / "other"
    other.mkdir()

    def respond(request: dict) -> Reply:
        goal = request["messages"][1]["content"]
        if goal == "hostile":
            return Script([Reply(tool_calls=hostile)], final="hostile done")(request)
        return Script([tools(("list_files", {}))] * 3, final="other done")(request)

    model_server.responder = respond
    hostile_run = await start(client, task_queue, goal="hostile", workspace=str(workspace))
    await asyncio.sleep(0.5)
    began = time.monotonic()
    other_run = await start(client, task_queue, goal="other", workspace=str(other))
    other_result = await asyncio.wait_for(other_run.result(), 60)
    assert other_result.output == "other done" and time.monotonic() - began < 30
    result = await asyncio.wait_for(hostile_run.result(), 90)
    assert result.state == "completed"
    search, *pipes = tool_results(
        next(r for r in model_server.requests if r["messages"][1]["content"] == "hostile" and len(r["messages"]) > 3)
    )
    # Bounded either by the search's own limit or, on a loaded machine whose search thread
    # started late, by the per-call bound.
    assert search.startswith("ERROR:") and ("timed out" in search or "did not finish within" in search), search
    assert all(p.startswith("ERROR:") and "FIFO" in p for p in pipes), pipes


async def test_a_file_tool_call_is_bounded_in_time_on_a_thread_of_its_own(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The search outlasts a (lowered) per-call bound: the call reports at the bound while
    # the search, on its own thread, runs on to its own limit without holding the GIL.
    monkeypatch.setattr(tool_activities, "FILE_TOOL_TIME_LIMIT_S", 0.5)
    (workspace / "long.txt").write_text("a" * 5_000 + "b\n")
    call = ToolCallInput(call_id="c", idempotency_key="k", workspace=str(workspace), arguments={"pattern": "(a+)+$"})
    began = time.monotonic()
    outcome = await ActivityEnvironment().run(tool_activities.ToolActivities().search_files, call)
    assert time.monotonic() - began < 8  # at the bound, not at the search's own 10 s limit
    assert not outcome.ok and "did not finish within 0.5 s" in (outcome.error or ""), outcome
    ticks = 0
    end = time.monotonic() + 1
    while time.monotonic() < end:  # the event loop runs freely meanwhile
        await asyncio.sleep(0.01)
        ticks += 1
    # About 100 on an idle machine, 40 under a CPU hog on both cores; a search that held
    # the GIL would leave the loop none.
    assert ticks > 10


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a larger write fails with ENOSPC, an error a retry may cure."""
    if os.geteuid() != 0:
        skip_without("root", "mounting a tmpfs needs root")
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


async def test_a_disk_error_that_outlasts_the_retries_reaches_the_model(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, full_disk: Path
) -> None:
    model_server.responder = Script(
        [tools(("write_file", {"path": "big.txt", "content": "x" * 200_000})), answer("noted")]
    )
    handle = await start(client, task_queue, goal="x", workspace=str(full_disk))
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.state == "completed" and result.output == "noted"
    [error] = tool_results(model_server.requests[-1])
    assert error.startswith("ERROR: write_file failed") and "No space left" in error, error


@pytest.mark.timeout(60)
async def test_a_fifo_planted_where_output_is_saved_does_not_block_the_worker(workspace: Path) -> None:
    # A command could leave a named pipe in .durable-agent/outputs/; saving a long output
    # there must replace it, not open it (which would block the worker's event loop).
    key = "planted"
    outputs = workspace / ".durable-agent" / "outputs"
    outputs.mkdir(parents=True)
    os.mkfifo(outputs / f"{key_digest(key)}.txt")
    call = ToolCallInput(
        call_id="c",
        idempotency_key=key,
        workspace=str(workspace),
        arguments={"command": "yes | head -c 100000"},
        output_chars=2_000,
    )
    outcome = await asyncio.wait_for(ActivityEnvironment().run(tool_activities.ToolActivities().run_command, call), 20)
    assert outcome.ok and outcome.full_output_ref, outcome
    saved = workspace / outcome.full_output_ref
    assert saved.is_file() and saved.stat().st_size == 100_000
