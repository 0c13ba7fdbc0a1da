"""A run's journal, saved outputs and archive: per-chain folders, caps that say what they
drop, and the journal removed when the chain closes. Judged by what is on disk.

Real dev server, real worker (in process, or a `python worker.py` SIGKILLed), scripted model.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.cleanup import clean_up
from durable_agent.model_server import ModelServer
from durable_agent.processes import kill_hard, spawn_worker, stop_gently
from durable_agent.server import EmbeddedServer
from tests.helpers import JOURNAL_GONE, start, until, wait_for
from tests.scripts import Script, answer, tool_results, tools
from tests.test_cli import cli_env, durable_agent, one_line_error
from tests.test_context import command_turns, is_summary_request
from tests.test_crash import ledger_lines, worker_env
from worker import build_worker
from workflows.compaction import run_folder
from workflows.types import Message, RunFilesCleanup

RESERVED = ".durable-agent"
LONG_OUTPUT = {"command": "seq 1 30000"}  # 168,894 bytes: cut for the model, saved whole


def chain_of(handle: WorkflowHandle[Any, Any]) -> str:
    return run_folder(handle.id, handle.first_execution_run_id or "")


def bytes_at_rest(path: Path) -> int:
    """Every byte of every file under `path` (0 if it is gone)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def scheduled_activities(history: Any) -> list[str]:
    """The activities the run ran, regular (scheduled events) and local (their markers)."""
    names = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif (
            e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and "data" in e.marker_recorded_event_attributes.details
        ):
            data = e.marker_recorded_event_attributes.details["data"].payloads[0].data
            names.append(json.loads(data).get("activity_type", "") if data.startswith(b"{") else "")
    return names


def test_a_second_cleanup_says_what_the_first_said(workspace: Path) -> None:
    """A close run again (its first attempt's worker killed) must not change the run's result."""
    run_folder = "chain-1"
    (workspace / RESERVED / "journal" / run_folder).mkdir(parents=True)
    (workspace / RESERVED / "journal" / run_folder / "chain.json").write_text("{}")
    request = RunFilesCleanup(workspace=str(workspace), run_folder=run_folder)
    first = clean_up(request, [str(workspace)])
    assert first.note.startswith(JOURNAL_GONE) and first.removed_files == 1
    again = clean_up(request, [str(workspace)])
    assert again.note == first.note and again.removed_files == 0


async def test_the_journal_holds_the_current_step_while_open_and_is_removed_at_close(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "1"}), ("run_command", LONG_OUTPUT)),
            tools(("run_command", {"command": "echo two"})),
            answer("done"),
        ]
    )
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), approval={"commands": ["^echo two$"]})
    chain = chain_of(handle)
    journal = workspace / RESERVED / "journal" / chain
    status = await wait_for(handle, lambda s: len(s.pending_approvals) == 1)
    # Open, step 2 waiting: step 1's two entries are still there (nothing of step 2 ran yet).
    assert sorted(p.name for p in journal.iterdir()) == ["chain.json", "step-000001"]
    assert len(list((journal / "step-000001").glob("*.done.json"))) == 2
    await handle.execute_update("approve", {"call_id": status.pending_approvals[0].call_id, "approved": True})
    result = await handle.result()

    assert result.state == "completed" and result.output == "done"
    assert not journal.exists() and bytes_at_rest(workspace / RESERVED / "journal") == 0
    outputs = workspace / RESERVED / "outputs" / chain
    [saved] = outputs.glob("*.txt")
    assert saved.stat().st_size == 168_894  # kept after the close, for gc
    assert result.files is not None and result.files.startswith(JOURNAL_GONE)
    assert "saved outputs (2 files, " in result.files  # the output and chain.json
    assert scheduled_activities(await handle.fetch_history()).count("clean_up_run") == 1


async def test_a_cancelled_run_removes_its_journal_too(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script(
        [tools(("write_file", {"path": "a.txt", "content": "1"})), tools(("run_command", {"command": "echo x"}))]
    )
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), approval={"tools": ["run_command"]})
    await wait_for(handle, lambda s: len(s.pending_approvals) == 1)
    journal = workspace / RESERVED / "journal" / chain_of(handle)
    assert list(journal.rglob("*.done.json"))
    await handle.cancel()
    result = await handle.result()
    assert result.state == "cancelled"
    assert not journal.exists() and result.files
    assert result.files.startswith(JOURNAL_GONE)


