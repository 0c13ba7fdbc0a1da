"""Keeps every tool path inside its workspace (DESIGN §5).

The model names paths; `Workspace.resolve` turns them into real paths or refuses with a
message the model can act on. This guards against mistaken and confused models, not
against a hostile process racing the tools on the same files: a symlink swapped in
between the check and the use would win.
"""

from __future__ import annotations

import os
from pathlib import Path

RESERVED_DIR = ".durable-agent"
"""Holds the tool journal and full outputs; the model may read it but never write it."""


class WorkspaceError(Exception):
    """A path the tools refuse; the message is written for the model."""


class Workspace:
    """A workspace folder whose own symlinks are resolved once, up front."""

    def __init__(self, folder: str) -> None:
        self.given = os.path.abspath(folder)
        self.root = os.path.realpath(folder)
        if not os.path.isdir(self.root):
            raise WorkspaceError(f"workspace folder does not exist: {folder}")

    def resolve(self, path: str, *, for_write: bool = False) -> Path:
        """The real path behind `path`, refusing anything that ends up outside the workspace.

        Relative paths are taken from the workspace; an absolute path is fine when it lies
        inside. Symlinks are followed in every component, the last one included, even
        when their target does not exist yet (a write would create it outside).
        """
        if "\0" in path:
            raise WorkspaceError(f"path contains a NUL byte: {path!r}")
        joined = os.path.join(self.given, path)
        real = os.path.realpath(joined)
        if not self.contains(real):
            raise WorkspaceError(self._escape_message(path, joined, real))
        if for_write and _inside(real, os.path.join(self.root, RESERVED_DIR)):
            raise WorkspaceError(
                f"{path} is inside {RESERVED_DIR}/, where durable-agent keeps its journal and "
                "saved outputs; write somewhere else"
            )
        return Path(real)

    def contains(self, real_path: str | Path) -> bool:
        return _inside(os.fspath(real_path), self.root)

    def display(self, real_path: str | Path) -> str:
        """How the model should see a path: relative to the workspace."""
        return os.path.relpath(real_path, self.root)

    def _escape_message(self, path: str, joined: str, real: str) -> str:
        lexical = os.path.normpath(joined)
        if _inside(lexical, self.given) or _inside(lexical, self.root):
            return f"path escapes the workspace through a symlink: {path} (resolves to {real})"
        if os.path.isabs(path):
            return f"path is outside the workspace: {path} (use a path relative to the workspace)"
        return f"path escapes the workspace: {path}"


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root
