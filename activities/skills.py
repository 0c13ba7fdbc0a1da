"""The skill activities: list the skills a run can see, and read one (workflows/skills.py).

Skills live in `<workspace>/skills/<name>/SKILL.md` and in `DURABLE_AGENT_SKILLS_DIR`
(`<dir>/<name>/SKILL.md`); the workspace's copy wins when both have a name. A workspace
skill path is resolved like any tool path, so a symlink cannot lead out of the workspace.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from temporalio import activity

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

    def _roots(self, workspace: str) -> list[tuple[str, Path]]:
        """(source, folder holding skill folders), the workspace's first."""
        roots: list[tuple[str, Path]] = []
        try:
            roots.append(("workspace", Workspace(workspace).resolve(SKILLS_FOLDER)))
        except WorkspaceError:
            pass  # no usable workspace skills folder (a symlink out of it is ignored)
        if self._skills_dir:
            roots.append((self._skills_dir, Path(self._skills_dir)))
        return [(source, folder) for source, folder in roots if folder.is_dir()]

    def _catalog(self, workspace: str) -> SkillCatalog:
        catalog = SkillCatalog()
        seen: set[str] = set()
        for source, folder in self._roots(workspace):
            for entry in sorted(folder.iterdir()):
                if entry.name in seen or not (entry / SKILL_FILE).is_file():
                    continue
                try:
                    skill = self._parse(workspace, source, entry)
                except (SkillError, WorkspaceError, OSError) as e:
                    catalog.problems.append(str(e))
                    continue
                seen.add(entry.name)
                catalog.skills.append(SkillInfo(name=skill.name, description=skill.description, source=source))
        if len(catalog.skills) > MAX_LISTED_SKILLS:
            catalog.problems.append(f"{len(catalog.skills)} skills found; only the first {MAX_LISTED_SKILLS} listed")
            catalog.skills = catalog.skills[:MAX_LISTED_SKILLS]
        return catalog

    def _read(self, workspace: str, name: str) -> SkillFile:
        roots = self._roots(workspace)
        for source, folder in roots:
            if (folder / name / SKILL_FILE).is_file():
                return self._parse(workspace, source, folder / name)
        searched = ", ".join(f"{SKILLS_FOLDER}/ in the workspace" if s == "workspace" else s for s, _ in roots)
        raise SkillError(f"unknown skill {name!r} (searched: {searched or 'no skills folder exists'})")

    def _parse(self, workspace: str, source: str, folder: Path) -> SkillFile:
        path = folder / SKILL_FILE
        if source == "workspace":
            path = Workspace(workspace).resolve(str(path))  # no symlink out of the workspace
        size = path.stat().st_size
        if size > MAX_SKILL_BYTES:
            raise SkillError(
                f"skill {folder.name!r}: {SKILL_FILE} is {size:,} bytes, over the {MAX_SKILL_BYTES:,} byte limit"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"skill {folder.name!r}: {SKILL_FILE} is not UTF-8 text") from None
        return parse_skill(folder.name, text)
