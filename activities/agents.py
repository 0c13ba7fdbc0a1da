"""Agent files: find and read `agents/<name>.md` (workflows/agents.py says what they hold).

They live in the workspace's `agents/` folder and in `DURABLE_AGENT_AGENTS_DIR`
(`<dir>/<name>.md`); the workspace's file wins when both have a name, as with skills: the
project's own definition is the one meant for its workspace. A workspace agent file is
resolved like any tool path, so a symlink cannot lead out of the workspace. The CLI's
`durable-agent agents` lists them with the same functions.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.workspace import Workspace, WorkspaceError
from workflows.agents import (
    AGENTS_FOLDER,
    MAX_AGENT_BYTES,
    AgentDefinition,
    AgentFileError,
    AgentRequest,
    agent_path,
    definition_of,
)
from workflows.skills import SkillError, split_front_matter

AGENTS_DIR_ENV = "DURABLE_AGENT_AGENTS_DIR"


@dataclass
class AgentFile:
    """One agent file found: its name, where it was found and its path."""

    name: str
    source: str
    """`workspace`, or the DURABLE_AGENT_AGENTS_DIR folder."""
    path: Path
    shown: str
    """The path as messages and the status show it: `agents/<name>.md` in the workspace."""


def agents_dir() -> str | None:
    return os.environ.get(AGENTS_DIR_ENV) or None


class AgentActivities:
    def __init__(self, folder: str | None = None) -> None:
        self._dir = folder if folder is not None else agents_dir()

    def all(self) -> list[object]:
        return [self.load_agent]

    @activity.defn(name="load_agent")
    async def load_agent(self, request: AgentRequest) -> AgentDefinition:
        """Run by the workflow at a run's start; a bad or unknown file closes the run."""
        try:
            return await asyncio.to_thread(self._load, request.workspace, request.name)
        except (AgentFileError, WorkspaceError) as e:
            raise ApplicationError(str(e), type="AgentFileError", non_retryable=True) from None

    def _load(self, workspace: str, name: str) -> AgentDefinition:
        checked = Workspace(workspace)  # the worker's roots and symlinks, as for every tool
        found = [f for f in agent_files(workspace, self._dir, checked) if f.name == name]
        if not found:
            searched = [f"{AGENTS_FOLDER}/ in the workspace {workspace}", *([self._dir] if self._dir else [])]
            raise AgentFileError(
                f"unknown agent {name!r}: no {agent_path(name)} in {' or '.join(searched)}"
                + ("" if self._dir else f" ({AGENTS_DIR_ENV} is not set)")
            )
        file = found[0]
        if file.source == "workspace":
            file.path = checked.resolve(file.shown)  # a symlink out of the workspace is refused
        return read_agent(file)


def agent_files(workspace: str | None, folder: str | None, checked: Workspace | None = None) -> list[AgentFile]:
    """Every agent file, the workspace's first; a name found twice is listed twice (the first
    one is used). `checked`: the workspace as the worker checked it (its roots, a symlinked
    `agents` folder refused)."""
    files: list[AgentFile] = []
    for source, root in _roots(workspace, folder, checked):
        for path in sorted(root.glob("*.md")):
            name = path.name[: -len(".md")]
            shown = agent_path(name) if source == "workspace" else str(path)
            files.append(AgentFile(name=name, source=source, path=path, shown=shown))
    return files


def _roots(workspace: str | None, folder: str | None, checked: Workspace | None) -> list[tuple[str, Path]]:
    roots: list[tuple[str, Path]] = []
    if workspace is not None and checked is None:
        roots.append(("workspace", Path(workspace) / AGENTS_FOLDER))
    elif checked is not None:
        try:
            roots.append(("workspace", checked.resolve(AGENTS_FOLDER)))
        except WorkspaceError:
            pass  # the agents folder is a symlink out of the workspace: not looked in
    if folder:
        roots.append((folder, Path(folder)))
    return [(source, root) for source, root in roots if root.is_dir()]


def read_agent(file: AgentFile) -> AgentDefinition:
    """The file's definition, or AgentFileError naming the file and what is wrong."""
    size = file.path.stat().st_size
    if size > MAX_AGENT_BYTES:
        raise AgentFileError(f"{file.shown}: {size:,} bytes, over the {MAX_AGENT_BYTES:,} byte limit")
    try:
        text = file.path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AgentFileError(f"{file.shown}: not UTF-8 text") from None
    try:
        header, body = split_front_matter(text, file.shown)
    except SkillError as e:
        raise AgentFileError(str(e)) from None
    return definition_of(file.name, file.shown, _front_matter(header, file.shown), body)


def _front_matter(header: str, shown: str) -> dict[str, Any]:
    """The front matter as YAML: lists (`tools: [a, b]`) and sections (`limits:` with indented fields)."""
    try:
        parsed = yaml.safe_load(header)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 2}" if where is not None else ""
        raise AgentFileError(f"{shown}: malformed front matter{line}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(parsed, dict):
        raise AgentFileError(f"{shown}: malformed front matter: expected 'key: value' lines")
    return {str(k): v for k, v in parsed.items()}
