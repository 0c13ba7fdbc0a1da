"""The `call_model` activity: one chat completion through the `openai` SDK.

A regular activity: while the model answers, no workflow task is held and history does not
grow; the call heartbeats, so a dead worker's call is retried within seconds and the Web UI
shows it as pending with its attempt, last failure and heartbeat details: the reply is
streamed (activities/model_stream.py), so the details count what has arrived. Its input names
the context rather than holding it (activities/model_context.py), so history records the
reply, not the transcript. Runs recorded while it was a local activity replay as such.

Retries belong to Temporal alone (`max_retries=0`): HTTP 408/409/429/5xx and connection
errors are retryable, honouring `Retry-After`; 400/401/403/404/422 are not.
"""

from __future__ import annotations

import email.utils
import importlib
import json
import math
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import model_context
from activities.calls_here import CALLS_HERE
from activities.heartbeat import activity_key, heartbeating
from activities.live_replies import LIVE_REPLIES
from activities.model_attempts import AttemptLedger
from activities.model_clients import REQUEST_TIMEOUT_S, ModelClients, openai_sdk
from activities.model_outages import ModelOutages
from activities.model_stream import StreamedReply, StreamProgress, bad_reply, stream_chat_completion
from activities.pricing import price_of
from activities.redaction import worker_redactor
from activities.token_parameter import TokenParameters
from workflows.context import tokens_of
from workflows.tool_specs import openai_tool_schemas
from workflows.types import ModelCallInput, ModelReply, ToolCall

if TYPE_CHECKING:
    from openai import APIStatusError, AsyncOpenAI

RETRYABLE_STATUS = frozenset({408, 409, 429})
MAX_TOKENS_PER_CALL = 100_000_000
"""Above any model's window: a larger (or negative) count is a broken endpoint's, and
counting it would break the budgets and the `AgentTokens` search attribute (an int64)."""
MAX_RETRY_AFTER = timedelta(seconds=60)
"""The longest `Retry-After` honoured as asked: the model's retry policy waits at most 30 s
between attempts, and a person is asked after the last."""
REQUEST_SHARE = 0.9
"""Of a clipped call's start-to-close, the request's: its own timeout fires first, with its reason."""
MAX_REPLY_BYTES = 512 * 1024
"""A reply is recorded in history (and carried at continue-as-new); Temporal refuses a
payload over 2 MB. A model's longest reply is far below this."""


class ModelActivities:
    """The worker's model clients (activities/model_clients.py), and whether its calls are
    streamed (`DURABLE_AGENT_MODEL_STREAM=0` turns that off)."""

    def __init__(self, client: AsyncOpenAI | None = None) -> None:
        self._clients = ModelClients(client)
        self.outages = ModelOutages(self._clients)
        self._attempts = AttemptLedger()
        self._token_names = TokenParameters()
        self._live = os.environ.get("DURABLE_AGENT_LIVE_REPLY", "1") != "0"
        """While someone follows the run (`ModelCallInput.live`), beat within a second of each new
        line of the reply as it arrives, with its text so far: the live view of `run` and `watch`. Off, or unwatched,
        the details carry counts only, at the usual pace."""
        self._stream = os.environ.get("DURABLE_AGENT_MODEL_STREAM", "1") != "0"
        """Ask for streamed replies; off for good once the endpoint shows it cannot stream
        with usage."""

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """While a worker runs these activities; their endpoint probes end and their clients'
        connections are closed after."""
        try:
            yield
        finally:
            await self.outages.gate.stop()
            await self._clients.aclose()

    @activity.defn(name="call_model")
    async def call_model(self, input: ModelCallInput) -> ModelReply:
        key = activity_key()
        with self._attempts.counting(input.attempts):
            # A retry of an attempt the server gave up on a stalled worker joins its call, still in flight here.
            return await CALLS_HERE.outcome_of(key, lambda: self._call(input))

    async def _call(self, input: ModelCallInput) -> ModelReply:
        progress: dict[str, Any] = {"model": input.model, "phase": "reading the context"}
        streamed = StreamProgress()
        live_view = self._live and input.live
        served = LIVE_REPLIES.serving(streamed) if live_view else nullcontext(None)
        async with served as pulled_lately:
            # While a follower asks the worker for the reply, beats need not carry it (activities/live_replies.py).
            news = (lambda: streamed.news() and not pulled_lately()) if pulled_lately else None
            live = heartbeating(lambda: {**progress, **streamed.details()}, live=news)
            async with self._clients.lease() as leased, live:
                client = _within_deadline(leased)
                messages = input.messages
                if input.context is not None:
                    messages, progress["context_from"] = await model_context.fetch(input.context)
                progress.update(phase="waiting for the model", messages=len(messages))
                request = _request(input.model, messages, input.tools, input.tool_schemas)

                async def send(request: dict[str, Any]) -> ModelReply:
                    nonlocal streamed
                    if self._stream:
                        reply = await self._streamed_reply(client, input.model, request, streamed, live_view)
                        if reply is not None:
                            return reply
                        streamed = StreamProgress()  # the details describe the call made now
                    return _reply(input.model, await post_chat_completion(client, request), messages)

                async with self.outages.watch(leased, input.outage_wait):
                    with _endpoint_errors():
                        endpoint = str(leased.base_url)
                        return await self._token_names.send(endpoint, input.model, input.max_tokens, request, send)

    def all(self) -> list[Any]:
        """The model activities: the call, and the wait for its endpoint (one gate between them)."""
        return [self.call_model, self.outages.wait_for_model_endpoint]

    async def _streamed_reply(
        self, client: AsyncOpenAI, model: str, request: dict[str, Any], progress: StreamProgress, live: bool = False
    ) -> ModelReply | None:
        """The reply, streamed; None when this endpoint cannot stream with exact usage, and
        from then on this worker does not ask it to."""
        streamed = StreamedReply(MAX_REPLY_BYTES)
        if live:
            progress.reply = streamed
        try:
            await stream_chat_completion(client, request, streamed, progress)
        except openai_sdk().BadRequestError as e:
            if "stream" not in _error_detail(e).lower():
                raise
            return self._stop_streaming(f"it refused a streamed request: {_error_detail(e)}")
        if streamed.usage is None:
            if not (streamed.done or streamed.finish_reason):
                raise ApplicationError(
                    f"the model's streamed reply ended after {progress.chunks} chunks, before it was complete",
                    type="ModelStreamBroken",
                )
            return self._stop_streaming("its streamed replies carry no usage (stream_options ignored)")
        usage = streamed.usage
        return _assembled_reply(
            model,
            content="".join(streamed.content) if streamed.content is not None else None,
            calls=streamed.tool_calls(),
            usage=(usage.get("prompt_tokens"), usage.get("completion_tokens")),
            reply_model=streamed.model,
            finish_reason=streamed.finish_reason,
            sent=request["messages"],
        )

    def _stop_streaming(self, why: str) -> None:
        """Budgets count the endpoint's own usage: without it, calls go unstreamed."""
        if self._stream:
            activity.logger.warning("model calls of this worker are no longer streamed: the endpoint %s", why)
        self._stream = False
        return None


