"""Agent definitions: a named agent in a file, `agents/<name>.md`, run with input `agent`.

An agent file has the front-matter form of a skill (workflows/skills.py) and its body is the
system prompt:

    ---
    description: Reviews a change and reports problems; never edits
    model: gpt-4.1
    tools: [read_file, list_files, search_files]
    preset: report
    ---
    You are a careful reviewer. ...

At a run's start the `load_agent` activity (activities/agents.py) reads the file and
records what it says in history once, so a later edit of the file cannot change a replay;
the workflow then lays the input over it (`effective_input`) and runs with the result,
which continue-as-new carries. Parsing and merging are pure and live here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from workflows.types import AgentInput
from workflows.validation_text import validation_text

AGENTS_FOLDER = "agents"
MAX_AGENT_BYTES = 64 * 1024
"""A larger file is refused: its body is a system prompt, sent with every model call."""
MAX_DESCRIPTION_CHARS = 1_024

PARENT_BOUNDS = ("tools", "approval", "limits")
"""A delegate's input fields that bound its agent file instead of giving way to it."""


class AgentFileError(ValueError):
    """An agent file that cannot be used, or an unknown agent; the message names the file
    and the field."""


def agent_path(name: str) -> str:
    """Where a workspace's agent file lies, relative to the workspace (in DURABLE_AGENT_AGENTS_DIR
    it is `<dir>/<name>.md`)."""
    return f"{AGENTS_FOLDER}/{name}.md"


class AgentFrontMatter(BaseModel):
    """What an agent file's front matter may say. The fields shaped like the input's are
    checked against `AgentInput` itself (`definition_of`), so a file accepts exactly what
    the input does; here only the names and the file's own fields are checked."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS)
    model: Any = None
    fallback_model: Any = None
    tools: Any = None
    activity_tools: Any = None
    mcp_servers: Any = None
    limits: dict[str, Any] | None = None
    preset: str | None = None
    """A named set of limits (`Limits.preset`); fields of `limits` beside it win."""
    approval: Any = None
    context: Any = None
    success_criteria: Any = None
    check_command: Any = None

    @field_validator("tools", "mcp_servers", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        # `tools: read_file, list_files`, as Claude Code's agent files write it, is a list too.
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    def input_fields(self, body: str) -> dict[str, Any]:
        """The `AgentInput` fields this file sets: only those it names, and its body."""
        fields = self.model_dump(exclude_unset=True, exclude={"description", "preset"})
        if self.preset is not None:
            fields["limits"] = {"preset": self.preset, **(self.limits or {})}
        if body.strip():
            fields["system_prompt"] = body.strip()
        return fields


class AgentRequest(BaseModel):
    """Input of `load_agent`."""

    workspace: str
    name: str


class AgentDefinition(BaseModel):
    """An agent file as read at a run's start: `load_agent`'s result, recorded in history."""

    name: str
    description: str
    path: str
    """The file read, for messages and the run's status: `agents/<name>.md` in the workspace, or
    the full path of one in DURABLE_AGENT_AGENTS_DIR."""
    fields: dict[str, Any]
    """The `AgentInput` fields it sets (its body as `system_prompt`), already validated."""


def definition_of(name: str, path: str, front_matter: dict[str, Any], body: str) -> AgentDefinition:
    """A parsed file's definition, or AgentFileError naming the file and the field."""
    try:
        header = AgentFrontMatter.model_validate(front_matter)
        fields = header.input_fields(body)
        AgentInput.model_validate({"goal": "-", "workspace": "/", **fields})
    except ValidationError as e:
        raise AgentFileError(f"{path}: {validation_text(e)}") from None
    return AgentDefinition(name=name, description=header.description, path=path, fields=fields)


def effective_input(given: AgentInput, definition: AgentDefinition) -> AgentInput:
    """The run's input: the fields given in the input (`model_fields_set`) over the file's.

    For a delegate (`given.parent` set) the input comes from its parent, not from a person:
    the file's fields win, except that its tools are only those the parent has too, its
    approval gates are added to the parent's, and its limits are the parent's share."""
    top = given.model_dump(exclude_unset=True)
    base = dict(definition.fields)
    if given.parent is not None:
        top = _within_parent(top, base)
        base.pop("limits", None)
    try:
        return AgentInput.model_validate(_overlay(base, top))
    except ValidationError as e:
        raise AgentFileError(f"{definition.path} with the run's input: {validation_text(e)}") from None


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`; a section both give (`limits`, `approval`, `context`) merges field by field."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        merged[key] = {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
    return merged


def _within_parent(top: dict[str, Any], file: dict[str, Any]) -> dict[str, Any]:
    bounded = {k: v for k, v in top.items() if k not in file or k in PARENT_BOUNDS}
    allowed = top.get("tools")
    if file.get("tools") is not None and allowed is not None:
        bounded["tools"] = [t for t in file["tools"] if t in allowed]
    if file.get("approval"):
        mine, theirs = top.get("approval") or {}, file["approval"]
        bounded["approval"] = {
            **mine,
            "tools": _union(mine.get("tools", []), theirs.get("tools", [])),
            "commands": _union(mine.get("commands", []), theirs.get("commands", [])),
        }
    return bounded


def _union(first: list[str], second: list[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))
