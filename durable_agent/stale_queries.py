"""Queries that a worker refused as stale, asked again by every client `connect` makes.

A worker refuses a legacy query whose activation brought new events without their workflow
task's time (durable_agent/activation_guard.py): it evicts the run, which the next workflow
task, or the next query, replays from history. The query itself fails with STALE_ACTIVATION
in its message. Our clients ask again, with growing waits, for up to ASK_AGAIN_FOR_S; the
Temporal CLI and Web UI show the refusal, which says to ask again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio.client import Interceptor, OutboundInterceptor, QueryWorkflowInput, WorkflowQueryFailedError

STALE_ACTIVATION = "stale activation"
"""In the failure of a query (or workflow task) that the activation guard refused."""

ASK_AGAIN_FOR_S = 10.0
"""The refused query is answered once the run's next workflow task started, which the
eviction puts on the normal task queue: within a second or two on a loaded worker."""


class AskAgainWhenStale(Interceptor):
    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _AskAgain(next)


class _AskAgain(OutboundInterceptor):
    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        deadline, wait_s = time.monotonic() + ASK_AGAIN_FOR_S, 0.1
        while True:
            try:
                return await super().query_workflow(input)
            except WorkflowQueryFailedError as e:
                if STALE_ACTIVATION not in str(e) or time.monotonic() + wait_s > deadline:
                    raise
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, 2.0)
