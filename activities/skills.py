"""The skill activities: list the skills a run can see, and read one (workflows/skills.py).

Skills live in `<workspace>/skills/<name>/SKILL.md` and in `DURABLE_AGENT_SKILLS_DIR`
(`<dir>/<name>/SKILL.md`); the workspace's copy wins when both have a name. A workspace
skill path is opened beneath the workspace's descriptor like any file tool path, so a symlink
cannot lead out of the workspace.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from temporalio import activity

from activities.beneath import open_regular_beneath, resolve
from activities.regular_files import NotRegularFile, fdopen_regular
from activities.workspace import Workspace, WorkspaceError
from workflows.skills import (
    MAX_LISTED_SKILLS,
    MAX_SKILL_BYTES,
    SKILL_FILE,
    SKILLS_FOLDER,
    SkillCatalog,
    SkillCatalogRequest,
    SkillError,
    SkillFile,
    SkillInfo,
    check_name,
    parse_skill,
)
from workflows.tool_specs import ToolArgumentError, validate_arguments
from workflows.types import ToolCallInput, ToolOutcome

SKILLS_DIR_ENV = "DURABLE_AGENT_SKILLS_DIR"


class SkillActivities:
    def __init__(self, skills_dir: str | None = None) -> None:
        self._skills_dir = skills_dir if skills_dir is not None else os.environ.get(SKILLS_DIR_ENV) or None

    def all(self) -> list[object]:
        return [self.discover_skills, self.load_skill]

    @activity.defn(name="discover_skills")
    async def discover_skills(self, request: SkillCatalogRequest) -> SkillCatalog:
        return await asyncio.to_thread(self._catalog, request.workspace)

    @activity.defn(name="load_skill")
    async def load_skill(self, input: ToolCallInput) -> ToolOutcome:
        try:
            name = check_name(validate_arguments("load_skill", input.arguments).name)  # type: ignore[attr-defined]
            skill = await asyncio.to_thread(self._read, input.workspace, name)
        except (SkillError, WorkspaceError, ToolArgumentError) as e:
            return ToolOutcome(ok=False, error=str(e))
        return ToolOutcome(ok=True, output=skill.body, output_bytes=len(skill.body.encode()))

    @contextmanager
    def _roots(self, workspace: str) -> Iterator[list[_SkillsFolder]]:
        """The folders holding skill folders, opened, the workspace's first."""
        with ExitStack() as stack:
            roots: list[_SkillsFolder] = []
            try:
                place = Workspace(workspace)
                root_fd = stack.enter_context(place.opened())
                with resolve(root_fd, SKILLS_FOLDER, place.aliases, SKILLS_FOLDER) as found:
                    fd = os.open(found.name, _OPEN_DIR | os.O_NOFOLLOW, dir_fd=found.parent_fd)
                stack.callback(os.close, fd)
                roots.append(_SkillsFolder("workspace", fd, root_fd, place.aliases))
            except (WorkspaceError, OSError):
                pass  # no usable workspace skills folder (a symlink out of it is ignored)
            if self._skills_dir:
                try:
                    fd = os.open(self._skills_dir, _OPEN_DIR)
                    stack.callback(os.close, fd)
                    roots.append(_SkillsFolder(self._skills_dir, fd))
                except OSError:
                    pass
            yield roots

    def _catalog(self, workspace: str) -> SkillCatalog:
        catalog = SkillCatalog()
        seen: set[str] = set()
        with self._roots(workspace) as roots:
            for root in roots:
                for name in root.names():
                    if name in seen:
                        continue
                    try:
                        skill = root.read(name)
                    except _NO_SKILL:
                        continue
                    except (SkillError, WorkspaceError, OSError) as e:
                        catalog.problems.append(str(e))
                        continue
                    seen.add(name)
                    catalog.skills.append(SkillInfo(name=skill.name, description=skill.description, source=root.source))
        if len(catalog.skills) > MAX_LISTED_SKILLS:
            catalog.problems.append(f"{len(catalog.skills)} skills found; only the first {MAX_LISTED_SKILLS} listed")
            catalog.skills = catalog.skills[:MAX_LISTED_SKILLS]
        return catalog

    def _read(self, workspace: str, name: str) -> SkillFile:
        with self._roots(workspace) as roots:
            for root in roots:
                try:
                    return root.read(name)
                except _NO_SKILL:
                    continue
            searched = ", ".join(_where(root.source) for root in roots)
        raise SkillError(f"unknown skill {name!r} (searched: {searched or 'no skills folder exists'})")


def _where(source: str) -> str:
    return f"{SKILLS_FOLDER}/ in the workspace" if source == "workspace" else source


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NO_SKILL = (FileNotFoundError, NotADirectoryError, IsADirectoryError, NotRegularFile)
"""A folder without a SKILL.md file is not a skill: skipped, not a problem."""


@dataclass(frozen=True)
class _SkillsFolder:
    """An opened folder of skill folders. In the workspace (`root_fd` set) a SKILL.md is
    opened beneath the workspace's descriptor (activities/beneath.py), so a command swapping
    a skill's folder for a symlink cannot make a skill read from outside, however it races."""

    source: str
    fd: int
    root_fd: int | None = None
    aliases: tuple[str, ...] = ()

    def names(self) -> list[str]:
        with os.scandir(self.fd) as scan:
            return sorted(entry.name for entry in scan)

    def read(self, name: str) -> SkillFile:
        if self.root_fd is None:
            fd = os.open(f"{name}/{SKILL_FILE}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        else:
            shown = f"{SKILLS_FOLDER}/{name}/{SKILL_FILE}"
            fd = open_regular_beneath(self.root_fd, shown, self.aliases, shown)
        with fdopen_regular(fd, f"{name}/{SKILL_FILE}") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(MAX_SKILL_BYTES + 1)
        if max(size, len(data)) > MAX_SKILL_BYTES:
            raise SkillError(f"skill {name!r}: {SKILL_FILE} is {size:,} bytes, over the {MAX_SKILL_BYTES:,} byte limit")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"skill {name!r}: {SKILL_FILE} is not UTF-8 text") from None
        return parse_skill(name, text)
