"""A worker waits for its Temporal server: one that starts during a deploy or a network blip
must not die (issue #29).

`connect_when_up` retries the connection with a backoff capped at RETRY_CAP_S, prints one
line when it starts waiting and one once connected, and waits forever unless given a limit
(`durable-agent worker --connect-timeout S` or `DURABLE_AGENT_CONNECT_TIMEOUT_S`), for
scripts that would rather fail fast. Once connected, the SDK's core reconnects by itself
when the server goes away and comes back, and the worker goes on polling: `watch_server`
says so in one line each way, in place of the core's warning for each retried poll
(QUIET_RETRIES), which came to ten lines every few seconds while the server was down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.runtime import LoggingConfig, Runtime, TelemetryFilter
from temporalio.service import RPCError

from durable_agent.connection import connect, connect_config

RETRY_CAP_S = 3.0
"""Longest pause between two attempts: a server back up is found within this."""
FIRST_RETRY_S = 0.2
ATTEMPT_TIMEOUT_S = 10.0
"""One attempt that neither connects nor fails (a host that drops packets) is given up and retried."""
MIN_ATTEMPT_S = 2.0


WATCH_EVERY = timedelta(seconds=3)
"""How often a running worker asks whether its server answers (one small call)."""
QUIET_RETRIES = LoggingConfig(
    filter=TelemetryFilter(core_level="WARN", other_level="ERROR").formatted() + ",temporalio_client::retry=ERROR"
)
"""The SDK's default log levels, less the warning for every retried call."""


class ServerUnreachable(Exception):
    """No server answered within the limit; the message is one line for the user."""


def _reason(error: BaseException) -> str:
    """The error's gist: the core's connect errors are long nested debug strings."""
    if isinstance(error, TimeoutError):
        return "no answer"
    text = str(error)
    if "refused" in text.lower():
        return "connection refused"
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


async def connect_when_up(
    runtime: Runtime | None = None, timeout_s: float | None = None, say: Callable[[str], None] = print
) -> Client:
    """A client of the configured server once it answers. `timeout_s`: give up after that long
    (0: one attempt) with ServerUnreachable; None: wait forever."""
    address = connect_config()["target_host"]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause, waiting_since = FIRST_RETRY_S, None
    while True:
        # Even a limit about to run out leaves one attempt time to connect.
        left = ATTEMPT_TIMEOUT_S if deadline is None else max(deadline - time.monotonic(), MIN_ATTEMPT_S)
        try:
            client = await asyncio.wait_for(connect(None, runtime), min(left, ATTEMPT_TIMEOUT_S))
        except (RuntimeError, RPCError, TimeoutError) as e:
            if deadline is not None and time.monotonic() + pause > deadline:
                raise ServerUnreachable(
                    f"no Temporal server answered at {address} within {timeout_s:g} s ({_reason(e)})"
                ) from None
            if waiting_since is None:
                waiting_since = time.monotonic()
                limit = "" if timeout_s is None else f" for up to {timeout_s:g} s"
                say(f"waiting for the Temporal server at {address} ({_reason(e)}); retrying{limit}")
            await asyncio.sleep(pause)
            pause = min(2 * pause, RETRY_CAP_S)
            continue
        if waiting_since is not None:
            say(f"connected to the Temporal server at {address} after {time.monotonic() - waiting_since:.1f} s")
        return client


async def watch_server(client: Client, say: Callable[[str], None] = print) -> None:
    """One line when the server stops answering, one when it answers again; runs until cancelled."""
    address = client.service_client.config.target_host
    lost = False
    while True:
        await asyncio.sleep(WATCH_EVERY.total_seconds())
        try:
            await client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=WATCH_EVERY)
        except RPCError as e:
            if not lost:
                say(f"lost the Temporal server at {address} ({_reason(e)}); the worker goes on when it is back")
            lost = True
            continue
        if lost:
            say(f"the Temporal server at {address} answers again")
        lost = False


def gone_at_start(error: BaseException) -> bool:
    """A worker's start-up check failed because the server went away after it connected."""
    text = str(error)
    return "validation failed" in text and ("Unavailable" in text or "connect error" in text)


async def until_answering(client: Client, stop: asyncio.Event) -> bool:
    """Poll the server with the connection's backoff until it answers (True) or `stop` is set (False)."""
    delay = FIRST_RETRY_S
    while not stop.is_set():
        try:
            await client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=WATCH_EVERY)
            return True
        except RPCError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass
        delay = min(delay * 2, RETRY_CAP_S)
    return False
