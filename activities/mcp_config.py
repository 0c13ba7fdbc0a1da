"""The worker's MCP servers: `DURABLE_AGENT_MCP_CONFIG` names a JSON file in the form Claude
Desktop, Claude Code and Cursor use (DESIGN.md §5c):

    {"mcpServers": {"time": {"command": "mcp-server-time", "args": [], "env": {"TZ": "UTC"}},
                    "docs": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}}}}

Values may name the worker's variables as `${NAME}`: they are expanded when the worker
connects, never earlier, so a secret stays in the worker's environment and never reaches a
run's history. Per server, besides: `network` (stdio, default false), `sandbox` (default
true), `approve` (`destructive` / `always` / `never` / a list of tool names) and `timeout_s`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workflows.validation_text import validation_text

CONFIG_ENV = "DURABLE_AGENT_MCP_CONFIG"
SERVER_NAME = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")
"""No `__`: a tool's name is `mcp__<server>__<tool>`, and the server's part must be read back."""
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_TIMEOUT_S = 60.0


class McpConfigError(Exception):
    """The configuration cannot be used; the message names the file and the field."""


class McpServer(BaseModel):
    """One server: stdio (`command`) or HTTP (`url`), with durable-agent's extras."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """The server's whole environment (with PATH and HOME of its own): nothing else of the worker's."""
    cwd: str | None = None
    """Unsandboxed only: a sandboxed server's working directory is the run's workspace."""
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    type: Literal["stdio", "http", "streamable-http"] | None = None
    """Accepted as other clients write it; `command` or `url` decides."""
    network: bool = False
    sandbox: bool = True
    approve: Literal["destructive", "always", "never"] | list[str] = "destructive"
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command` (a stdio server) or `url` (an HTTP server)")
        return self

    @property
    def stdio(self) -> bool:
        return self.command is not None


class McpConfig(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    servers: dict[str, McpServer] = Field(default_factory=dict, alias="mcpServers")

    @field_validator("servers")
    @classmethod
    def _names(cls, servers: dict[str, McpServer]) -> dict[str, McpServer]:
        bad = [name for name in servers if not SERVER_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"server names {bad}: use letters, digits, '-' and single '_'")
        return servers

    @classmethod
    def from_env(cls) -> McpConfig:
        """The worker's configuration; none when `DURABLE_AGENT_MCP_CONFIG` is unset."""
        path = os.environ.get(CONFIG_ENV)
        return cls.load(Path(path)) if path else cls()

    @classmethod
    def load(cls, path: Path) -> McpConfig:
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except OSError as e:
            raise McpConfigError(f"{CONFIG_ENV}: {path} cannot be read: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise McpConfigError(f"{CONFIG_ENV}: {path} is not JSON: {e.msg} at line {e.lineno}") from None
        except ValidationError as e:
            raise McpConfigError(f"{CONFIG_ENV}: {path}: {validation_text(e)}") from None


def expanded(value: str) -> str:
    """`${NAME}` replaced by the worker's variable: at connect time only, never for history."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise McpConfigError(f"the MCP configuration names ${{{name}}}, which the worker's environment lacks")
        return os.environ[name]

    return VARIABLE.sub(variable, value)


def expanded_map(values: dict[str, str]) -> dict[str, str]:
    return {key: expanded(value) for key, value in values.items()}
