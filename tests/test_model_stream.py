"""Streamed model replies: the same reply and usage as unstreamed ones, progress in the
heartbeat details while they come, and an unstreamed call where an endpoint cannot stream
with exact usage. Real worker, real `openai` SDK over HTTP to the scripted stub."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities import model_clients, model_stream
from activities.model import MAX_REPLY_BYTES
from activities.model_clients import CALLS_PER_CLIENT, ModelClients, sdk_http_library
from activities.model_stream import TAIL_WAIT_S, StreamedReply, StreamProgress, stream_chat_completion
from durable_agent.model_server import Failure, ModelServer, Reply
from tests.helpers import start, until, wait_for
from tests.scripts import Script, answer
from tests.test_hostile_replies import REPLY_CASES
from tests.test_model_queue import pending_model_call
from tests.test_model_retries import Sequence
from worker import build_worker
from workflows.types import AgentResult, Message

TOOLS_AND_TEXT = Reply(
    # A surrogate pair that the stub's 4-character events split in two: it must arrive whole.
    content="Writing both files \ud83d\ude00 now.",
    tool_calls=[
        ("write_file", {"path": "a.txt", "content": "alpha " * 40}),
        ("write_file", {"path": "b.txt", "content": "beta"}),
    ],
    input_tokens=321,
    output_tokens=123,
)


@pytest_asyncio.fixture(loop_scope="session")
async def unstreamed_worker(
    client: Client, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Worker, str]]:
    """A worker with `DURABLE_AGENT_MODEL_STREAM=0`, on a queue of its own."""
    monkeypatch.setenv("DURABLE_AGENT_MODEL_STREAM", "0")
    queue = "unstreamed-" + str(id(monkeypatch))
    async with build_worker(client, queue) as running:
        yield running, queue


async def run_to_end(client: Client, queue: str, workspace: Path) -> tuple[AgentResult, list[Message]]:
    handle = await start(client, queue, goal="x", workspace=str(workspace))
    result = await asyncio.wait_for(handle.result(), 60)
    return result, await handle.query("transcript", result_type=list[Message])


async def test_a_streamed_reply_is_recorded_as_the_same_reply_as_an_unstreamed_one(
    client: Client,
    worker: Worker,
    unstreamed_worker: tuple[Worker, str],
    task_queue: str,
    model_server: ModelServer,
    tmp_path: Path,
) -> None:
    model_server.responder = Script([TOOLS_AND_TEXT, answer("both written", input_tokens=400, output_tokens=7)])
    runs = {}
    for name, queue in {"streamed": task_queue, "unstreamed": unstreamed_worker[1]}.items():
        model_server.requests.clear()
        (tmp_path / name).mkdir()
        runs[name] = await run_to_end(client, queue, tmp_path / name)
        assert [bool(r.get("stream")) for r in model_server.requests] == [name == "streamed"] * 2
        assert (tmp_path / name / "a.txt").read_text() == "alpha " * 40
    (streamed, streamed_messages), (unstreamed, unstreamed_messages) = runs["streamed"], runs["unstreamed"]
    assert streamed.output == unstreamed.output == "both written"
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (721, 130)
    assert streamed.usage.model_dump(exclude={"elapsed_s"}) == unstreamed.usage.model_dump(exclude={"elapsed_s"})
    replies = [[m.content, m.tool_calls] for m in streamed_messages if m.role == "assistant"]
    assert replies == [[m.content, m.tool_calls] for m in unstreamed_messages if m.role == "assistant"]
    assert replies[0][0] == "Writing both files \U0001f600 now."
    assert [(c.id, c.name) for c in replies[0][1]] == [("call_0_0", "write_file"), ("call_0_1", "write_file")]


async def test_streamed_calls_reuse_the_workers_connection(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # The HTTP client pools a connection only once a response has ended: a stream left at
    # its end marker cost every call a new connection (a TLS handshake on a real endpoint).
    model_server.responder = Script([TOOLS_AND_TEXT] * 4, final="done")
    before = model_server.connections
    result, _ = await run_to_end(client, task_queue, workspace)
    assert result.output == "done" and result.usage.model_calls == 5
    assert all(r.get("stream") for r in model_server.requests[-5:])
    assert model_server.connections - before <= 1  # one, if the pooled one had expired


async def test_a_worker_keeps_a_connection_for_every_call_it_makes_at_once(model_server: ModelServer) -> None:
    # The SDK keeps at most 100 idle connections: a worker serving 150 agents would open 50
    # new ones (a TLS handshake each on a real endpoint) for every wave of their calls.
    model_server.responder = Script([], final="ok")
    model_server.latency_s = 0.5  # the calls of a wave overlap
    clients = ModelClients()
    request = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}

    async def streamed_call() -> None:
        async with clients.lease() as client:
            reply = StreamedReply(MAX_REPLY_BYTES)
            await stream_chat_completion(client, request, reply, StreamProgress())
        assert "".join(reply.content or []) == "ok"

    for _wave in range(3):
        await asyncio.gather(*(streamed_call() for _ in range(150)))
        await until(lambda: not model_stream._tails)  # each body read to its end, pooled
    assert model_server.connections == 150
    # Spread over clients of at most CALLS_PER_CLIENT calls each: every pool stays small.
    assert clients.clients() == math.ceil(150 / CALLS_PER_CLIENT)
    await clients.aclose()  # as a stopping worker does: every client's connections
    await until(lambda: model_server.open_connections == 0, within_s=10)


async def test_a_worker_with_few_calls_at_once_uses_one_client(model_server: ModelServer) -> None:
    model_server.responder = Script([], final="ok")
    model_server.latency_s = 0.2
    clients = ModelClients()
    request = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}

    async def call() -> None:
        async with clients.lease() as client:
            await stream_chat_completion(client, request, StreamedReply(MAX_REPLY_BYTES), StreamProgress())

    for _ in range(3):
        await asyncio.gather(*(call() for _ in range(CALLS_PER_CLIENT)))
        await until(lambda: not model_stream._tails)
    assert clients.clients() == 1
    assert model_server.connections == CALLS_PER_CLIENT
    await clients.aclose()


async def test_a_body_left_open_after_the_end_marker_does_not_hold_the_call(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # The reply is used at its end marker; the rest of the body is awaited in the background
    # for TAIL_WAIT_S, then the connection is given up. A body held to its end would hold
    # each call 60 s; the bound leaves a loaded machine 45 s for the two-step run.
    model_server.stream_end_delay_s = 60
    model_server.responder = Script([TOOLS_AND_TEXT], final="done")
    result, _ = await asyncio.wait_for(run_to_end(client, task_queue, workspace), 45)
    assert result.output == "done" and result.usage.model_calls == 2
    assert (workspace / "b.txt").read_text() == "beta"
    assert model_server.connections == 2  # neither body ended, so neither connection was reused
    await until(lambda: not model_stream._tails, within_s=TAIL_WAIT_S + 5)


async def test_the_pending_call_shows_the_chunks_received_so_far(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # 200 events of 4 characters: about 16 s, past the first few beats (one every ~3.3 s).
    model_server.stream_interval_s = 0.08
    model_server.responder = Script([], final="word " * 160)
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    seen: list[dict[str, Any]] = []
    while len({d["chunks_received"] for d in seen}) < 3:
        pending = await pending_model_call(handle)
        assert pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED and pending.attempt == 1
        [details] = await DataConverter.default.decode(pending.heartbeat_details.payloads)
        if "chunks_received" in details:
            seen.append(details)
        await asyncio.sleep(0.2)
    counts = [d["chunks_received"] for d in seen]
    assert counts == sorted(counts) and counts[-1] < 200, counts
    last = seen[-1]
    assert last["phase"] == "receiving the reply" and last["characters_received"] == 4 * (last["chunks_received"])
    assert last["receiving_for_s"] > 0
    assert "text" not in last  # nobody follows the run: counts only, no live view
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == "word " * 160 and len(model_server.requests) == 1


async def test_a_followed_run_beats_with_its_reply_so_far_redacted(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # "test-key" is OPENAI_API_KEY's value (the model_server fixture): a secret of the worker.
    model_server.stream_interval_s = 0.08
    model_server.responder = Script([], final="test-key " + "word " * 160)
    handle = await start(client, task_queue, start_signal="watch", goal="x", workspace=str(workspace))
    texts: list[str] = []
    while len(texts) < 3:
        pending = await pending_model_call(handle)
        [details] = await DataConverter.default.decode(pending.heartbeat_details.payloads)
        if details.get("text") and details["text"] not in texts:
            texts.append(details["text"])
        await asyncio.sleep(0.2)
    assert all(t.startswith("[REDACTED:OPENAI_API_KEY] ") for t in texts), texts
    assert all(t.endswith(" ") for t in texts), texts  # whole words only: never part of a secret
    assert len(texts[-1]) > len(texts[0])  # it grows as the reply comes: more than one beat
    assert (await asyncio.wait_for(handle.result(), 60)).output.startswith("[REDACTED:OPENAI_API_KEY] word")


def refuses_streaming(reply: Reply):
    def respond(request: dict[str, Any]) -> Reply | Failure:
        if request.get("stream"):
            return Failure(400, "stream_options: streaming is not supported by this server")
        return reply

    return respond


@pytest.mark.parametrize("endpoint", ["ignores stream_options", "refuses streaming"])
async def test_an_endpoint_that_cannot_stream_with_usage_gets_unstreamed_calls_with_exact_usage(
    endpoint: str, client: Client, worker: Worker, task_queue: str, model_server: ModelServer, tmp_path: Path
) -> None:
    first, last = TOOLS_AND_TEXT, answer("both written", input_tokens=400, output_tokens=7)
    if endpoint == "ignores stream_options":
        model_server.stream_usage = False
        model_server.responder = Script([first, last])
    else:
        model_server.responder = Script([refuses_streaming(first), refuses_streaming(last)])
    for run in ("first", "second"):  # the worker remembers: the second run never streams
        model_server.requests.clear()
        (tmp_path / run).mkdir()
        result, _ = await run_to_end(client, task_queue, tmp_path / run)
        assert result.output == "both written"
        assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.model_calls) == (721, 130, 2)
        streamed = [bool(r.get("stream")) for r in model_server.requests]
        assert streamed == ([True, False, False] if run == "first" else [False, False])


async def test_a_whole_reply_to_a_streamed_request_is_taken_as_it_is(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    # Some servers ignore `"stream": true` and answer with a whole completion: asking again
    # (or unstreamed) would pay for the same reply twice.
    model_server.streams = False
    model_server.responder = Script([TOOLS_AND_TEXT, answer("both written", input_tokens=400, output_tokens=7)])
    result, _ = await run_to_end(client, task_queue, workspace)
    assert result.output == "both written" and (workspace / "b.txt").read_text() == "beta"
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.model_calls) == (721, 130, 2)
    assert [bool(r.get("stream")) for r in model_server.requests] == [True, True]


async def test_a_stream_cut_mid_reply_is_retried(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    whole = answer("a reply that arrives whole the second time", input_tokens=50, output_tokens=10)
    cut = Reply(content=whole.content, input_tokens=50, output_tokens=10, cut_after_chunks=4)
    model_server.responder = script = Sequence(cut, whole)
    # The second attempt streams for ~7 s, past its first beat (~3.3 s in): watch it pending.
    model_server.stream_interval_s = 0.5
    handle = await start(client, task_queue, goal="x", workspace=str(workspace))
    pending = await pending_model_call(handle)
    while pending.attempt < 2:
        pending = await pending_model_call(handle)
    # The Web UI's "Last Failure": the reason itself, not the server's "Failure exceeds size limit."
    assert pending.last_failure.message.startswith("the model's streamed reply broke off after 3 chunks")
    assert pending.last_failure.application_failure_info.type == "ModelStreamBroken"
    # Half the server's 4 KiB, wherever the project is installed (durable_agent/failures.py).
    assert pending.last_failure.ByteSize() < 2 * 1024
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == whole.content and len(script.arrivals) == 2
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.model_calls) == (50, 10, 1)


@pytest.mark.parametrize("case", list(REPLY_CASES))
async def test_a_broken_reply_unstreamed_needs_attention_after_one_call(
    case: str,
    client: Client,
    unstreamed_worker: tuple[Worker, str],
    model_server: ModelServer,
    workspace: Path,
) -> None:
    """test_hostile_replies checks these replies streamed (the default); here unstreamed."""
    reply, said = REPLY_CASES[case]
    model_server.responder = lambda request: reply
    handle = await start(client, unstreamed_worker[1], goal="x", workspace=str(workspace))
    status = await wait_for(handle, lambda s: s.state == "needs_attention")
    assert status.attention is not None and said in status.attention.last_error, status.attention
    assert [bool(r.get("stream")) for r in model_server.requests] == [False]
    await handle.execute_update("resolve", {"action": "terminate"})
    await handle.result()
    assert len(model_server.requests) == 1


def test_a_tool_calls_name_counts_towards_the_cap_on_a_reply() -> None:
    # A name or id is kept whole: unmetered, a stream of 4 MB names filled the worker's memory.
    reply = StreamedReply(max_characters=1_000)
    chunk = {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "n" * 2_000}}]}}]}
    with pytest.raises(ApplicationError, match="over 1,000 bytes") as raised:
        reply.add(chunk)
    assert raised.value.non_retryable


def test_a_chunk_with_a_null_error_field_is_not_an_error() -> None:
    reply = StreamedReply(max_characters=1_000)
    assert reply.add({"error": None, "choices": [{"delta": {"content": "fine"}}]}) == 4


@pytest.mark.parametrize(
    "data",
    [
        '{"choices": [{"delta": {}, "finish_reason": 7}]}',  # not text
        "[" * 200_000 + "]" * 200_000,  # deeper than the JSON parser goes
    ],
    ids=["finish_reason 7", "nested 200,000 deep"],
)
def test_a_malformed_chunk_is_a_bad_reply_not_a_retry(data: str) -> None:
    # Retrying would pay for another reply like it: a person decides.
    with pytest.raises(ApplicationError) as raised:
        model_stream._event(data, StreamedReply(max_characters=1_000), StreamProgress())
    assert raised.value.non_retryable and raised.value.type == "BadModelResponse"


class WholeReply:
    """The SDK's raw response to a streamed request that a server answered with one JSON body."""

    def __init__(self, *pieces: bytes | Exception) -> None:
        self.http_response = sdk_http_library().Response(200, headers={"content-type": "Application/JSON"})
        self.pieces = pieces
        self.closed = False

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            if isinstance(piece, Exception):
                raise piece
            yield piece

    async def close(self) -> None:
        self.closed = True


