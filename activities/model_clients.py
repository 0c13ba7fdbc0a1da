"""The worker's clients to the model endpoint: `openai` SDK clients, each with its own pool.

A worker keeps a connection for every model call it has in flight (`new_openai_client`).
The HTTP client's pool walks every connection it holds whenever a request starts or ends,
and probes the socket of each idle one, so one pool's CPU per call grows with the calls in
flight: at 250 at once, 4.0-4.1 ms of worker CPU per call with one pool against 1.5-1.8 ms
with up to 16 (`python -m bench clients`, docs/fleet.md). So a worker spreads its calls over several clients:
a call takes the first client with fewer than `CALLS_PER_CLIENT` calls in flight, and
another client is made only when none has. A worker with a few agents uses one.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from types import ModuleType
from typing import TYPE_CHECKING, Any

from temporalio.exceptions import ApplicationError

if TYPE_CHECKING:
    from openai import AsyncOpenAI

REQUEST_TIMEOUT_S = 110.0
"""Just under the activity's start-to-close timeout, so the SDK's own timeout fires first."""
CALLS_PER_CLIENT = 16
"""Calls in flight on every client before the worker makes another one."""
MAX_CLIENTS = 16
"""At most this many clients (pools): 256 calls in flight before any pool holds more than 16."""


def openai_sdk() -> ModuleType:
    """The `openai` package, imported on first use rather than at worker start.

    It is 0.8 s of the worker's 1.3 s start-up, and start-up is time that a run whose
    worker was killed spends waiting for the next one. The worker warms it up once polling.
    """
    return importlib.import_module("openai")


def new_openai_client(tls: Any = None) -> AsyncOpenAI:
    """A client with no SDK retries (Temporal retries the activity) that keeps a connection
    for every call in flight; `tls`, an `ssl.SSLContext`, shared between clients.

    The SDK keeps at most 100 idle connections of its 1,000. A worker serving more agents
    than that would close the surplus after each wave of replies and open new ones for the
    next calls, a TCP and TLS handshake each; so it keeps as many as it may open.
    """
    sdk = openai_sdk()
    limits = sdk.DEFAULT_CONNECTION_LIMITS
    keep_every_connection = type(limits)(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_connections,
        keepalive_expiry=limits.keepalive_expiry,
    )
    tls_option = {} if tls is None else {"verify": tls}
    return sdk.AsyncOpenAI(
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
        http_client=sdk.DefaultAsyncHttpxClient(limits=keep_every_connection, **tls_option),
    )


class ModelClients:
    """The clients of one worker, made on first use from its environment (`OPENAI_API_KEY`,
    `OPENAI_BASE_URL`); or only `given`, a client of a test or benchmark."""

    def __init__(self, given: AsyncOpenAI | None = None) -> None:
        self._clients: list[AsyncOpenAI] = [] if given is None else [given]
        self._given = given
        self._closed = False
        """Set by `aclose`: a call still running after its worker stopped makes no new client."""
        self._in_flight = [0] * len(self._clients)
        self._max_clients = 1 if given is not None else MAX_CLIENTS
        self._tls: Any = None
        """One TLS context for every client: making one reads the CA bundle (~20 ms)."""
        self._making_first: asyncio.Future[tuple[Any, AsyncOpenAI]] | None = None
        """The first client's making, shared: a new worker's first wave of calls waits for one."""

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[AsyncOpenAI]:
        """The client for one call, counted as in flight on it until the call ends."""
        self._refuse_if_closed()
        if not self._clients:
            await self._first_client()
            self._refuse_if_closed()  # closed while the first client was made
        index = self._pick()
        client = self._clients[index]
        self._in_flight[index] += 1
        try:
            yield client
        finally:
            if index < len(self._clients) and self._clients[index] is client:  # not closed meanwhile
                self._in_flight[index] -= 1

    def clients(self) -> int:
        return len(self._clients)

    def _pick(self) -> int:
        """The first client with room; a new one when none has any. Filled in order, each
        client's pool keeps the connections of its share of a wave of calls for the next."""
        for index, calls in enumerate(self._in_flight):
            if calls < CALLS_PER_CLIENT:
                return index
        if len(self._clients) < self._max_clients:
            self._clients.append(new_openai_client(self._tls))  # ~0.2 ms with the shared context
            self._in_flight.append(0)
            return len(self._clients) - 1
        return min(range(len(self._clients)), key=self._in_flight.__getitem__)

    async def _first_client(self) -> None:
        if not os.environ.get("OPENAI_API_KEY"):
            raise ApplicationError(
                "OPENAI_API_KEY is not set on the worker; set it (and OPENAI_BASE_URL for a "
                "non-OpenAI endpoint) in the worker's environment",
                type="ModelNotConfigured",
                non_retryable=True,
            )
        # Off the event loop: a new worker's first call can come while its warm-up import
        # still runs, and waiting for the import lock on the loop would stall every other
        # task of the worker for up to a second.
        if self._making_first is None:
            self._making_first = asyncio.ensure_future(asyncio.to_thread(_first_client))
        making = self._making_first
        try:
            tls, client = await asyncio.shield(making)  # a cancelled call leaves it to the others
        except Exception:
            if self._making_first is making:
                self._making_first = None  # the next call tries again
            raise
        if not self._clients:
            self._tls = tls
            self._clients.append(client)
            self._in_flight.append(0)

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ApplicationError("the worker has stopped: its model clients are closed", type="WorkerStopped")

    async def aclose(self) -> None:
        """Close the connections of the clients made here (a given client is its owner's to
        close), once the worker has stopped calling the model. Left to the garbage collector,
        a client's close is scheduled on a loop that may no longer run, and never happens."""
        self._closed = True
        if (making := self._making_first) is not None:
            with suppress(Exception):
                await asyncio.shield(making)  # made while closing: closed with the others
        made = [c for c in self._clients if c is not self._given]
        if making is not None and making.done() and not making.cancelled() and making.exception() is None:
            made.append(making.result()[1])
        self._clients = [] if self._given is None else [self._given]
        self._in_flight = [0] * len(self._clients)
        self._making_first = None
        await asyncio.gather(*(client.close() for client in dict.fromkeys(made)))


def _first_client() -> tuple[Any, AsyncOpenAI]:
    tls = sdk_http_library().create_ssl_context()
    return tls, new_openai_client(tls)


def http_library(cls: type) -> ModuleType:
    """The HTTP library a class comes from: httpx, or httpx2 in newer `openai` releases."""
    return sys.modules[cls.__module__.partition(".")[0]]


def sdk_http_library() -> ModuleType:
    """The HTTP library the installed SDK's default client is built on."""
    client_class = openai_sdk().DefaultAsyncHttpxClient
    return http_library(next(c for c in client_class.__mro__ if not c.__module__.startswith("openai")))
