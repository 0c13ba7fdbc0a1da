"""What each tool accepts: argument models, descriptions, and the OpenAI function schemas.

Pure and deterministic, so the workflow can reject malformed model output (bad JSON,
unknown tool, missing argument) without scheduling an activity, and the activities can
re-validate what they receive with the very same models.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workflows.plan import PlanArgs
from workflows.types import AGENT_NAME, ALL_TOOLS, HOST_NAME, ToolCall
from workflows.visible import one_line


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReadFileArgs(_Args):
    path: str = Field(description="File path relative to the workspace.")
    offset: int | None = Field(default=None, ge=1, description="First line to read, 1-based.")
    limit: int | None = Field(default=None, ge=1, description="Number of lines to read.")


class WriteFileArgs(_Args):
    path: str = Field(description="File path relative to the workspace; parent folders are created.")
    content: str = Field(description="The whole new content of the file.")


class EditFileArgs(_Args):
    path: str = Field(description="File path relative to the workspace.")
    old_text: str = Field(min_length=1, description="Exact text to replace; must occur in the file.")
    new_text: str = Field(description="Replacement text.")
    replace_all: bool = Field(
        default=False, description="Replace every occurrence; otherwise old_text must occur exactly once."
    )


class ListFilesArgs(_Args):
    path: str = Field(default=".", description="Folder relative to the workspace.")
    pattern: str | None = Field(default=None, description="Glob pattern such as '**/*.py'.")


class SearchFilesArgs(_Args):
    pattern: str = Field(min_length=1, description="Regular expression to search for.")
    path: str = Field(default=".", description="Folder or file relative to the workspace.")
    glob: str | None = Field(default=None, description="Only search files matching this glob, e.g. '*.py'.")


class RunCommandArgs(_Args):
    command: str = Field(min_length=1, description="Shell command, run with bash in the workspace.")
    timeout_s: float | None = Field(
        default=None, gt=0, le=3600, description="Seconds before the command is killed (default 120)."
    )


STEP_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class RecallArgs(_Args):
    steps: str | None = Field(default=None, description="Folded steps to return, e.g. '12' or '5-9'.")
    query: str | None = Field(
        default=None, min_length=1, description="Text to search for (case-insensitive) in the folded steps."
    )

    @field_validator("steps", mode="before")
    @classmethod
    def _range(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and not STEP_RANGE.match(value):
            raise ValueError("steps must be a step number or a range such as '5-9'")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> RecallArgs:
        if self.steps is None and self.query is None:
            raise ValueError("give steps (e.g. '5-9') or query")
        return self

    def step_range(self) -> tuple[int, int] | None:
        if self.steps is None:
            return None
        match = STEP_RANGE.match(self.steps)
        assert match is not None  # validated above
        first = int(match.group(1))
        last = int(match.group(2) or first)
        return (min(first, last), max(first, last))


class LoadSkillArgs(_Args):
    name: str = Field(min_length=1, description="The skill's name, as listed in the system message.")


class DelegateArgs(_Args):
    goal: str = Field(min_length=1, description="The sub-task, stated fully: the delegate sees nothing else of yours.")
    tools: list[str] | None = Field(
        default=None, description="The tools the delegate may use (a subset of yours); all of yours by default."
    )
    budget_share: float | None = Field(
        default=None, gt=0, le=1, description="Fraction of your remaining budget it may spend (default 0.5)."
    )
    agent: str | None = Field(
        default=None,
        pattern=AGENT_NAME,
        description="An agent definition (agents/<name>.md) for the delegate to run: its prompt, model and tools.",
    )
    host: str | None = Field(
        default=None,
        pattern=HOST_NAME,
        description="The host its tools run on, in the folder at your workspace's path there; yours by default.",
    )


TOOL_ARGS: dict[str, type[BaseModel]] = {
    "read_file": ReadFileArgs,
    "write_file": WriteFileArgs,
    "edit_file": EditFileArgs,
    "list_files": ListFilesArgs,
    "search_files": SearchFilesArgs,
    "run_command": RunCommandArgs,
    "recall": RecallArgs,
    "load_skill": LoadSkillArgs,
    "delegate": DelegateArgs,
    "plan": PlanArgs,
}

TOOL_DESCRIPTIONS: dict[str, str] = {
    "read_file": "Read a text file from the workspace, optionally a range of lines. Lines are numbered.",
    "write_file": "Create or overwrite a file in the workspace.",
    "edit_file": "Replace exact text in a workspace file.",
    "list_files": "List files under a workspace folder, optionally filtered by a glob.",
    "search_files": "Search workspace files for a regular expression; returns path:line: text.",
    "run_command": "Run a shell command in the workspace; returns exit code, stdout and stderr. The shell "
    "persists between calls, like a terminal: the working directory (`cd`) and exported variables carry over to "
    "the next command. Processes a command leaves running are stopped when it ends.",
    "recall": "Return earlier steps that were folded out of your context, verbatim: by step range or by search.",
    "load_skill": "Load a skill's instructions (see the listed skills) into your context for the rest of the run.",
    "delegate": "Hand a self-contained sub-task to a sub-agent with its own context; returns its summary and "
    "answer. Several delegate calls in one reply run in parallel.",
    "plan": "Keep your task list: send all items (each required or optional, with its status) to replace it, "
    "or no items to read it. Optional items are dropped first when budgets run low.",
}

FRESH_RUN_COMMAND = (
    "Run a shell command in the workspace; returns exit code, stdout and stderr. Every command starts afresh in "
    "the workspace folder: `cd` and exported variables do not carry over to the next command."
)
"""run_command's description in a run whose shell is fresh (workflows/shell.py)."""