async def test_across_continue_as_new_one_chain_folder_and_cleanup_only_at_the_close(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    steps = [tools(("run_command", {"command": f"echo {n} >> ledger.txt"})) for n in range(12)]
    model_server.responder = Script([*steps, answer("long done")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace), continue_as_new_every=10)
    result = await handle.result()
    assert result.state == "completed" and result.steps == 13
    assert ledger_lines(workspace / "ledger.txt") == [str(n) for n in range(12)]
    first_run = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    assert "clean_up_run" not in scheduled_activities(await first_run.fetch_history())
    assert (await handle.describe()).run_id != handle.first_execution_run_id  # it did continue as new
    assert [p.name for p in (workspace / RESERVED / "journal").iterdir()] == []
    # Step 12's records and chain.json.
    assert result.files and result.files.startswith(JOURNAL_GONE)


async def test_saved_outputs_over_the_runs_cap_are_dropped_and_the_model_and_log_say_so(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 200 KiB for the run: each output saves its first 51,200 bytes (a quarter), and four fit.
    monkeypatch.setenv("DURABLE_AGENT_OUTPUTS_MAX_BYTES", "200K")
    model_server.responder = Script([tools(("run_command", LONG_OUTPUT)) for _ in range(5)] + [answer("ok")])
    caplog.set_level(logging.INFO)
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="x", workspace=str(workspace))
        result = await handle.result()
    assert result.state == "completed"
    outputs = workspace / RESERVED / "outputs" / chain_of(handle)
    saved = sorted(outputs.glob("*.txt"), key=lambda p: p.stat().st_size)
    assert sum(p.stat().st_size for p in saved) <= 200 * 1024
    assert [p.stat().st_size for p in saved][2:] == [51_200] * 3
    assert all(p.read_text().startswith("[dropped: this output held 51,200 bytes") for p in saved[:2])
    results = tool_results(model_server.requests[-1])
    assert all("earlier saved output" not in r for r in results[:4])
    assert "2 earlier saved output(s) (102,400 bytes) were replaced by a note" in results[4], results[4]
    assert "204,800 bytes" in results[4]
    assert any("over its cap of 204800 bytes: replaced 2" in r.getMessage() for r in caplog.records)


async def test_a_full_journal_refuses_the_next_call_of_the_step_and_says_why(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_JOURNAL_MAX_BYTES", "1")
    caplog.set_level(logging.WARNING)
    model_server.responder = Script(
        [
            tools(("write_file", {"path": "a.txt", "content": "1"}), ("write_file", {"path": "b.txt", "content": "2"})),
            tools(("write_file", {"path": "c.txt", "content": "3"})),
            answer("ok"),
        ]
    )
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="x", workspace=str(workspace), approval={"tools": ["write_file"]})
        pending = (await wait_for(handle, lambda s: len(s.pending_approvals) == 2)).pending_approvals
        # Each call's approval waits for its diff first (an activity), and the diffs finish in any
        # order: the approvals are listed in the order the model asked for the calls.
        first, second = pending
        assert "a.txt" in first.summary and "b.txt" in second.summary, pending
        await handle.execute_update("approve", {"call_id": first.call_id, "approved": True})
        await until(lambda: (workspace / "a.txt").exists())
        await handle.execute_update("approve", {"call_id": second.call_id, "approved": True})
        third = await wait_for(handle, lambda s: len(s.pending_approvals) == 1 and s.step == 2)
        await handle.execute_update("approve", {"call_id": third.pending_approvals[0].call_id, "approved": True})
        result = await handle.result()
    assert result.state == "completed"
    step_one = tool_results(model_server.requests[1])
    assert step_one[0].startswith("wrote") or "a.txt" in step_one[0]
    assert "not run: this step's tool journal holds" in step_one[1] and "DURABLE_AGENT_JOURNAL_MAX_BYTES" in step_one[1]
    assert not (workspace / "b.txt").exists()  # refused before acting
    assert any("at its cap of 1 bytes: a call refused" in r.getMessage() for r in caplog.records)
    assert (workspace / "c.txt").read_text() == "3"  # the next step records again


async def test_a_cleanup_failure_is_reported_and_changes_nothing_else(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not durable-agent's")
    (workspace / RESERVED).mkdir()
    (workspace / RESERVED / "journal").symlink_to(outside)
    model_server.responder = Script([tools(("write_file", {"path": "a.txt", "content": "1"})), answer("finished")])
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    result = await handle.result()
    assert result.state == "completed" and result.output == "finished" and result.unfinished == []
    assert result.files and result.files.startswith("cleaning up the run's files failed:"), result.files
    assert "is a symlink" in result.files
    [refused] = tool_results(model_server.requests[-1])
    assert "is a symlink" in refused and not (workspace / "a.txt").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]  # nothing created or removed through it


async def test_the_journal_is_removed_at_close_after_a_worker_sigkill_mid_command(
    client: Client,
    temporal_server: EmbeddedServer,
    model_server: ModelServer,
    task_queue: str,
    workspace: Path,
    tmp_path: Path,
) -> None:
    ledger = workspace / "ledger.txt"
    model_server.responder = Script(
        [
            tools(("run_command", {"command": "echo 1 >> ledger.txt; sleep 2; echo done-1"})),
            tools(("run_command", {"command": "echo 2 >> ledger.txt"})),
            answer("survived"),
        ]
    )
    env = worker_env(temporal_server, model_server, task_queue)
    worker = spawn_worker(env, tmp_path / "w0.log")
    try:
        handle = await start(client, task_queue, goal="crash me", workspace=str(workspace))
        journal = workspace / RESERVED / "journal" / chain_of(handle)
        await until(lambda: ledger_lines(ledger) == ["1"])
        assert list(journal.rglob("*.started.json"))  # the attempt's record, needed by the retry
        kill_hard(worker)
        worker = spawn_worker(env, tmp_path / "w1.log")
        result = await asyncio.wait_for(handle.result(), timeout=90)
    finally:
        stop_gently(worker)
    assert result.state == "completed" and result.output == "survived"
    assert ledger_lines(ledger) == ["1", "2"]  # the interrupted command was not run twice
    assert not journal.exists() and bytes_at_rest(workspace / RESERVED / "journal") == 0
    assert result.files and result.files.startswith(JOURNAL_GONE)
    assert os.listdir(workspace / RESERVED / "journal") == []


async def test_steps_folded_past_the_archive_cap_are_said_in_the_transcript_and_by_recall(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_ARCHIVE_MAX_BYTES", "1")  # no fold fits
    caplog.set_level(logging.WARNING)
    steps = 10
    model_server.responder = Script(
        [*command_turns(steps, fact_at=2), tools(("recall", {"steps": "2"}), output_tokens=20)], final="done"
    )
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="print things",
            workspace=str(workspace),
            context={"max_context_tokens": 1_200, "keep_recent_steps": 2},
        )
        result = await handle.result()
        transcript = await handle.query("transcript", result_type=list[Message])
    assert result.state == "completed"
    archive = workspace / RESERVED / "archive" / chain_of(handle)
    assert list(archive.glob("steps-*.jsonl")) == [] and list(archive.glob("steps-*.not-archived.txt"))
    degradations = [m.content or "" for m in transcript if m.kind == "degradation"]
    said = [text for text in degradations if "without being archived" in text]
    assert said and "DURABLE_AGENT_ARCHIVE_MAX_BYTES" in said[0], said
    recalled = [r for r in model_server.requests if not is_summary_request(r)][-1]
    assert "were folded without being archived" in tool_results(recalled)[-1]
    assert any("without being archived" in r.getMessage() for r in caplog.records)


async def test_a_cap_that_is_not_a_size_stops_the_worker_with_one_line(temporal_server: EmbeddedServer) -> None:
    env = cli_env(DURABLE_AGENT_OUTPUTS_MAX_BYTES="lots")
    one_line_error(await durable_agent("worker", env=env), 2, "DURABLE_AGENT_OUTPUTS_MAX_BYTES='lots' is not a size")
