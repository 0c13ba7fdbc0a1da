"""Skills: listed at the start, loaded on demand, recorded once, kept for the whole run."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from durable_agent.model_server import ModelServer, Reply
from tests.helpers import start, wait_for
from tests.scripts import Script, tool_results, tools
from worker import build_worker
from workflows.skills import MAX_SKILL_BYTES, SkillError, parse_skill
from workflows.types import AgentStatus


def write_skill(root: Path, name: str, text: str) -> Path:
    path = root / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def skill_text(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"


def test_front_matter_is_checked() -> None:
    assert parse_skill("a", skill_text("a", '"does a"', "body")).description == "does a"
    for text, problem in [
        ("no front matter", "must start with a '---' line"),
        ("---\nname: a\n", "no closing '---' line"),
        ("---\nname: a\n---\n", "missing description"),
        ("---\nname a\ndescription: x\n---\n", "line 2 is not 'key: value'"),
        (skill_text("b", "x", "body"), "front matter names 'b', but the folder is 'a'"),
    ]:
        with pytest.raises(SkillError, match=problem):
            parse_skill("a", text)


TASK_EVENTS = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
)


async def until_recorded(handle: WorkflowHandle, event: EventType.ValueType) -> None:
    """Until history holds `event` and a completed workflow task after it: a query can see a
    state whose workflow task is not committed yet (and would be redone by the next worker)."""

    async def poll() -> None:
        while True:
            types = [e.event_type for e in (await handle.fetch_history()).events]
            done = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            tasks = [t for t in types if t in TASK_EVENTS]
            if event in types and done in types[types.index(event) :] and tasks[-1] == done:
                return
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout=30)


def system_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "system"]


async def test_skills_are_listed_loaded_once_and_survive_a_restart_and_continue_as_new(
    client: Client,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = tmp_path / "shared-skills"
    release = write_skill(workspace / "skills", "release", skill_text("release", "How to cut a release", "STEP-ONE"))
    write_skill(shared, "review", skill_text("review", "How to review a change", "REVIEW-BODY"))
    write_skill(shared, "release", skill_text("release", "shadowed by the workspace's", "SHADOWED"))
    write_skill(shared, "broken", "---\nname: broken\n---\nno description\n")
    write_skill(workspace / "skills", "huge", skill_text("huge", "too big", "x" * MAX_SKILL_BYTES))
    monkeypatch.setenv("DURABLE_AGENT_SKILLS_DIR", str(shared))

    reached, go_on = threading.Event(), threading.Event()

    def gate(request: dict[str, Any]) -> Reply:
        reached.set()
        go_on.wait(30)
        return tools(("run_command", {"command": "true"}))  # a regular activity: the step ends a task

    model_server.responder = Script(
        [
            tools(("load_skill", {"name": "release"})),
            tools(
                ("load_skill", {"name": "nope"}),
                ("load_skill", {"name": "broken"}),
                ("load_skill", {"name": "huge"}),
                ("load_skill", {"name": "review"}),
            ),
            tools(("load_skill", {"name": "release"})),
            gate,
            *[tools(("list_files", {}))] * 8,
        ],
        final="released",
    )
    async with build_worker(client, task_queue):
        handle = await start(
            client,
            task_queue,
            goal="cut a release",
            workspace=str(workspace),
            continue_as_new_every=10,
            context={"max_context_tokens": 1_000, "keep_recent_steps": 2},  # compactions fold most steps
        )
        await asyncio.to_thread(reached.wait, 30)
        await handle.signal("pause", {"reason": "restart the worker"})
        go_on.set()
        await wait_for(handle, lambda s: s.state == "paused")
        await until_recorded(handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    # Edited while no worker runs: the new worker replays the load from history, not the file.
    release.write_text(skill_text("release", "How to cut a release", "EDITED"))
    async with build_worker(client, task_queue):
        await handle.signal("resume")
        result = await handle.result()
        final = await handle.query("status", result_type=AgentStatus)
    assert final.context is not None and final.context.counters.folded_steps > 0  # compaction folded steps

    assert result.state == "completed" and result.output == "released" and result.steps == 13
    first, last = model_server.requests[0], model_server.requests[-1]
    catalog = [m for m in system_messages(first) if m.startswith("Skills available")]
    assert len(catalog) == 1
    assert "- release: How to cut a release" in catalog[0] and "- review: How to review a change" in catalog[0]
    assert "broken" not in catalog[0] and "STEP-ONE" not in str(first["messages"])  # names and descriptions only
    assert {t["function"]["name"] for t in first["tools"]} >= {"load_skill"}
    errors = tool_results(model_server.requests[2])[-4:]
    assert "unknown skill 'nope'" in errors[0]
    assert "malformed front matter: missing description" in errors[1]
    assert f"over the {MAX_SKILL_BYTES:,} byte limit" in errors[2]
    assert errors[3].startswith("loaded skill 'review'")
    assert "already loaded" in tool_results(model_server.requests[3])[-1]
    # The last request (after the restart, a continue-as-new at step 10 and a compaction that
    # folded the steps that loaded them) still holds the catalog once and each loaded body
    # once, as first loaded; never the edit or the shadowed copy.
    text = str(last["messages"])
    assert sum("Skills available" in m for m in system_messages(last)) == 1
    assert text.count("STEP-ONE") == 1 and text.count("REVIEW-BODY") == 1
    assert "EDITED" not in text and "SHADOWED" not in text
    runs = [r async for r in client.list_workflows(f'WorkflowId="{handle.id}"')]
    assert len(runs) == 2  # it did continue as new
