"""Where durable-agent keeps the embedded server's database and the CLI's worker logs.

`DURABLE_AGENT_HOME`, default `./.durable-agent` (DESIGN.md §6), created 0700. Without an
encryption key the database holds every run's history in clear, so no workspace may hold
it: its commands and `read_file` would read every run's goals, outputs and secrets. The
working directory is the default workspace root, not a workspace: a run whose workspace
is the working directory itself is refused; one in a folder beside the home is not. Nor
may a workspace hold the worker's temporary folder (`refuse_workspace_holding_worker_state`).
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from activities.host import LIVE_REPLIES_PREFIX
from activities.workspace import WorkspaceError, WorkspaceRefused, resolved

HOME_ENV = "DURABLE_AGENT_HOME"


def home_path() -> Path:
    """The home's real path (it may not exist yet)."""
    return Path(os.path.realpath(os.environ.get(HOME_ENV) or ".durable-agent"))


def refuse_workspace_holding_worker_state(workspace: str) -> None:
    """Refuse a workspace that holds the home, or the temporary folder where each worker of this
    user keeps the sockets that serve its runs' live replies, or lies in those sockets' folder:
    the sandbox binds the workspace read-write, so a command could reach another run's reply."""
    try:
        real = Path(resolved(workspace))
    except WorkspaceError as e:
        raise WorkspaceRefused(str(e)) from None
    home = home_path()
    if home.is_relative_to(real):
        raise WorkspaceRefused(
            f"workspace {workspace} holds durable-agent's home {home} ({HOME_ENV}), where the server keeps every "
            f"run's history: the model's commands could read it; set {HOME_ENV} outside the workspace"
        )
    for variable, folder in (("TMPDIR", tempfile.gettempdir()), ("XDG_RUNTIME_DIR", os.environ.get("XDG_RUNTIME_DIR"))):
        if not folder:
            continue
        held = _resolved_once(folder)
        sockets = held / f"{LIVE_REPLIES_PREFIX}{os.geteuid()}"
        if held.is_relative_to(real) or real.is_relative_to(sockets):
            raise WorkspaceRefused(
                f"workspace {workspace} holds or lies in the worker's folder {folder} ({variable}), where workers "
                f"keep the sockets of their runs' live replies: the model's commands could reach them; give the "
                f"worker a {variable} outside the workspace, or choose another workspace"
            )


@functools.cache
def _resolved_once(folder: str) -> Path:
    """A worker folder's real path: it does not move while the worker runs, and every command checks it."""
    return Path(os.path.realpath(folder))
