"""Connecting to Temporal the standard way, so one worker runs anywhere.

`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, the TLS variables and
profiles all come from `temporalio.envconfig`; only the host has a local default.

`data_converter()` is the one data converter: the worker, the CLI, the replay tests and
the benchmarks all use it (through `connect`, or directly for a `Replayer`), so every
process reads and writes payloads the same way (pydantic JSON, then durable_agent/codecs.py).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime

from activities.home import home_path
from durable_agent import telemetry
from durable_agent.codecs import EncryptionKeys, PayloadCodecChain
from durable_agent.failures import ShortStackTraces, ShortStackTracesEncodedButKeyNotHeld
from durable_agent.stale_queries import AskAgainWhenStale
from workflows.types import TASK_QUEUE

DEFAULT_ADDRESS = "localhost:7233"


def task_queue() -> str:
    return os.environ.get("DURABLE_AGENT_TASK_QUEUE") or TASK_QUEUE


def home() -> Path:
    """activities/home.py's home, created if missing and open to its owner only: without an
    encryption key the server's database there holds every run's history in clear."""
    folder = home_path()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o077 and folder.stat().st_uid == os.getuid():
        folder.chmod(0o700)  # made by an earlier version, open to every local user
    return folder


def connect_config(address: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    if address:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    return config


def data_converter(keys: EncryptionKeys | None = None) -> DataConverter:
    """Pydantic JSON payloads, compressed when large and encrypted with `keys` (default: from
    `DURABLE_AGENT_ENCRYPTION_KEY`, unset: not encrypted). Failures keep their innermost frames
    (durable_agent/failures.py); with a key, their messages and stack traces are moved into an
    encoded (so encrypted) payload too."""
    keys = keys or EncryptionKeys.from_env()
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=PayloadCodecChain(keys),
        failure_converter_class=ShortStackTracesEncodedButKeyNotHeld if keys else ShortStackTraces,
    )


def client_interceptors() -> list[Any]:
    """A client's interceptors, ours and the plugin's alike: a query refused as stale asked
    again (durable_agent/stale_queries.py), and the tracing the OTEL_* variables ask for."""
    return [AskAgainWhenStale(), *telemetry.client_interceptors()]


async def connect(
    address: str | None = None,
    runtime: Runtime | None = None,
    *,
    converter: DataConverter | None = None,
    interceptors: list[Any] | None = None,
) -> Client:
    """A client with the data converter (`data_converter()` unless given) and, unless given,
    the tracing interceptors the OTEL_* variables ask for; a query that a worker refused as
    stale is asked again (durable_agent/stale_queries.py). `runtime`: a worker's, serving its
    metrics (durable_agent/metrics.py); None, the default."""
    return await Client.connect(
        **connect_config(address),
        data_converter=converter or data_converter(),
        interceptors=client_interceptors() if interceptors is None else [AskAgainWhenStale(), *interceptors],
        runtime=runtime,
    )
