"""Connecting to Temporal the standard way, so one worker runs anywhere.

`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, the TLS variables and
profiles all come from `temporalio.envconfig`; only the host has a local default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime

from durable_agent import telemetry
from workflows.types import TASK_QUEUE

DEFAULT_ADDRESS = "localhost:7233"


def task_queue() -> str:
    return os.environ.get("DURABLE_AGENT_TASK_QUEUE") or TASK_QUEUE


def home() -> Path:
    """Where the embedded server keeps its SQLite file (`DURABLE_AGENT_HOME`)."""
    return Path(os.environ.get("DURABLE_AGENT_HOME") or ".durable-agent").resolve()


def connect_config(address: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    if address:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    return config


async def connect(address: str | None = None, runtime: Runtime | None = None) -> Client:
    """`runtime`: a worker's, serving its metrics (durable_agent/metrics.py); None, the default."""
    return await Client.connect(
        **connect_config(address),
        data_converter=pydantic_data_converter,
        interceptors=telemetry.client_interceptors(),  # traces, when the OTEL_* variables ask for them
        runtime=runtime,
    )