class AnsweredWith:
    def __init__(self, response: WholeReply) -> None:
        self.response = response

    async def post(self, *args: Any, **kwargs: Any) -> WholeReply:
        return self.response


async def take_whole(*pieces: bytes | Exception) -> StreamedReply:
    reply = StreamedReply(MAX_REPLY_BYTES)
    response = WholeReply(*pieces)
    await stream_chat_completion(AnsweredWith(response), {}, reply, StreamProgress())  # type: ignore[arg-type]
    assert response.closed
    return reply


async def test_a_whole_reply_keeps_its_tool_calls_apart_and_may_lack_usage() -> None:
    calls = [{"function": {"name": "read_file", "arguments": json.dumps({"path": p})}} for p in "ab"]
    body = {"choices": [{"message": {"role": "assistant", "tool_calls": calls}, "finish_reason": "tool_calls"}]}
    reply = await take_whole(json.dumps(body).encode())
    assert [(name, arguments) for _, name, arguments in reply.tool_calls()] == [
        ("read_file", '{"path": "a"}'),
        ("read_file", '{"path": "b"}'),
    ]
    assert reply.done and reply.usage == {}  # estimated, as an unstreamed reply without usage is


async def test_a_whole_reply_with_no_choices_or_cut_short_is_an_error_like_any_other() -> None:
    with pytest.raises(ApplicationError, match="no choices") as raised:
        await take_whole(json.dumps({"choices": [], "usage": {"prompt_tokens": 1}}).encode())
    assert raised.value.type == "BadModelResponse"
    cut = sdk_http_library().RemoteProtocolError("peer closed connection without sending complete message body")
    with pytest.raises(ApplicationError, match="broke off") as raised:
        await take_whole(b'{"choices": [', cut)
    assert raised.value.type == "ModelStreamBroken" and raised.value.__cause__ is None  # no library stack traces


