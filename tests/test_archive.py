"""The archive of folded steps and `recall` over it, on real files (no server)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from activities.archive import read_archive, recall_text, write_steps
from activities.run_files import HostileLayout
from activities.workspace import ROOTS_ENV, WorkspaceError
from tests.test_compaction import step_messages
from tests.test_sandbox import EXCHANGER
from workflows.types import ArchiveWrite, Message, RecallInput

FOLDER = ".durable-agent/archive/run-1"


def archive(workspace: Path, first: int, last: int, output: str = "ok") -> list[Message]:
    messages = [m for step in range(first, last + 1) for m in step_messages(step, 1, f"{output} {step}")]
    note = Message(role="system", content=f"Compacted ... {output}", step=last, kind="compaction")
    written = write_steps(
        ArchiveWrite(
            workspace=str(workspace), archive_dir=FOLDER, first_step=first, last_step=last, messages=[*messages, note]
        )
    )
    assert written.path == f"{FOLDER}/steps-{first:06d}-{last:06d}.jsonl" and written.messages == len(messages) + 1
    return messages


def recall(workspace: Path, **fields: object) -> str:
    request = RecallInput(workspace=str(workspace), archive_dir=FOLDER, in_context_from=21, **fields)
    outcome = recall_text(request)
    assert outcome.ok
    return outcome.output


def test_archived_steps_read_back_exactly_and_a_rewrite_is_the_same_file(tmp_path: Path) -> None:
    first = archive(tmp_path, 1, 10)
    second = archive(tmp_path, 11, 20)
    archive(tmp_path, 11, 20)  # a retried write: the same file, nothing doubled
    read = [m for m in read_archive(tmp_path / FOLDER) if m.kind != "compaction"]
    assert read == first + second


def test_recall_returns_steps_verbatim_by_range_and_by_query_but_not_the_notes(tmp_path: Path) -> None:
    messages = archive(tmp_path, 1, 10, output="needle")
    text = recall(tmp_path, first_step=3, last_step=4)
    assert text.startswith("--- step 3 ---") and "--- step 4 ---" in text and "--- step 5 ---" not in text
    for m in messages[4:8]:  # steps 3 and 4: the call and its result, exactly
        assert (m.content or m.tool_calls[0].arguments) in text
    assert "needle 7" in recall(tmp_path, query="NEEDLE 7")
    assert "Compacted" not in recall(tmp_path, query="needle")  # a note for people, never sent
    missing = recall(tmp_path, query="nowhere")
    assert "No folded step matches query 'nowhere'" in missing and "Steps from 21 on" in missing


def test_recall_stays_within_its_budget_and_says_what_it_left_out(tmp_path: Path) -> None:
    archive(tmp_path, 1, 10, output="x" * 300)
    text = recall(tmp_path, query="x", output_chars=1_000)
    shown = text.count("--- step ")
    assert 1 <= shown < 10 and f"... {10 - shown} more matching step(s) ({shown + 1}-10)" in text
    assert len(text) < 1_000 + 600  # the budget, and at most the closing line past it


def test_steps_past_the_archive_cap_are_folded_unarchived_and_recall_says_so(tmp_path: Path) -> None:
    archive(tmp_path, 1, 10)
    held = sum(p.stat().st_size for p in (tmp_path / FOLDER).glob("steps-*.jsonl"))
    messages = [m for step in range(11, 21) for m in step_messages(step, 1, f"late {step}")]
    request = ArchiveWrite(workspace=str(tmp_path), archive_dir=FOLDER, first_step=11, last_step=20, messages=messages)
    written = write_steps(request, max_bytes=held + 100)
    assert written.messages == len(messages) and written.bytes == 0 and written.path == ""
    assert written.not_archived and "steps 11-20" in written.not_archived
    assert "DURABLE_AGENT_ARCHIVE_MAX_BYTES" in written.not_archived
    assert sorted(p.name for p in (tmp_path / FOLDER).iterdir()) == [
        "chain.json",
        "steps-000001-000010.jsonl",
        "steps-000011-000020.not-archived.txt",
    ]
    text = recall_text(
        RecallInput(workspace=str(tmp_path), archive_dir=FOLDER, in_context_from=21, first_step=11, last_step=20)
    ).output
    assert "were folded without being archived" in text, text


def test_a_folder_swapped_on_the_workspace_path_never_gets_or_gives_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the journal (tests/test_sandbox.py): a run whose workspace holds this one swapping a
    folder on its path for a symlink while steps are archived and recalled writes nothing where
    it points, and `recall` reads nothing from there."""
    outer, outside = tmp_path / "outer", tmp_path / "outside"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    planted = outside / FOLDER / "steps-000000-000000.jsonl"
    planted.parent.mkdir(parents=True)
    planted.write_text(Message(role="user", content="OUTSIDE-ARCHIVE", step=0).model_dump_json() + "\n")
    (outer / "link").symlink_to(outside)
    monkeypatch.setenv(ROOTS_ENV, str(outer))  # `outside` is no workspace: only a swap could lead there
    recalled: list[str] = []
    swapper = subprocess.Popen([sys.executable, "-c", EXCHANGER, str(inner), str(outer / "link")])
    try:
        while not inner.is_symlink():  # swapping
            time.sleep(0.001)
        attempt, began = 0, time.monotonic()
        while attempt < 300 or time.monotonic() - began < 2:
            attempt += 1
            with contextlib.suppress(WorkspaceError, HostileLayout, OSError):  # the swap met a check
                archive(inner, attempt, attempt)
            with contextlib.suppress(WorkspaceError, HostileLayout, OSError):
                request = RecallInput(workspace=str(inner), archive_dir=FOLDER, in_context_from=1, query="OUTSIDE")
                recalled.append(recall_text(request).output)
    finally:
        swapper.kill()
        swapper.wait()
    assert [p.relative_to(outside) for p in outside.rglob("*") if p.is_file()] == [planted.relative_to(outside)]
    assert not [text for text in recalled if "OUTSIDE-ARCHIVE" in text]