if not set(TOOL_ARGS) == set(ALL_TOOLS) == set(TOOL_DESCRIPTIONS):
    raise RuntimeError("every tool in ALL_TOOLS needs an argument model and a description")


class ToolArgumentError(ValueError):
    """The model's tool call cannot be run as given; the message is meant for the model."""


def parse_tool_call(name: str, raw_arguments: str, enabled: list[str]) -> BaseModel:
    """Parse and validate one call of a built-in tool, or raise ToolArgumentError with a clear message."""
    return validate_arguments(name, decode_arguments(name, raw_arguments, enabled))


def decode_arguments(name: str, raw_arguments: str, enabled: list[str]) -> dict[str, Any]:
    """The call's arguments as a JSON object, or ToolArgumentError. A tool beyond the built-ins
    validates them itself, against its own model (activities/user_tools.py) or its own code."""
    if name not in enabled:
        raise ToolArgumentError(f"unknown tool {name!r}; available tools: {', '.join(enabled)}")
    try:
        decoded = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as e:
        raise ToolArgumentError(f"arguments for {name} are not valid JSON ({e.msg} at position {e.pos})") from e
    except RecursionError:
        raise ToolArgumentError(f"arguments for {name} are nested too deeply to read") from None
    if not isinstance(decoded, dict):
        raise ToolArgumentError(f"arguments for {name} must be a JSON object, got {type(decoded).__name__}")
    try:
        json.dumps(decoded, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise ToolArgumentError(
            f"arguments for {name} hold an unpaired UTF-16 surrogate (a \\ud800-\\udfff escape "
            "without its pair), which is not text; write the character itself"
        ) from None
    return decoded


def unique_call_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls with ids unique within the reply. Some endpoints repeat an id or send none;
    an id names the call's journal entry and its result, so a repeated or empty one gets
    `<id>-<index>` (the call's position), deterministically, before anything is recorded."""
    taken = {call.id for call in calls}
    seen: set[str] = set()
    unique: list[ToolCall] = []
    for index, call in enumerate(calls):
        new_id = call.id
        if not new_id or new_id in seen:
            new_id = f"{call.id or 'call'}-{index}"
            while new_id in taken or new_id in seen:
                new_id += "x"
        seen.add(new_id)
        unique.append(call if new_id == call.id else call.model_copy(update={"id": new_id}))
    return unique


def validate_arguments(name: str, arguments: dict[str, Any]) -> BaseModel:
    try:
        return TOOL_ARGS[name].model_validate(arguments)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in e.errors()
        )
        raise ToolArgumentError(f"bad arguments for {name}: {problems}") from e


def openai_tool_schemas(names: list[str]) -> list[dict[str, Any]]:
    return [function_schema(name) for name in names]


@functools.cache
def function_schema(name: str) -> dict[str, Any]:
    """Built once per tool: pydantic's schema generation is ~1 ms a tool, on every model call.
    Shared by every request: callers serialize it and never change it."""
    return {
        "type": "function",
        "function": {"name": name, "description": TOOL_DESCRIPTIONS[name], "parameters": _schema(TOOL_ARGS[name])},
    }


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


SUMMARY_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "run_command": ("command",),
    "search_files": ("pattern", "path"),
    "list_files": ("path", "pattern"),
    "recall": ("steps", "query"),
    "load_skill": ("name",),
    "delegate": ("goal",),
}
"""The arguments that say what a call does, in the order shown; other tools show `path`."""


SUMMARY_MAX_CHARS = 120
"""What the Web UI's event list shows of a call on one line."""
SUMMARY_MAX_BYTES = 200
"""Temporal documents summaries (user metadata) as single lines of at most 200 bytes."""


CUT_SUMMARY = re.compile(r"…( \(\+[\d,]+ chars, see details\))?$")
"""How a cut summary ends (a bare `…` in runs recorded before it said how much it left out)."""


def call_summary(name: str, arguments: dict[str, Any], limit: int = SUMMARY_MAX_CHARS) -> str:
    """One line for the Web UI and the CLI: `run_command: pytest -q`, escaped
    (workflows/visible.py) and at most `limit` characters; approvals show the whole call
    (`approval_view`). A cut line says so and how much it left out, so an operator reading
    only the summary knows the tail of a long command is in the call's details (its input)."""
    keys = SUMMARY_ARGUMENTS.get(name, ("path",))
    detail = one_line(" ".join(str(arguments[k]) for k in keys if arguments.get(k) not in (None, "")))
    text = f"{name}: {detail}" if detail else name
    if len(text) <= limit and len(text.encode()) <= SUMMARY_MAX_BYTES:
        return text
    kept = limit
    while True:
        line = f"{text[:kept]}… (+{len(text) - kept:,} chars, see details)"
        if len(line) <= limit and len(line.encode()) <= SUMMARY_MAX_BYTES:
            return line
        kept = min(kept - 1, kept - (len(line) - limit))