async def test_a_new_workers_first_wave_of_calls_makes_one_client(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each made its own before: 300 clients and TLS contexts, 5 s in the thread pool.
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    made: list[object] = []
    real = model_clients.new_openai_client
    monkeypatch.setattr(model_clients, "new_openai_client", lambda tls=None: made.append(tls) or real(tls))
    clients = ModelClients()

    async def call() -> None:
        async with clients.lease():
            await asyncio.sleep(0.05)

    await asyncio.gather(*(call() for _ in range(CALLS_PER_CLIENT)))
    assert len(made) == 1 and clients.clients() == 1
    await clients.aclose()


def test_the_live_text_holds_back_a_word_still_arriving() -> None:
    reply = StreamedReply(10_000)
    reply.add({"choices": [{"delta": {"content": "the key is sk-proj-AB"}}]})
    assert reply.live_view()["text"] == "the key is "  # "sk-proj-AB" may be the start of a secret
    reply.add({"choices": [{"delta": {"content": "CD done\n"}}]})
    assert reply.live_view()["text"] == "the key is sk-proj-ABCD done\n"
    long = StreamedReply(100_000)
    long.add({"choices": [{"delta": {"content": "abc " * 2_000}}]})
    view = long.live_view()
    assert view["text"].startswith("abc ") and view["text_offset"] % 4 == 0  # the window starts at a word


def test_a_followed_reply_has_news_when_a_line_ends_or_a_tool_call_begins() -> None:
    progress = StreamProgress()
    progress.reply = StreamedReply(10_000)
    progress.received(1)
    progress.reply.add({"choices": [{"delta": {"content": "I will read "}}]})
    assert not progress.news()  # no whole line yet: a follower would show nothing new
    progress.reply.add({"choices": [{"delta": {"content": "it.\nThen"}}]})
    assert progress.news()
    assert progress.details()["text"] == "I will read it.\n" and not progress.news()  # sent
    progress.reply.add({"choices": [{"delta": {"content": " fix"}}]})
    assert not progress.news()
    call = {"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": ""}}
    progress.reply.add({"choices": [{"delta": {"tool_calls": [call]}}]})
    assert progress.news()  # the text is over and a tool is asked for
    progress.details()
    progress.reply.add({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]})
    assert not progress.news()  # arguments are not shown


