"""A run's opening in one local activity (`open_run`): the workspace check, step 0's snapshot
and the skills; what it could not bring, the run asks of their own activities.

Judged by effects: the snapshot store's files, the catalog, the run's history."""

from __future__ import annotations

import base64
import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.run_opening import RunOpeningActivities
from activities.skills import SkillActivities
from activities.snapshots import STORE_ENV, SnapshotActivities, Store
from activities.tools import ToolActivities
from durable_agent.model_server import ModelServer
from tests.helpers import start
from tests.scripts import Script, answer
from workflows.run_opening import OPEN_RUN_TIMEOUT, RunOpening
from workflows.skills import SkillCatalogRequest
from workflows.snapshots import SnapshotRequest

SKILL = "---\nname: greet\ndescription: says hello\n---\nSay hello.\n"


def opening_activities(roots: list[str], store: Path, snapshot_roots: list[str] | None = None) -> RunOpeningActivities:
    """Made as a worker's plugin makes it: of its check, snapshot and skills activities
    (`snapshot_roots`: the snapshot's own, where they differ from the check's)."""
    snapshots = SnapshotActivities(snapshot_roots or roots, Store(store))
    tools = ToolActivities(roots=roots, snapshots=snapshots)
    return RunOpeningActivities(tools.check_workspace, snapshots.snapshot_workspace, SkillActivities().discover_skills)


def env() -> ActivityEnvironment:
    """The local activity as the run schedules it: started now, with OPEN_RUN_TIMEOUT."""
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info, started_time=datetime.now(UTC), start_to_close_timeout=OPEN_RUN_TIMEOUT
    )
    return environment


def opening(workspace: Path) -> RunOpening:
    return RunOpening(
        workspace=str(workspace),
        snapshot=SnapshotRequest(workspace=str(workspace), step=0, chain="run-1"),
        skills=SkillCatalogRequest(workspace=str(workspace)),
    )


def with_skill(workspace: Path) -> Path:
    skill = workspace / "skills" / "greet" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(SKILL)
    return workspace


async def test_one_activity_checks_the_workspace_takes_step_0_and_lists_the_skills(tmp_path: Path) -> None:
    workspace = with_skill(tmp_path / "ws")
    store = tmp_path / "store"
    opened = await env().run(opening_activities([str(tmp_path)], store).open_run, opening(workspace))
    assert opened.snapshot is not None and opened.snapshot.step == 0
    Store(store).restore(opened.snapshot.digest, str(tmp_path / "restored"))
    assert [p.relative_to(tmp_path / "restored").as_posix() for p in (tmp_path / "restored").rglob("*.md")] == [
        "skills/greet/SKILL.md"
    ]
    assert (tmp_path / "restored" / "skills" / "greet" / "SKILL.md").read_text() == SKILL
    assert opened.skills is not None and [s.name for s in opened.skills.skills] == ["greet"]


async def test_a_refused_workspace_fails_it_before_anything_is_read(tmp_path: Path) -> None:
    outside = with_skill(tmp_path / "outside")
    store = tmp_path / "store"
    # The snapshot's roots hold the workspace: only the check's refusal, coming first, keeps it out of the store.
    activities = opening_activities([str(tmp_path / "roots")], store, snapshot_roots=[str(tmp_path)])
    with pytest.raises(ApplicationError) as refused:
        await env().run(activities.open_run, opening(outside))
    assert refused.value.type == "WorkspaceRefused" and refused.value.non_retryable
    assert not store.exists() or not any(store.rglob("*"))  # no snapshot of it was stored


async def test_a_part_it_cannot_give_is_left_out_and_the_others_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = with_skill(tmp_path / "ws")
    broken = tmp_path / "store"
    broken.write_text("a file where the store's folder should be")
    opened = await env().run(opening_activities([str(tmp_path)], broken).open_run, opening(workspace))
    assert opened.snapshot is None and opened.skills is not None and opened.skills.skills

    def fails(*_: Any) -> None:
        raise OSError("skills folder unreadable")

    monkeypatch.setattr(SkillActivities, "_catalog", fails)
    opened = await env().run(opening_activities([str(tmp_path)], tmp_path / "store2").open_run, opening(workspace))
    assert opened.snapshot is not None and opened.skills is None


@pytest.fixture
def broken_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Set before the worker fixture builds its activities: every snapshot of its runs fails."""
    store = tmp_path / "not-a-folder"
    store.write_text("")
    monkeypatch.setenv(STORE_ENV, str(store))
    return store


@pytest.mark.usefixtures("broken_store")
async def test_a_snapshot_the_opening_could_not_take_is_asked_of_snapshot_workspace(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = Script([answer("done")])
    handle = await start(client, task_queue, goal="open", workspace=str(workspace))
    assert (await handle.result()).state == "completed"  # a step without a snapshot goes on
    local = [
        json.loads(base64.b64decode(payload))["activity_type"]
        for payload in marker_data(json.loads((await handle.fetch_history()).to_json()))
    ]
    assert local[:2] == ["open_run", "snapshot_workspace"], local


def marker_data(history: dict[str, Any]) -> list[str]:
    return [
        event["markerRecordedEventAttributes"]["details"]["data"]["payloads"][0]["data"]
        for event in history["events"]
        if "data" in event.get("markerRecordedEventAttributes", {}).get("details", {})
    ]