async def post_chat_completion(client: AsyncOpenAI, request: dict[str, Any]) -> Any:
    """POST /chat/completions through the SDK's client (auth, timeout, error types, response
    model), without `chat.completions.create`'s walk of every message against the SDK's
    TypedDicts: our messages are plain JSON already, and at 100 messages that walk took a
    third of a busy worker's CPU (py-spy), growing with the context."""
    chat = importlib.import_module("openai.types.chat")
    return await client.post("/chat/completions", body=request, cast_to=chat.ChatCompletion)


def _within_deadline(client: AsyncOpenAI) -> AsyncOpenAI:
    """The client, with the SDK's timeout under this call's start-to-close when the run clipped
    that to its time left (workflows/time_cap.py): the request ends by the run's limit."""
    timeout = activity.info().start_to_close_timeout
    if timeout is None or timeout.total_seconds() > REQUEST_TIMEOUT_S:
        return client
    return client.with_options(timeout=timeout.total_seconds() * REQUEST_SHARE)


def _request(
    model: str, messages: list[dict[str, Any]], tools: list[str], schemas: list[dict[str, Any]]
) -> dict[str, Any]:
    """`schemas`: the catalog's tools (the run's tools beyond the built-ins), in `tools`' order."""
    request: dict[str, Any] = {"model": model, "messages": messages}
    given = {schema["function"]["name"]: schema for schema in schemas}
    if tools:
        request["tools"] = [given[name] if name in given else openai_tool_schemas([name])[0] for name in tools]
    return request


def _reply(model: str, response: Any, sent: list[dict[str, Any]]) -> ModelReply:
    if not getattr(response, "choices", None):
        raise ApplicationError("model response has no choices", type="BadModelResponse")
    choice = response.choices[0]
    message = choice.message
    usage = response.usage
    return _assembled_reply(
        model,
        content=message.content,
        calls=[
            (c.id or "", c.function.name or "", c.function.arguments or "")
            for c in message.tool_calls or []
            if getattr(c, "function", None) is not None
        ],
        usage=(getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)),
        reply_model=getattr(response, "model", None),
        finish_reason=choice.finish_reason,
        sent=sent,
    )