async def test_a_followed_reply_that_ends_no_line_beats_at_the_usual_pace(
    client: Client, worker: Worker, task_queue: str, model_server: ModelServer, workspace: Path
) -> None:
    """A beat a second while nothing a follower shows has changed only cost the server a
    heartbeat each (`python -m bench live`): the first beat comes at the usual pace, a third
    of the heartbeat timeout (~3.3 s), not after a second."""
    model_server.stream_interval_s = 0.03  # 200 events of 4 characters: about 6 s
    model_server.responder = Script([], final="word " * 160)
    handle = await start(client, task_queue, start_signal="watch", goal="x", workspace=str(workspace))
    pending = await pending_model_call(handle)
    [details] = await DataConverter.default.decode(pending.heartbeat_details.payloads)
    assert details.get("receiving_for_s", math.inf) >= 2.5, details  # the live pace would have beaten at ~1 s
    assert (await asyncio.wait_for(handle.result(), 60)).output == "word " * 160


class _ArrivingBody:
    """A response body whose `pieces` arrive `gap_s` apart and are each read at once once
    they have arrived; every `slow_every`-th read first blocks for `read_s`, as a read does
    on a busy worker whose other threads hold the GIL. Counts the reads that waited for a
    piece to arrive."""

    def __init__(self, pieces: list[bytes], gap_s: float, read_s: float = 0.0, slow_every: int = 1) -> None:
        self.pieces, self.gap_s, self.read_s, self.slow_every = pieces, gap_s, read_s, slow_every
        self.waits = 0

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        started = time.monotonic()
        for i, piece in enumerate(self.pieces):
            if i % self.slow_every == 0:
                time.sleep(self.read_s)
            arrives = started + i * self.gap_s
            if time.monotonic() < arrives:
                self.waits += 1
                await asyncio.sleep(arrives - time.monotonic())
            yield piece


