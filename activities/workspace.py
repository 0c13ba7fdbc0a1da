"""Which folders may be workspaces, and keeps every tool path inside its workspace.

A workspace must lie in one of the worker's workspace roots (`DURABLE_AGENT_WORKSPACE_ROOTS`,
folders separated by `os.pathsep`; default the worker's working directory), and never be
`/` or a system folder. The model names paths; `Workspace.relative` checks them lexically and the file tools then
open them through the workspace's folder descriptor (`Workspace.opened`,
activities/beneath.py), where no symlink swapped in by a racing command can lead out.
`Workspace.resolve` (list_files, search_files, skills) still resolves a path by name,
then uses it: it guards against mistaken models, not against a process racing it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RESERVED_DIR = ".durable-agent"
"""Holds the tool journal and full outputs; the model may read it but never write it."""

ROOTS_ENV = "DURABLE_AGENT_WORKSPACE_ROOTS"
SYSTEM_FOLDERS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
    "/proc", "/run", "/sbin", "/sys", "/usr", "/var",
)  # fmt: skip
"""Never a workspace, nor anything inside them, whatever the roots say (and never `/`)."""


class WorkspaceError(Exception):
    """A path the tools refuse; the message is written for the model."""


class WorkspaceRefused(WorkspaceError):
    """The workspace itself is not allowed on this worker; no tool may run in it."""


def workspace_roots() -> list[str]:
    """The worker's workspace roots, as real paths."""
    listed = os.environ.get(ROOTS_ENV, "")
    return [os.path.realpath(r) for r in listed.split(os.pathsep) if r] or [os.path.realpath(os.getcwd())]


def resolved(folder: str) -> str:
    """`os.path.realpath`, raising WorkspaceError where a folder on the path was swapped between
    its `lstat` and `readlink` (Python 3.11 lets that EINVAL out)."""
    try:
        return os.path.realpath(folder)
    except OSError as e:
        raise WorkspaceError(
            f"workspace {folder} cannot be resolved: {e.strerror}; a folder on its path changed"
        ) from None


def check_allowed(folder: str, roots: list[str], real: str | None = None) -> None:
    """Raise WorkspaceRefused unless `folder` resolves inside a root and outside system folders;
    `real`: the path it resolved to, as its user will use it (resolving again could give
    another, should a folder on its way be swapped for a symlink meanwhile)."""
    real = real or resolved(folder)
    if real == "/" or any(_under_resolved(real, s) for s in _system_folders()):
        raise WorkspaceRefused(f"workspace {folder} resolves to {real}: a system folder is never a workspace")
    if not any(_under_resolved(real, root) for root in roots):
        raise WorkspaceRefused(
            f"workspace {folder} resolves to {real}, outside the worker's workspace roots {roots}; "
            f"the worker's operator sets them with {ROOTS_ENV} (separated by {os.pathsep!r})"
        )
    reserved = os.path.join(real, RESERVED_DIR)
    if os.path.islink(reserved) or (os.path.lexists(reserved) and not os.path.isdir(reserved)):
        raise WorkspaceRefused(
            f"workspace {folder}: {RESERVED_DIR} is a symlink or a file; durable-agent keeps its journal "
            "there and refuses this workspace until it is removed"
        )


@functools.cache
def _system_folders() -> tuple[str, ...]:
    """SYSTEM_FOLDERS as named and as resolved (`/lib` may be a link to `/usr/lib`); once per
    process, since every tool call checks its workspace."""
    return tuple(dict.fromkeys([*SYSTEM_FOLDERS, *map(os.path.realpath, SYSTEM_FOLDERS)]))


class Workspace:
    """A workspace folder whose own symlinks are resolved once, up front."""

    def __init__(self, folder: str, roots: list[str] | None = None) -> None:
        """`roots`: where workspaces may lie; default `workspace_roots()`."""
        self.given = os.path.abspath(folder)
        self.root = resolved(folder)
        check_allowed(folder, roots if roots is not None else workspace_roots(), real=self.root)
        if not os.path.isdir(self.root):
            raise WorkspaceError(f"workspace folder does not exist: {folder}")

    @property
    def aliases(self) -> tuple[str, ...]:
        """The absolute paths of the workspace (as given and resolved): an absolute path or
        symlink target under one of them lies inside."""
        return (self.given, self.root)

    @contextmanager
    def opened(self) -> Iterator[int]:
        """The workspace's folder descriptor, every file tool path is resolved under it."""
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def relative(self, path: str, *, for_write: bool = False) -> str:
        """`path` as a normalized path relative to the workspace, checked lexically: no NUL,
        no `..` above the workspace, an absolute path only inside it; for a write, not the
        workspace itself and not under `.durable-agent/`. Symlinks are the kernel's to
        check, when the path is opened (activities/beneath.py)."""
        if "\0" in path:
            raise WorkspaceError(f"path contains a NUL byte: {path!r}")
        if os.path.isabs(path):
            normal = os.path.normpath(path)
            inside = [alias for alias in self.aliases if _inside(normal, alias)]
            if not inside:
                raise WorkspaceError(f"path is outside the workspace: {path} (use a path relative to the workspace)")
            relative = os.path.relpath(normal, inside[0])
        else:
            relative = os.path.normpath(path or ".")
            if relative == ".." or relative.startswith("../"):
                raise WorkspaceError(f"path escapes the workspace: {path}")
        if for_write and relative == ".":
            raise WorkspaceError(f"{path!r} names the workspace folder itself; give the path of a file in it")
        if for_write and relative.split("/")[0] == RESERVED_DIR:
            raise WorkspaceError(
                f"{path} is inside {RESERVED_DIR}/, where durable-agent keeps its journal and "
                "saved outputs; write somewhere else"
            )
        return relative

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
            return f"path escapes the workspace through a symlink: {path}"  # never where to: a host path
        if os.path.isabs(path):
            return f"path is outside the workspace: {path} (use a path relative to the workspace)"
        return f"path escapes the workspace: {path}"


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _under_resolved(real: str, folder: str) -> bool:
    """`_inside` for a path `os.path.realpath` gave and a folder as it gives them (absolute,
    no `.`, `..` or doubled slashes): a prefix test, far cheaper than `commonpath` on the
    check every tool call makes."""
    if not folder.startswith("/"):
        return False  # a root given relative or empty holds nothing (commonpath raised)
    return real == folder or real.startswith(folder if folder.endswith("/") else folder + "/")
