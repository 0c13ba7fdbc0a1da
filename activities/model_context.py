"""How a model call's context reaches the worker that runs it, without entering history.

`call_model` is a regular activity, and a regular activity's input is recorded in history.
So its input names the context (`ModelContextRef`: run id, message count, digest) and
the messages travel another way:

1. The workflow offers them to this process's cache when it schedules the call (`offer`).
   The call usually runs on the same worker, moments later, and takes them from there.
2. Any other worker (a dedicated model task queue, a retry after the first worker died,
   a restarted process) asks the workflow with the `model_context` query. The workflow
   keeps the in-flight call's messages for that; a worker that does not have the run
   cached replays it first, as for any query. The answer comes in pages (`context_page`).

The digest makes both answers exact: a cache entry or a query answer is used only when
it is the context of this very call. The input is "the list of wire messages for this
call", however the workflow built it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from workflows.types import ModelContext, ModelContextRef, ModelContextRequest

MODEL_CONTEXT_QUERY = "model_context"
PAGE_BYTES = 1_000_000
"""A query's answer is refused over 2 MB ("Blob data size exceeds limit"): a context is read a
page of at most this many bytes of messages at a time (a single larger message alone)."""
QUERY_PATIENCE_S = 60.0
"""How long one attempt asks a run that no worker answers for: within the call's 120 s."""

CACHE_ENTRIES = 2_000
"""Contexts waiting in this process for their call to start, one per run at most. An entry
leaves when its call takes it, when the run offers its next context, or, oldest first, past
this many (calls that ran on another worker)."""

_cache: OrderedDict[str, tuple[ModelContextRef, list[dict[str, Any]]]] = OrderedDict()


def context_ref(run_id: str, messages: list[dict[str, Any]]) -> ModelContextRef:
    """Pure and deterministic: the workflow computes it, in replay too."""
    encoded = json.dumps(messages, separators=(",", ":"), ensure_ascii=False).encode()
    digest = hashlib.blake2b(encoded, digest_size=16).hexdigest()
    return ModelContextRef(run_id=run_id, message_count=len(messages), digest=digest)


def offer(ref: ModelContextRef, messages: list[dict[str, Any]]) -> None:
    """Called by the workflow as it schedules the call; memory only, so replay-safe."""
    _cache[ref.run_id] = (ref, messages)
    _cache.move_to_end(ref.run_id)
    while len(_cache) > CACHE_ENTRIES:
        _cache.popitem(last=False)


def take(ref: ModelContextRef) -> list[dict[str, Any]] | None:
    entry = _cache.get(ref.run_id)
    if entry is None or entry[0] != ref:
        return None
    del _cache[ref.run_id]
    return entry[1]


def context_page(messages: list[dict[str, Any]], first: int) -> tuple[list[dict[str, Any]], int | None]:
    """Pure: the messages from `first` that fit in PAGE_BYTES (one at least), and where the
    next page starts (None: none is left)."""
    end, size = first, 0
    while end < len(messages):
        size += len(json.dumps(messages[end], separators=(",", ":"), ensure_ascii=False).encode())
        if size > PAGE_BYTES and end > first:
            break
        end += 1
    return messages[first:end], (end if end < len(messages) else None)


async def fetch(ref: ModelContextRef) -> tuple[list[dict[str, Any]], str]:
    """The call's messages and where they came from ("cache" or "query"). Activity side."""
    cached = take(ref)
    if cached is not None:
        return cached, "cache"
    info = activity.info()
    handle = activity.client().get_workflow_handle(info.workflow_id, run_id=ref.run_id)
    messages: list[dict[str, Any]] = []
    first: int | None = 0
    while first is not None:
        page = await _query_page(handle, ModelContextRequest(**ref.model_dump(), first_message=first))
        messages += page.messages
        first = page.next_message
    if context_ref(ref.run_id, messages) != ref:  # the run moved on between two pages
        raise ApplicationError("the run no longer waits for this call", type="StaleContext", non_retryable=True)
    return messages, "query"


async def _query_page(handle: WorkflowHandle[Any, Any], request: ModelContextRequest) -> ModelContext:
    """One page. While no worker of the run answers (a restart, a deploy), asked again for
    up to QUERY_PATIENCE_S within this attempt (the call heartbeats meanwhile), so that a
    short outage of the agent workers does not use up the call's attempts."""
    deadline = time.monotonic() + QUERY_PATIENCE_S
    wait_s = 1.0
    while True:
        try:
            return await handle.query(MODEL_CONTEXT_QUERY, request, result_type=ModelContext)
        except WorkflowQueryFailedError as e:
            # The run holds another call's context: this attempt is stale and cannot succeed.
            stale = f"the run no longer waits for this call: {e}"
            raise ApplicationError(stale, type="StaleContext", non_retryable=True) from e
        except RPCError as e:
            if time.monotonic() + wait_s > deadline:
                raise ApplicationError(
                    f"could not read the context from the run: {e}", type="ContextUnavailable"
                ) from e
            activity.logger.info("the run's context is not readable yet (%s); asking again in %g s", e, wait_s)
        await asyncio.sleep(wait_s)
        wait_s = min(wait_s * 2, 10.0)
