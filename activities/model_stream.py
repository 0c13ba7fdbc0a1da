"""A streamed chat completion, read chunk by chunk so that its progress shows while it comes.

The request asks for `"stream": true` and the usage in a last chunk. The `openai` SDK's
client sends it (auth, timeouts, its error types for HTTP errors); the body is read as raw
bytes and each server-sent event's `data:` line is parsed with `json.loads`, not with the
SDK's pydantic chunk models: this runs for every chunk of every reply of a fleet. The
pieces are assembled the way the API defines them: content fragments in order, tool calls
by `index` (id and name from their first delta, argument fragments in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from temporalio.exceptions import ApplicationError

from activities.model_clients import http_library

if TYPE_CHECKING:
    from openai import AsyncOpenAI

log = logging.getLogger(__name__)

STREAM_OPTIONS = {"include_usage": True}
READ_PACE_S = 0.2
"""A reply that trickles in is read at most this often: between two reads its events gather
in the socket's buffer and are then taken together. Each wake-up of the worker's event loop
for one event cost ~0.2 ms of CPU (`python -m bench stream --interval-ms 2`), over ten times
the parsing of the event. The end of a reply is seen at most this much later."""
NETWORK_WAIT_S = 0.001
"""A piece that took longer than this may have come off the network, not from what was
buffered. One such read is not enough to tell: on a busy worker a read of what has already
arrived waits one or two switch intervals (5 ms each) for the GIL, about once in every 5 ms
of the reader's work. Two in a row are a reply that trickles in."""
MAX_LINE_BYTES = 8 * 1024 * 1024
"""One event's line: a whole reply in one chunk fits (escaped JSON of the largest reply a
step may record), an endless line does not."""
TAIL_WAIT_S = 1.0
"""After the end marker, how long the body's rest is read, in the background, so that the
connection can be reused (`_close_after_tail`). A server sends the end of its body right
after the marker; one that does not loses its connection."""
TAIL_MAX_BYTES = 64 * 1024
"""After the end marker, how much of the body's rest is read before the connection is given up."""


LIVE_TEXT_CHARS = 4000
"""How much of the reply's text a heartbeat carries: a follower that polls every second or
so sees every line of a model writing at any human-readable speed."""


class StreamProgress:
    """What has arrived so far, for the heartbeat details. Chunks are the server's events
    with text or tool-call arguments in them: one per token on OpenAI and vLLM, but a server
    may put several tokens in one, so the count is of chunks, not tokens."""

    def __init__(self) -> None:
        self.requested_at = time.monotonic()
        self.first_chunk_at: float | None = None
        self.chunks = 0
        self.characters = 0
        self.reply: StreamedReply | None = None
        """The reply being assembled: its text so far goes in the details, for the live view."""
        self._sent_mark: tuple[int, int] = (0, 0)
        """The reply's `news_mark` when details last went out."""

    def received(self, characters: int) -> None:
        if self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
        self.chunks += 1
        self.characters += characters

    @property
    def receiving(self) -> bool:
        return self.first_chunk_at is not None

    def news(self) -> bool:
        """Whether a follower would show something the last details did not carry: a line
        of text ended, or a tool call was asked for. Beats in between would cost the server
        a heartbeat each (its largest share of the live view's cost) and show nothing: a
        follower prints whole lines (durable_agent/follow.py, LiveReply)."""
        return self.reply is not None and self.reply.news_mark() != self._sent_mark

    def details(self, sent: bool = True) -> dict[str, Any]:
        """`sent`: the details go out in a heartbeat (not to a follower that asked the worker)."""
        if self.first_chunk_at is None:
            return {}
        details: dict[str, Any] = {
            "phase": "receiving the reply",
            "chunks_received": self.chunks,
            "characters_received": self.characters,
            "first_chunk_after_s": round(self.first_chunk_at - self.requested_at, 1),
            "receiving_for_s": round(time.monotonic() - self.first_chunk_at, 1),
        }
        if self.reply is not None:
            if sent:
                self._sent_mark = self.reply.news_mark()
            details.update(self.reply.live_view())
        return details


