"""Determinism guard: recorded histories replay against the current workflow code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from durable_agent.connection import data_converter
from durable_agent.model_server import ModelServer
from tests.record_history import DELEGATE_FILES, HISTORY_FILE, WORKFLOW_IDS, record, record_delegate
from workflows.agent import AgentWorkflow


def replayer() -> Replayer:
    # Sandboxed on purpose: the worker runs workflows unsandboxed for speed (worker.py), so
    # this replay is where a clock, random or I/O call in workflow code gets caught.
    return Replayer(
        workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=SandboxedWorkflowRunner()
    )


async def replay_failure(history: WorkflowHistory) -> Exception | None:
    # Not raised: the replay's failure is returned, so asserting it is None can fail.
    return (await replayer().replay_workflow(history, raise_on_replay_failure=False)).replay_failure


@pytest.mark.parametrize("path", sorted(HISTORY_FILE.parent.glob("*.json")), ids=lambda p: p.stem)
async def test_committed_histories_replay(path: Path) -> None:
    # agent_run.json is today's scenario; agent_run_local_model_call.json was recorded
    # while call_model was a local activity (and the file tools regular ones);
    # agent_run_compaction.json has compactions, recall and the archive written at the end;
    # agent_run_files.json has per-run journal folders and `clean_up_run` at the close;
    # agent_run_done.json has the plan tool, a quota shrunk by a spike, the skip rung and a
    # check command that fails once (`python -m tests.record_history --done`);
    # agent_run_host_move.json, a run pinned to a host that waited for it and moved (tests/test_hosts.py);
    # agent_run_host_local.json, the same on baseline-5: local tries run on its host and refused
    # elsewhere, calls on the host's queue that reset stickiness, the host probe;
    # agent_run_time_cap_outage.json waits out a model endpoint outage (wait_for_model_endpoint)
    # and is stopped by its time cap mid-command (the timer, the command cancelled);
    # agent_run_wait_limit.json is paused until a lowered max_wait_s stops it (baseline-3);
    # agent_run_snapshot_with_tools.json takes steps' snapshots in their last calls (baseline-6);
    # agent_run_file_calls_with_command.json runs a step's file calls inside its command's
    # activity (baseline-7, `python -m tests.record_history --riding`); agent_run_open_run.json
    # opens with one `open_run`: the check, step 0's snapshot and a skill (baseline-8, `--opening`);
    # agent_run_cap_then_wait.json, recorded before `cap-fired-first` on a loaded machine: its
    # 4 s cap fired with the model call's failure, and it went on to wait for a person (a 7-day
    # max_wait_s timer) where a run on this code stops (docs/limits.md).
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    assert await replay_failure(history) is None


async def test_a_history_the_code_did_not_write_fails_to_replay() -> None:
    history = WorkflowHistory.from_json("agent-run", HISTORY_FILE.read_text())
    scheduled = next(e for e in history.events if e.HasField("activity_task_scheduled_event_attributes"))
    scheduled.activity_task_scheduled_event_attributes.activity_type.name = "not_a_tool"
    assert await replay_failure(history) is not None


async def test_committed_delegate_histories_replay() -> None:
    ids = json.loads(WORKFLOW_IDS.read_text())
    for path in DELEGATE_FILES:
        history = WorkflowHistory.from_json(ids[path.name], path.read_text())
        assert await replay_failure(history) is None, path.name


async def test_a_fresh_delegate_run_replays(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    parent, child = await record_delegate(client, task_queue, workspace, model_server)
    kinds = {e.WhichOneof("attributes") for e in parent.events}
    for kind in (
        "start_child_workflow_execution_initiated_event_attributes",
        "child_workflow_execution_completed_event_attributes",
        "signal_external_workflow_execution_initiated_event_attributes",  # pause, resume forwarded
        "workflow_execution_signaled_event_attributes",  # the delegates' reports
    ):
        assert kind in kinds
    assert "signal_external_workflow_execution_initiated_event_attributes" in {
        e.WhichOneof("attributes") for e in child.events
    }
    for history in (parent, child):
        assert await replay_failure(history) is None


async def test_a_fresh_history_of_every_command_kind_replays(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    history = await record(client, task_queue, workspace, model_server)
    kinds = {e.WhichOneof("attributes") for e in history.events}
    for kind in (
        "workflow_execution_signaled_event_attributes",
        "workflow_execution_update_accepted_event_attributes",
        "upsert_workflow_search_attributes_event_attributes",
        "marker_recorded_event_attributes",  # the file tools (local activities) and patches
        "activity_task_failed_event_attributes",  # call_model: the endpoint's failure
    ):
        assert kind in kinds
    assert await replay_failure(history) is None
