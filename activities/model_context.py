"""The worker's side of handing a model call's context to `call_model` without history.

The workflow offers each call's messages to this process's cache (installed as the sink of
workflows/context_handoff.py by the plugin); `fetch` takes them from there, or, on any other
worker, asks the run with the `model_context` query a page at a time. Why, and how the
digest keeps both exact: workflows/context_handoff.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from durable_agent.stale_queries import STALE_ACTIVATION
from workflows.context_handoff import MODEL_CONTEXT_QUERY, context_ref
from workflows.types import ModelContext, ModelContextRef, ModelContextRequest

QUERY_PATIENCE_S = 60.0
"""How long one attempt asks a run that no worker answers for: within the call's 120 s."""

CACHE_ENTRIES = 2_000
"""Contexts waiting in this process for their call to start, one per run at most. An entry
leaves when its call takes it, when the run offers its next context, or, oldest first, past
this many (calls that ran on another worker)."""

_cache: OrderedDict[str, tuple[ModelContextRef, list[dict[str, Any]]]] = OrderedDict()


def offer(ref: ModelContextRef, messages: list[dict[str, Any]]) -> None:
    """The sink of workflows/context_handoff.py: memory only."""
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
            if STALE_ACTIVATION not in str(e):
                # The run holds another call's context: this attempt is stale and cannot succeed.
                stale = f"the run no longer waits for this call: {e}"
                raise ApplicationError(stale, type="StaleContext", non_retryable=True) from e
            unanswered: Exception = e  # the worker refused to answer from a stale activation, and replays the run
        except RPCError as e:
            unanswered = e
        if time.monotonic() + wait_s > deadline:
            raise ApplicationError(
                f"could not read the context from the run: {unanswered}", type="ContextUnavailable"
            ) from unanswered
        activity.logger.info("the run's context is not readable yet (%s); asking again in %g s", unanswered, wait_s)
        await asyncio.sleep(wait_s)
        wait_s = min(wait_s * 2, 10.0)
