"""Where durable-agent keeps the embedded server's database and the CLI's worker logs.

`DURABLE_AGENT_HOME`, default `$XDG_STATE_HOME/durable-agent` (else
`~/.local/state/durable-agent`): a per-user folder, not the working directory, which is
also the default workspace root. Without an encryption key the database holds every
run's history in clear, so no workspace may hold it: its commands and `read_file` would
read every run's goals, outputs and secrets.
"""

from __future__ import annotations

import os
from pathlib import Path

from activities.workspace import WorkspaceRefused

HOME_ENV = "DURABLE_AGENT_HOME"


def home_path() -> Path:
    """The home's real path (it may not exist yet)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.path.realpath(os.environ.get(HOME_ENV) or Path(state) / "durable-agent"))


def refuse_workspace_holding_home(workspace: str) -> None:
    home = home_path()
    real = Path(os.path.realpath(workspace))
    if home.is_relative_to(real):
        raise WorkspaceRefused(
            f"workspace {workspace} holds durable-agent's home {home} ({HOME_ENV}), where the server keeps every "
            f"run's history: the model's commands could read it; set {HOME_ENV} outside the workspace"
        )
