"""The reply's token cap goes under the name the model takes: `max_tokens`, or
`max_completion_tokens` (OpenAI's o-series and gpt-5), learned from the endpoint's 400 when
the name does not tell (activities/token_parameter.py).

The stub refuses the wrong name as the real API does (durable_agent/model_server.py): HTTP 400
with the API's own message.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent.model_server import ModelServer, is_judge_request, is_summary_request
from tests.helpers import start
from tests.scripts import Script, tools

CAPS = ("max_tokens", "max_completion_tokens")


def spiky_script() -> Script:
    """Steps 1-4 cost 110 tokens, step 5 2,200: the quota shrinks to 400 for the steps after."""
    cheap = tools(("list_files", {}), input_tokens=100, output_tokens=10)
    spike = tools(("list_files", {}), input_tokens=2_000, output_tokens=200)
    return Script([cheap] * 4 + [spike] + [cheap] * 2, final="done")


def caps(server: ModelServer) -> list[tuple[str, int] | None]:
    """Each step's request: the token cap it carried, by name (None: uncapped)."""
    steps = [r for r in server.requests if not (is_summary_request(r) or is_judge_request(r))]
    return [next(((name, r[name]) for name in CAPS if name in r), None) for r in steps]


async def test_a_reasoning_model_gets_max_completion_tokens_after_a_spike(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    model_server.responder = spiky_script()
    handle = await start(client, task_queue, goal="spike", workspace=str(workspace), model="o4-mini")
    result = await asyncio.wait_for(handle.result(), 120)
    assert (result.state, result.usage.model_calls) == ("completed", 8)
    # Named by the model's name: none refused (the stub answers max_tokens with a 400).
    assert caps(model_server) == [None] * 5 + [("max_completion_tokens", 400)] * 3


@pytest.mark.parametrize(
    ("refuses", "model", "first", "then"),
    [
        ("completion_tokens_only", "azure-gpt-4o-deployment", "max_tokens", "max_completion_tokens"),
        ("max_tokens_only", "openai/gpt-5-local", "max_completion_tokens", "max_tokens"),
    ],
)
async def test_a_refused_name_is_sent_again_under_the_other_and_remembered(
    client: Client,
    worker: Worker,
    task_queue: str,
    model_server: ModelServer,
    workspace: Path,
    refuses: str,
    model: str,
    first: str,
    then: str,
) -> None:
    """A model whose name misleads: a deployment of gpt-4o that wants `max_completion_tokens`,
    or a gpt-5 behind a server that predates it. Its first capped call is refused by name (the
    server's own message), sent once more under the other name, and the worker keeps that name."""
    getattr(model_server, refuses).add(model)
    model_server.responder = spiky_script()
    handle = await start(client, task_queue, goal="spike", workspace=str(workspace), model=model)
    result = await asyncio.wait_for(handle.result(), 120)
    assert (result.state, result.usage.model_calls) == ("completed", 8)
    # One refused request (step 6's first), then every capped call under the name it takes.
    assert caps(model_server) == [None] * 5 + [(first, 400)] + [(then, 400)] * 3
