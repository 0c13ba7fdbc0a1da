"""Where durable-agent keeps the embedded server's database and the CLI's worker logs.

`DURABLE_AGENT_HOME`, default `./.durable-agent` (DESIGN.md §6), created 0700. Without an
encryption key the database holds every run's history in clear, so no workspace may hold
it: its commands and `read_file` would read every run's goals, outputs and secrets. The
working directory is the default workspace root, not a workspace: a run whose workspace
is the working directory itself is refused; one in a folder beside the home is not. Nor
may a workspace hold the worker's temporary folder (`refuse_workspace_holding_worker_state`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from activities.workspace import WorkspaceRefused

HOME_ENV = "DURABLE_AGENT_HOME"


def home_path() -> Path:
    """The home's real path (it may not exist yet)."""
    return Path(os.path.realpath(os.environ.get(HOME_ENV) or ".durable-agent"))


def refuse_workspace_holding_worker_state(workspace: str) -> None:
    """Refuse a workspace that holds the home, or the temporary folder where each worker of this
    user keeps the command sandbox's seccomp filter and its live reply sockets: the sandbox binds
    the workspace read-write, so a command could rewrite the filter that every later sandbox
    applies, or reach another run's live reply."""
    real = Path(os.path.realpath(workspace))
    home = home_path()
    if home.is_relative_to(real):
        raise WorkspaceRefused(
            f"workspace {workspace} holds durable-agent's home {home} ({HOME_ENV}), where the server keeps every "
            f"run's history: the model's commands could read it; set {HOME_ENV} outside the workspace"
        )
    for variable, folder in (("TMPDIR", tempfile.gettempdir()), ("XDG_RUNTIME_DIR", os.environ.get("XDG_RUNTIME_DIR"))):
        if folder and Path(os.path.realpath(folder)).is_relative_to(real):
            raise WorkspaceRefused(
                f"workspace {workspace} holds the worker's folder {folder} ({variable}), where workers keep the "
                f"command sandbox's seccomp filter or live reply sockets: the model's commands could change them; "
                f"give the worker a {variable} outside the workspace, or choose a workspace below it"
            )
