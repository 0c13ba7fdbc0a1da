"""The workflow's side of handing a model call's context to the worker that runs the call.

`call_model` is a regular activity, whose input is recorded in history; so its input names
the context (`ModelContextRef`: run id, message count, digest) and the messages travel
another way (activities/model_context.py is the worker's side):

1. As the workflow schedules the call it offers the messages to a sink the worker installs
   (`install_sink`): its in-process cache, from which the call usually takes them moments
   later on the same worker. Without a sink (a unit test, a replayer) the offer is dropped.
2. Any other worker asks the workflow with the `model_context` query, answered a page at a
   time (`context_page`), as a query's answer is refused over 2 MB.

The digest makes both answers exact: a cache entry or a page is used only when it belongs
to this very call. Everything here is pure but the sink, which keeps memory only: an offer
changes nothing the workflow decides, so it is safe in workflow code (skipped in replay).
This module is imported passed through the workflow sandbox, so the sink installed by the
worker is the one the workflows see.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from temporalio import workflow

from workflows.types import ModelContextRef

MODEL_CONTEXT_QUERY = "model_context"
PAGE_BYTES = 1_000_000
"""A query's answer is refused over 2 MB ("Blob data size exceeds limit"): a context is read a
page of at most this many bytes of messages at a time (a single larger message alone)."""

ContextSink = Callable[[ModelContextRef, list[dict[str, Any]]], None]
_sink: ContextSink | None = None


def install_sink(sink: ContextSink | None) -> None:
    """Called by the worker's wiring (durable_agent/plugin.py), never by workflow code."""
    global _sink
    _sink = sink


def encode_message(message: dict[str, Any]) -> bytes:
    """One wire message as the digest reads it: compact JSON, UTF-8."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def context_ref(
    run_id: str, messages: list[dict[str, Any]], encode: Callable[[dict[str, Any]], bytes] = encode_message
) -> ModelContextRef:
    """Deterministic: the workflow computes it, in replay too. The digest is that of the list's
    compact JSON, hashed a message at a time, so that `encode` may be a cache of each message's
    encoding (workflows/context.py `WireContext.encode`): a long run's call re-encoded hundreds of
    unchanged messages at every step."""
    digest = hashlib.blake2b(b"[", digest_size=16)
    for i, message in enumerate(messages):
        if i:
            digest.update(b",")
        digest.update(encode(message))
    digest.update(b"]")
    return ModelContextRef(run_id=run_id, message_count=len(messages), digest=digest.hexdigest())


def offer(ref: ModelContextRef, messages: list[dict[str, Any]]) -> None:
    if _sink is not None and not workflow.unsafe.is_replaying():
        _sink(ref, messages)


def context_page(messages: list[dict[str, Any]], first: int) -> tuple[list[dict[str, Any]], int | None]:
    """The messages from `first` that fit in PAGE_BYTES (one at least), and where the next
    page starts (None: none is left)."""
    end, size = first, 0
    while end < len(messages):
        size += len(json.dumps(messages[end], separators=(",", ":"), ensure_ascii=False).encode())
        if size > PAGE_BYTES and end > first:
            break
        end += 1
    return messages[first:end], (end if end < len(messages) else None)