class StreamedReply:
    """The reply as assembled from its chunks; `usage` is None until a chunk carries it."""

    def __init__(self, max_characters: int) -> None:
        self.max_characters = max_characters
        self.characters = 0
        self.content: list[str] | None = None
        self.calls: dict[int, list[Any]] = {}
        """index -> [id, name, argument fragments]"""
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        """The server sent `data: [DONE]`."""
        self._text_chars = 0
        self._lines_end = 0
        """Characters of text up to the end of its last complete line."""

    def add(self, chunk: Any) -> int:
        """Takes one decoded chunk; returns how many characters of reply it held."""
        try:
            added = self._add(chunk)
        except (AttributeError, TypeError, ValueError) as e:
            raise bad_reply(f"the model endpoint streamed a malformed chunk ({e}): {str(chunk)[:200]}") from None
        self.characters += added
        if self.characters > self.max_characters:
            raise bad_reply(
                f"the model's reply is over {self.max_characters:,} bytes, the most a step may record "
                "(reading stopped there); ask for a shorter reply (add a message), then retry"
            )
        return added

    def live_view(self) -> dict[str, Any]:
        """The reply so far, for `run` and `watch`: the text's last LIVE_TEXT_CHARS characters
        (and how many came before them) and the names of the tools asked for.

        Only whole words go out: redaction (on the heartbeat) matches whole secret values, so
        a word still arriving, or one the window's start cuts, could show part of a secret.
        The text ends at its last whitespace until the model moves on to tool calls."""
        text = "".join(self.content or ())
        if not self.calls:
            text = text[: _after_last_space(text)]
        start = max(0, len(text) - LIVE_TEXT_CHARS)
        if start:
            start = min(len(text), start + _after_last_space(text[start : start + 200]))
        return {
            "text": text[start:],
            "text_offset": start,
            "tool_calls": [call[1] for _, call in sorted(self.calls.items()) if call[1]],
        }

    def news_mark(self) -> tuple[int, int]:
        """What a follower can show of the reply: its text's complete lines (all of it once
        tool calls begin) and how many tool calls it asks for."""
        return (self._text_chars if self.calls else self._lines_end), len(self.calls)

    def tool_calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments) in index order."""
        return [(c[0], c[1], "".join(c[2])) for _, c in sorted(self.calls.items())]

    def _add(self, chunk: dict[str, Any]) -> int:
        if chunk.get("error") is not None:
            # A server that fails after it has started answering (OpenAI does) says so in an event.
            detail = str(chunk["error"])[:300]
            raise ApplicationError(f"the model endpoint failed mid-reply: {detail}", type="ModelStreamError")
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            if not isinstance(self.usage, dict):
                raise TypeError(f"usage is a {type(self.usage).__name__}")
        added = 0
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if (finish := choice.get("finish_reason")) is not None:
                self.finish_reason = _string(finish)
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text is not None:
                self.content = self.content or []
                self.content.append(_string(text))
                added += len(text)
                self._text_chars += len(text)
                if "\n" in text:
                    self._lines_end = self._text_chars - (len(text) - text.rindex("\n") - 1)
            for call in delta.get("tool_calls") or ():
                added += self._add_call(call)
        return added

    def _add_call(self, delta: dict[str, Any]) -> int:
        index = delta.get("index")
        if not isinstance(index, int):  # some servers leave it out: a new id starts a new call
            index = len(self.calls) - (0 if delta.get("id") or not self.calls else 1)
        call = self.calls.setdefault(index, ["", "", []])
        function = delta.get("function") or {}
        # Id and name count towards the cap as they are kept: a name may be as long as the reply.
        kept = 0
        if not call[0]:
            call[0] = _string(delta.get("id") or "")
            kept += len(call[0])
        if not call[1]:
            call[1] = _string(function.get("name") or "")
            kept += len(call[1])
        arguments = _string(function.get("arguments") or "")
        if arguments:
            call[2].append(arguments)
        return kept + len(arguments)


async def stream_chat_completion(
    client: AsyncOpenAI, request: dict[str, Any], reply: StreamedReply, progress: StreamProgress
) -> None:
    """POST the request with streaming on and read its events into `reply`, stopping early
    when the reply grows over its cap. A connection that breaks mid-way is retryable."""
    response = await client.post(
        "/chat/completions",
        body={**request, "stream": True, "stream_options": STREAM_OPTIONS},
        cast_to=object,
        options={"headers": {"X-Stainless-Raw-Response": "stream"}},
    )
    http = http_library(type(response.http_response))
    whole = response.http_response.headers.get("content-type", "").lower().startswith("application/json")
    rest = None
    try:
        if whole:  # the server ignored `"stream": true`
            await _take_whole_reply(response, reply, progress)
        else:
            rest = await _read_events(response, reply, progress)
    except http.TransportError as e:
        raise ApplicationError(
            f"the model's streamed reply broke off after {progress.chunks} chunks: {e!r}", type="ModelStreamBroken"
        ) from None  # see activities/model.py, _endpoint_errors
    finally:
        if rest is None:
            await response.close()
    if rest is not None:
        _close_after_tail(response, rest)


async def _read_events(
    response: Any, reply: StreamedReply, progress: StreamProgress
) -> AsyncGenerator[bytes, None] | None:
    """Reads the events into `reply`; the rest of the body, unread, if it stopped at the end marker."""
    pieces = response.iter_bytes()  # an async generator: the tail task closes it
    pending = bytearray()
    last_pause = 0.0
    waited_before = False
    while True:
        asked = time.monotonic()
        data = await anext(pieces, None)
        if data is None:
            break
        if _take(data, pending, reply, progress):
            return pieces
        got = time.monotonic()
        waited = got - asked > NETWORK_WAIT_S
        if waited and waited_before:
            if got - last_pause < READ_PACE_S:
                await asyncio.sleep(READ_PACE_S - (got - last_pause))
            last_pause = time.monotonic()
            waited_before = False  # the pause gathered what came: the next read starts a new count
        else:
            waited_before = waited
    tail = pending.decode(errors="replace")
    if tail.startswith("data:"):
        _event(tail[5:], reply, progress)
    return None


async def _take_whole_reply(response: Any, reply: StreamedReply, progress: StreamProgress) -> None:
    """A whole completion where events were asked for: taken as one event whose delta is the
    message (its reply and usage are as good, and asking again would cost another call)."""
    body = bytearray()
    async for data in response.iter_bytes():  # the caller closes the response
        body += data
        if len(body) > MAX_LINE_BYTES:
            raise bad_reply(f"the model endpoint sent a reply over {MAX_LINE_BYTES:,} bytes")
    try:
        completion = _decode_json(body.decode(errors="replace"))
        chunk = {**completion, "choices": [_as_delta(c) for c in completion.get("choices") or ()]}
    except (ValueError, RecursionError, AttributeError, TypeError):
        raise bad_reply(f"the model endpoint's reply is not a chat completion: {bytes(body[:200])!r}") from None
    if not chunk["choices"]:
        raise ApplicationError("model response has no choices", type="BadModelResponse")  # as an unstreamed one
    characters = reply.add(chunk)
    if characters:
        progress.received(characters)
    reply.done = True
    reply.usage = reply.usage or {}  # a whole reply without usage: estimated, as an unstreamed one is


def _as_delta(choice: dict[str, Any]) -> dict[str, Any]:
    """A whole reply's choice as a stream's: its message as the delta, each tool call indexed
    by its place (a streamed call without index or id would continue the one before)."""
    message = dict(choice.get("message") or {})
    if message.get("tool_calls") is not None:
        message["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
    return {**choice, "delta": message}


_tails: set[asyncio.Task[None]] = set()
"""Responses whose reply is in but whose body has not ended yet (held here: the event loop
keeps only weak references to its tasks)."""


def _close_after_tail(response: Any, rest: AsyncGenerator[bytes, None]) -> None:
    """Reads the body's rest after the end marker and closes the response, off the call's
    path. The HTTP client pools a connection only once its response has ended; closed
    instead, it costs the next call a new one (a TLS handshake on a real endpoint)."""
    task = asyncio.get_running_loop().create_task(_read_tail_and_close(response, rest))
    _tails.add(task)
    task.add_done_callback(_tails.discard)


async def _read_tail_and_close(response: Any, rest: AsyncGenerator[bytes, None]) -> None:
    """Within TAIL_WAIT_S and TAIL_MAX_BYTES. The reply is whole, so a failure here only
    means the connection is not reused: logged, never raised."""
    left = TAIL_MAX_BYTES
    try:
        async with contextlib.aclosing(rest), asyncio.timeout(TAIL_WAIT_S):
            async for data in rest:
                left -= len(data)
                if left < 0:
                    break
    except TimeoutError:
        pass
    except Exception as e:
        log.debug("the model endpoint's body after the end marker: %r; its connection is closed", e)
    finally:
        with contextlib.suppress(Exception):
            await response.close()


def _take(data: bytes, pending: bytearray, reply: StreamedReply, progress: StreamProgress) -> bool:
    """Takes the events that `data` completes; True at the stream's end marker."""
    pending += data
    if b"\n" not in data:
        if len(pending) > MAX_LINE_BYTES:
            raise bad_reply(f"the model endpoint streamed a line over {MAX_LINE_BYTES:,} bytes")
        return False
    cut = pending.rfind(b"\n")
    lines = pending[:cut].decode(errors="replace").split("\n")  # one decode per read, not per event
    del pending[: cut + 1]
    return any(line.startswith("data:") and _event(line[5:], reply, progress) for line in lines)


_decode_json = json.JSONDecoder().decode


def _event(data: str, reply: StreamedReply, progress: StreamProgress) -> bool:
    """Takes one `data:` payload; True at the stream's end marker."""
    data = data.strip()
    if data == "[DONE]":
        reply.done = True
        return True
    try:
        chunk = _decode_json(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise bad_reply(f"the model endpoint streamed a chunk that is not JSON: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise bad_reply(f"the model endpoint streamed a chunk that is not a JSON object: {data[:200]!r}")
    characters = reply.add(chunk)
    if characters:
        progress.received(characters)
    return False


def _after_last_space(text: str) -> int:
    """The index just after `text`'s last whitespace character; 0 if it has none."""
    match = _LAST_SPACE.search(text)
    return match.end() if match else 0


_LAST_SPACE = re.compile(r"\s(?=\S*\Z)")


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def bad_reply(message: str) -> ApplicationError:
    # Calling again would cost another reply like it: a person decides (needs_attention).
    return ApplicationError(message, type="BadModelResponse", non_retryable=True)
