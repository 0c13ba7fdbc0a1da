"""Retry classification of model calls, against real HTTP errors from the stub server."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from activities.model import MAX_RETRY_AFTER, retry_after
from durable_agent.model_server import Failure, ModelServer, Reply
from tests.helpers import start, wait_for
from tests.scripts import Turn


class Sequence:
    """Replies in order, one per request, recording when each request arrived."""

    def __init__(self, *outcomes: Turn) -> None:
        self.outcomes = list(outcomes)
        self.arrivals: list[float] = []

    def __call__(self, request: dict) -> Reply | Failure:
        self.arrivals.append(time.monotonic())
        outcome = self.outcomes[min(len(self.arrivals), len(self.outcomes)) - 1]
        return outcome(request) if callable(outcome) else outcome


async def test_a_500_is_retried(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = script = Sequence(Failure(500, "boom"), Reply(content="fine"))
    result = await (await start(client, task_queue, goal="x", workspace=str(workspace))).result()
    assert result.state == "completed" and result.output == "fine"
    assert len(script.arrivals) == 2
    assert result.usage.model_calls == 1  # only the successful call is counted


async def test_a_429_waits_as_long_as_retry_after_says(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = script = Sequence(
        Failure(429, "slow down", headers={"Retry-After": "3"}), Reply(content="after the wait")
    )
    result = await (await start(client, task_queue, goal="x", workspace=str(workspace))).result()
    assert result.output == "after the wait"
    gap = script.arrivals[1] - script.arrivals[0]
    assert gap >= 3.0  # the default first retry would come after 0.5 s


@pytest.mark.parametrize(
    ("headers", "wait_s"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "3600"}, MAX_RETRY_AFTER.total_seconds()),  # hours: the run would sit "running"
        ({"retry-after": "Wed, 21 Oct 2099 07:28:00 GMT"}, MAX_RETRY_AFTER.total_seconds()),
        ({"retry-after": "inf"}, MAX_RETRY_AFTER.total_seconds()),
        ({"retry-after": "1e14"}, MAX_RETRY_AFTER.total_seconds()),  # past timedelta's range
        ({"retry-after-ms": "inf"}, MAX_RETRY_AFTER.total_seconds()),
        ({"retry-after-ms": "-5000"}, 0.0),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "nan"}, None),
        ({"retry-after-ms": "nan", "retry-after": "5"}, 5.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_honoured_within_bounds(headers: dict[str, str], wait_s: float | None) -> None:
    wait = retry_after(SimpleNamespace(headers=headers))
    assert (wait.total_seconds() if wait is not None else None) == wait_s


async def test_a_401_is_not_retried_and_the_run_needs_attention(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = script = Sequence(Failure(401, "invalid api key"), Reply(content="recovered"))
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: s.state == "needs_attention")
    assert status.attention is not None
    assert "401" in status.attention.last_error and "invalid api key" in status.attention.last_error
    assert len(script.arrivals) == 1
    await handle.execute_update("resolve", {"action": "retry", "note": "key fixed"})
    result = await handle.result()
    assert result.state == "completed" and result.output == "recovered"
    assert len(script.arrivals) == 2


async def test_missing_api_key_is_a_clear_error(
    client: Client, task_queue: str, model_server: ModelServer, workspace: Path, monkeypatch
) -> None:
    from worker import build_worker

    monkeypatch.delenv("OPENAI_API_KEY")
    async with build_worker(client, task_queue):
        handle = await start(client, task_queue, goal="x", workspace=str(workspace))
        status = await wait_for(handle, lambda s: s.state == "needs_attention")
        assert "OPENAI_API_KEY is not set" in status.attention.last_error
        await handle.execute_update("resolve", {"action": "terminate"})
        result = await handle.result()
    assert result.state == "terminated" and result.stop_reason == "terminated"
    assert not model_server.requests


async def test_a_model_call_longer_than_the_task_timeout_runs_once_and_the_run_stays_controllable(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # A call longer than the 1.5 s workflow task timeout: it is an activity of its own, so
    # no task waits on it, and signals sent meanwhile are handled. (The local-activity path
    # with task extension is only taken by histories recorded before it: test_replay.py.)
    def slow(request: dict) -> Reply:
        time.sleep(5)
        return Reply(tool_calls=[("list_files", {})])

    model_server.responder = script = Sequence(slow, Reply(content="done"))
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    await wait_for(handle, lambda s: len(script.arrivals) == 1)
    status = await wait_for(handle, lambda s: s.step == 1 and s.state == "running")
    assert "calling" in status.activity
    await handle.signal("pause", {"reason": "mid-call"})
    await handle.signal("add_message", {"text": "and one more thing"})
    await wait_for(handle, lambda s: s.state == "paused", timeout_s=30)
    assert len(script.arrivals) == 1  # the slow call finished; no second step began while paused
    await handle.signal("resume")
    result = await handle.result()
    assert result.state == "completed" and result.output == "done"
    assert len(script.arrivals) == 2  # never repeated
    assert model_server.requests[-1]["messages"][-1] == {"role": "user", "content": "and one more thing"}