def _assembled_reply(
    model: str,
    *,
    content: str | None,
    calls: list[tuple[str, str, str]],
    usage: tuple[object, object],
    reply_model: str | None,
    finish_reason: str | None,
    sent: list[dict[str, Any]],
) -> ModelReply:
    """The recorded reply, whether it came whole or streamed; `calls` are (id, name, arguments).
    A field of the wrong type is the endpoint's fault: asking again would cost another like it.
    Without usage (neither count; some vLLM and llama.cpp setups), the tokens of what was sent
    and received are estimated and the reply says so: budgets then count an estimate, not 0."""
    estimated = usage[0] is None and usage[1] is None
    if estimated:
        usage = (tokens_of(_texts(sent)), tokens_of([content or "", *(name + args for _, name, args in calls)]))
    try:
        reply = ModelReply(
            content=_text(content) if content is not None else None,
            tool_calls=[
                ToolCall(id=_text(id or f"call_{i}"), name=_text(name), arguments=_text(arguments))
                for i, (id, name, arguments) in enumerate(calls)
            ],
            input_tokens=_token_count(usage[0], "prompt"),
            output_tokens=_token_count(usage[1], "completion"),
            model=_text(reply_model if isinstance(reply_model, str) and reply_model else model),
            finish_reason=finish_reason,
            price=price_of(model),
            usage_estimated=estimated,
        )
    except (ValidationError, AttributeError, TypeError) as e:
        raise bad_reply(f"the model endpoint's reply has a field of the wrong type: {e}"[:500]) from None
    size = len(reply.model_dump_json())
    if size > MAX_REPLY_BYTES:
        raise bad_reply(
            f"the model's reply is {size:,} bytes, over the {MAX_REPLY_BYTES:,} a step may record; "
            "ask for a shorter reply (add a message), then retry"
        )
    return reply


def _texts(messages: list[dict[str, Any]]) -> Iterable[str]:
    """What the estimate counts of the messages sent: contents, tool calls' names and arguments."""
    for message in messages:
        content = message.get("content")
        yield content if isinstance(content, str) else json.dumps(content) if content is not None else ""
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            yield f"{function.get('name', '')}{function.get('arguments', '')}"


def _text(value: str) -> str:
    """`value` with any unpaired UTF-16 surrogate (an escape such as \\ud800 without its pair,
    which some endpoints send) replaced by U+FFFD: such a string cannot be encoded to record."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def _token_count(value: object, which: str) -> int:
    count = value or 0
    if not isinstance(count, int) or not 0 <= count <= MAX_TOKENS_PER_CALL:
        raise bad_reply(
            f"the model endpoint reported {count!r} {which} tokens for one call; a count must be 0 to "
            f"{MAX_TOKENS_PER_CALL:,}, so this call's usage cannot be counted against the budget"
        )
    return count


@contextmanager
def _endpoint_errors() -> Iterator[None]:
    """The SDK's errors as Temporal sees them: retryable or not, with the endpoint's reason.

    Raised without the SDK's exception chain: the server keeps a retried call's last failure
    (the Web UI's "Last Failure") only up to a few KB, and the chain's stack traces (SDK,
    httpx, httpcore) made it "Failure exceeds size limit." with the reason buried below."""
    openai = openai_sdk()
    try:
        yield
    except openai.APIStatusError as e:
        raise _status_error(e) from None
    except (openai.APIConnectionError, openai.APITimeoutError) as e:
        cause = f" ({e.__cause__!r})" if e.__cause__ else ""
        raise ApplicationError(f"model endpoint unreachable: {e}{cause}", type="ModelUnavailable") from None


def _status_error(e: APIStatusError) -> ApplicationError:
    status = e.status_code
    detail = _error_detail(e)
    if status in RETRYABLE_STATUS or status >= 500:
        return ApplicationError(
            f"model endpoint returned HTTP {status}: {detail}",
            type=f"ModelHttp{status}",
            next_retry_delay=retry_after(e.response),
        )
    return ApplicationError(
        f"model endpoint rejected the request with HTTP {status}: {detail}",
        type="ModelRequestRejected",
        non_retryable=True,
    )


def _error_detail(e: APIStatusError) -> str:
    """The endpoint's message, redacted before it is cut: a cut could leave half a secret."""
    body = e.body
    detail = str(e.message)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            detail = str(inner["message"])
    return worker_redactor().text(detail)[:300]


def retry_after(response: Any) -> timedelta | None:
    """The server's requested wait: `retry-after-ms`, `Retry-After` seconds or HTTP date,
    within 0 to MAX_RETRY_AFTER; None when absent or not a time."""
    if response is None:
        return None
    headers = response.headers
    if ms := headers.get("retry-after-ms"):
        try:
            if (wait := _bounded_wait(float(ms) / 1000)) is not None:
                return wait
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return _bounded_wait(float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return _bounded_wait(parsed.timestamp() - time.time())


def _bounded_wait(seconds: float) -> timedelta | None:
    """A wait of hours (or `inf`) would leave the run "running" with no one told: an endpoint
    that still refuses after MAX_RETRY_AFTER fails the attempt again, and after the last one
    a person decides (needs_attention)."""
    if math.isnan(seconds):
        return None
    return timedelta(seconds=min(max(0.0, seconds), MAX_RETRY_AFTER.total_seconds()))
