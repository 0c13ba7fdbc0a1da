"""Where durable-agent keeps the embedded server's database and the CLI's worker logs.

`DURABLE_AGENT_HOME`, default `./.durable-agent` (DESIGN.md §6), created 0700. Without an
encryption key the database holds every run's history in clear, so no workspace may hold
it: its commands and `read_file` would read every run's goals, outputs and secrets. The
working directory is the default workspace root, not a workspace: a run whose workspace
is the working directory itself is refused; one in a folder beside the home is not.
"""

from __future__ import annotations

import os
from pathlib import Path

from activities.workspace import WorkspaceRefused

HOME_ENV = "DURABLE_AGENT_HOME"


def home_path() -> Path:
    """The home's real path (it may not exist yet)."""
    return Path(os.path.realpath(os.environ.get(HOME_ENV) or ".durable-agent"))


def refuse_workspace_holding_home(workspace: str) -> None:
    home = home_path()
    real = Path(os.path.realpath(workspace))
    if home.is_relative_to(real):
        raise WorkspaceRefused(
            f"workspace {workspace} holds durable-agent's home {home} ({HOME_ENV}), where the server keeps every "
            f"run's history: the model's commands could read it; set {HOME_ENV} outside the workspace"
        )
