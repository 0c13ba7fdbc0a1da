"""The live view's short path: a follower on the worker's machine reads the reply from the
worker that streams it (activities/live_replies.py, durable_agent/live_source.py), so the
call beats at the usual pace; a follower elsewhere reads it from the heartbeats, beaten
within a second of each new line. Real worker, real `openai` SDK against the scripted stub,
real Unix socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import DataConverter
from temporalio.worker import Worker

from activities.host import machine_tag
from activities.live_replies import LiveReplies, live_socket_path
from durable_agent.follow import POLL_S, LiveReply
from durable_agent.live_source import LiveSource
from durable_agent.model_server import ModelServer, Reply
from tests.helpers import start
from tests.scripts import Script
from tests.test_model_retries import Sequence

LINES = [f"line {n:02} of a reply" for n in range(1, 41)]
"""840 characters in 4-character events, 0.03 s apart: ~6 s, a line ending every ~0.15 s."""


async def follow_live(handle: WorkflowHandle, source: LiveSource) -> list[str]:
    """What `durable-agent run` prints of the reply while it streams (durable_agent/follow.py)."""
    live, shown = LiveReply(), []
    ending = asyncio.ensure_future(handle.result())
    while not ending.done():
        found = await source.reply()
        shown += live.lines(1, *found) if found else []
        await asyncio.wait({ending}, timeout=POLL_S)
    source.close()
    return shown


async def heartbeats(handle: WorkflowHandle, seen: list[dict[str, Any]]) -> None:
    """Every heartbeat of the run's model call that a poll every 0.1 s sees, until cancelled."""
    while True:
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name == "call_model" and pending.heartbeat_details.payloads:
                [details] = await DataConverter.default.decode(pending.heartbeat_details.payloads)
                if details.get("chunks_received") and details not in seen:
                    seen.append(details)
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("where", ["on the worker's machine", "elsewhere"])
async def test_a_follower_sees_each_line_while_the_reply_streams(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path, where: str
) -> None:
    # "test-key" is OPENAI_API_KEY's value (the model_server fixture): a secret of the worker.
    text = "test-key " + "\n".join(LINES) + "\n"
    model_server.stream_interval_s = 0.03
    model_server.responder = Script([], final=text)
    handle = await start(client, task_queue, start_signal="watch", goal="x", workspace=str(workspace))
    beats: list[dict[str, Any]] = []
    beating = asyncio.create_task(heartbeats(handle, beats))
    local = where == "on the worker's machine"
    try:
        shown = await asyncio.wait_for(follow_live(handle, LiveSource(handle, local=local)), 60)
    finally:
        beating.cancel()
    lines = [line.removeprefix("step 1 … ") for line in shown]
    assert lines[0] == "[REDACTED:OPENAI_API_KEY] line 01 of a reply", shown  # redacted on either path
    assert lines[1:] == LINES[1 : len(lines)], shown  # in order, each once
    assert len(lines) >= 10, shown  # shown while it came: more than the last beat's window
    receiving_s = max(b["receiving_for_s"] for b in beats) if beats else 0.0
    if local:
        # Asked directly, the worker beats at the usual pace (every ~3.3 s), not at each second.
        assert len(beats) <= receiving_s / 3 + 1, beats
    else:
        assert len(beats) >= max(3, receiving_s / 2), beats  # the live pace: a beat a second
    assert (await handle.result()).output == text.replace("test-key", "[REDACTED:OPENAI_API_KEY]")


async def test_a_retried_calls_reply_starts_over_for_a_follower_that_asks_the_worker(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    text = "".join(f"take {n}\n" for n in range(1, 9))  # lines of 7 characters: one every two events
    model_server.responder = Sequence(Reply(content=text, cut_after_chunks=10), Reply(content=text))
    model_server.stream_interval_s = 0.3
    handle = await start(client, task_queue, start_signal="watch", goal="x", workspace=str(workspace))
    shown = await asyncio.wait_for(follow_live(handle, LiveSource(handle)), 90)
    restart = shown.index("step 1 … attempt 2: the model's reply starts over")
    first, second = shown[:restart], shown[restart + 1 :]
    assert first and first == [f"step 1 … take {n}" for n in range(1, len(first) + 1)], shown
    assert second == [f"step 1 … take {n}" for n in range(1, len(second) + 1)], shown
    assert second and (await handle.result()).output == text


async def test_a_worker_removes_the_sockets_of_dead_workers_of_its_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    # A short folder: pytest's tmp_path can make a socket path longer than AF_UNIX's 107 bytes.
    runtime = Path(tempfile.mkdtemp(prefix="dal-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    tag = machine_tag()
    assert tag is not None
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = live_socket_path(dead.pid, tag)
    other_machine = live_socket_path(dead.pid, "elsewhere")
    assert left is not None and other_machine is not None
    left.touch()
    other_machine.touch()
    replies = LiveReplies()
    await replies.start()
    mine = live_socket_path(os.getpid(), tag)
    assert mine is not None and mine.is_socket()  # served
    assert not left.exists() and other_machine.exists()  # another pid namespace's is not ours to judge
    shutil.rmtree(runtime, ignore_errors=True)