def _events(count: int) -> list[bytes]:
    return [b'data: {"choices": [{"delta": {"content": "abcd"}}]}\n\n'] * count + [b"data: [DONE]\n\n"]


async def test_a_trickling_reply_is_read_in_batches() -> None:
    """Each wake-up of the event loop for one event costs more CPU than parsing it
    (`python -m bench stream --interval-ms 2`): events that trickle in gather between reads."""
    body = _ArrivingBody(_events(20), gap_s=0.02)
    reply = StreamedReply(10_000)
    await model_stream._read_events(body, reply, StreamProgress())
    assert reply.done and "".join(reply.content or ()) == "abcd" * 20
    assert body.waits <= 10, body.waits  # one read per event would wait 20 times


async def test_a_reply_already_arrived_is_read_without_pauses_on_a_busy_worker() -> None:
    """Reads of what has arrived that are slow because other threads hold the GIL are not
    taken for a trickle: each would pause the read of a reply that has already arrived."""
    body = _ArrivingBody(_events(40), gap_s=0.0, read_s=0.005, slow_every=4)
    reply = StreamedReply(10_000)
    started = time.monotonic()
    await model_stream._read_events(body, reply, StreamProgress())
    assert reply.done and time.monotonic() - started < 0.6  # paced after each slow read, it took ~2 s
