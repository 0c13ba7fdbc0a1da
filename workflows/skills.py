"""Skills: instructions a run loads on demand instead of carrying them in every prompt.

A skill is `skills/<name>/SKILL.md`, in the workspace or in `DURABLE_AGENT_SKILLS_DIR`,
that starts with front matter naming it and saying when to use it:

    ---
    name: release-notes
    description: How to write release notes for this project
    ---
    (the body: the instructions themselves)

At a run's start an activity lists the skills it can see (recorded once in history); the
model sees their names and descriptions in a system message. `load_skill(name)` returns a
body, recorded once in history, so a later edit of the file cannot change a replay; the
workflow adds it as a `skill` message, which stays in the session layer for the rest of
the run, across compaction, restarts and continue-as-new (the transcript carries it).
Parsing is pure and shared: the activities read files, this module says what they hold.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, Field

from workflows.types import Message, ToolOutcome

SKILL_FILE = "SKILL.md"
SKILLS_FOLDER = "skills"
SKILL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
"""A skill's name is its folder's name: lowercase letters, digits, `.`, `_`, `-`."""
MAX_SKILL_BYTES = 64 * 1024
"""A larger SKILL.md is refused: a skill is instructions, not a corpus (~16k tokens)."""
MAX_DESCRIPTION_CHARS = 1_024
MAX_LISTED_SKILLS = 100

CATALOG_KIND = "skills"
"""Message kind of the system message listing the skills (session layer, workflows/state.py)."""
SKILL_KIND = "skill"
"""Message kind of a loaded skill's body (session layer: never folded by compaction)."""


class SkillError(ValueError):
    """A skill that cannot be listed or loaded; the message is meant for the model."""


class SkillInfo(BaseModel):
    name: str
    description: str
    source: str
    """Where it was found: `workspace` or the skills folder's path."""


class SkillCatalog(BaseModel):
    skills: list[SkillInfo] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    """Skill folders that could not be listed, and why (malformed front matter, ...)."""


class SkillCatalogRequest(BaseModel):
    workspace: str


class SkillFile(BaseModel):
    name: str
    description: str
    body: str


def check_name(name: str) -> str:
    if not SKILL_NAME.match(name):
        raise SkillError(
            f"{name!r} is not a skill name (lowercase letters, digits, '.', '_' or '-', at most 64 characters)"
        )
    return name


def split_front_matter(text: str, where: str) -> tuple[str, str]:
    """(front matter, body) of a file that starts with front matter between '---' lines, as
    skills and agent files (workflows/agents.py) do; SkillError names `where` otherwise."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillError(f"{where}: malformed front matter: the file must start with a '---' line")
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    except StopIteration:
        raise SkillError(f"{where}: malformed front matter: no closing '---' line") from None
    return "\n".join(lines[1:end]), "\n".join(lines[end + 1 :])


def parse_skill(folder_name: str, text: str) -> SkillFile:
    """A SKILL.md's front matter and body, or SkillError saying what is wrong with it."""
    where = f"{SKILLS_FOLDER}/{folder_name}/{SKILL_FILE}"
    header, body = split_front_matter(text, where)
    fields: dict[str, str] = {}
    for number, line in enumerate(header.splitlines(), start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise SkillError(f"{where}: malformed front matter: line {number} is not 'key: value': {line[:80]!r}")
        fields[key.strip()] = value.strip().strip("'\"")
    name, description = fields.get("name", ""), fields.get("description", "")
    if not name or not description:
        missing = [k for k in ("name", "description") if not fields.get(k)]
        raise SkillError(f"{where}: malformed front matter: missing {' and '.join(missing)}")
    if name != folder_name:
        raise SkillError(f"{where}: front matter names {name!r}, but the folder is {folder_name!r}")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillError(f"{where}: description is longer than {MAX_DESCRIPTION_CHARS} characters")
    return SkillFile(name=name, description=description, body=body.strip())


def catalog_text(catalog: SkillCatalog) -> str | None:
    """The system message listing the skills (names and descriptions only), or None."""
    if not catalog.skills:
        return None
    listed = "\n".join(f"- {s.name}: {s.description}" for s in catalog.skills)
    return (
        "Skills available (instructions for specific tasks). When one fits the task, call "
        "load_skill with its name before you start; its instructions then stay in your context.\n" + listed
    )


def skill_message(name: str, body: str) -> str:
    return f"Skill {name!r} (loaded with load_skill; follow these instructions):\n\n{body}"


def already_loaded(name: str, loaded: list[str]) -> ToolOutcome | None:
    """The answer to a second load of the same skill: no activity, no second copy."""
    if name not in loaded:
        return None
    return ToolOutcome(ok=True, output=f"skill {name!r} is already loaded; its instructions are in your context")


def take_loaded_skill(
    step: int, arguments: str, outcome: ToolOutcome, loaded: list[str]
) -> tuple[ToolOutcome, Message | None]:
    """For a successful `load_skill`: the short tool result and the session-layer message
    holding the body (None when the skill was loaded before, e.g. twice in one reply).
    Records the name in `loaded` (the run's carry)."""
    name = json.loads(arguments)["name"]
    repeat = already_loaded(name, loaded)
    if repeat is not None:
        return repeat, None
    loaded.append(name)
    note = ToolOutcome(ok=True, output=f"loaded skill {name!r}; its instructions follow as a system message")
    return note, Message(role="system", content=skill_message(name, outcome.output), step=step, kind=SKILL_KIND)
