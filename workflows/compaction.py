"""Compaction as pure decisions: what to fold, the index of it, the summary's request,
validation and fallback, and what the model is then sent.

The workflow calls these; the model call that writes the summary and the archive write
are activities. Steps fold whole (an assistant message, its tool results and the notes of
that step share the step number), so a tool call is never split from its result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from workflows.context import RECORD_ONLY_KINDS, estimate_tokens, model_context
from workflows.state import (
    SESSION_KINDS,
    CommandRun,
    Compaction,
    FoldedStep,
    FoldIndex,
    IndexDigest,
    ModelView,
    StructuredSummary,
)
from workflows.types import NOT_RUN, ContextSettings, Message

INDEX_STEP_LINES = 40
"""Folded steps the index shows a line for, at most; older ones are counted in its digest."""
SUMMARY_SHARE = 0.15
INDEX_SHARE = 0.10
RECALL_SHARE = 0.25
"""Shares of `max_context_tokens` the summary, the index and a recall may take (at ~4 chars a token):
what is left for the steps decides how often compaction runs."""
INDEX_FILES = 30
"""Files the digest names (the most recently touched)."""
SUMMARY_ITEMS = 12
"""Items kept per summary list; merging keeps the newest."""
ITEM_CHARS = 300
COMPACTIONS_SHOWN = 10
"""Compactions listed in status; the counters count them all."""
SUMMARY_PROMPT = (
    "You summarise an AI agent's earlier work so that it can continue without the full "
    "transcript. Reply with one JSON object and nothing else, with exactly these keys: "
    '"goal" (string: the goal and the current sub-goal), "inputs" (list of strings: files '
    'read, user instructions, facts learned), "outputs" (list of strings: files written, '
    'commands run and their results), "key_decisions" (list of strings), "open_issues" '
    "(list of strings: errors not yet fixed, work not yet done). Merge the previous summary "
    "with the new steps; keep every name, number and path that later work may need."
)
"""The summarising call's system prompt. Its first words also let a stub tell it apart."""
_EXIT_CODE = re.compile(r"^exit code: (-?\d+)")
"""How a `run_command` result starts (activities/tools/command.py)."""
FILE_TOOLS = frozenset({"read_file", "write_file", "edit_file"})
ARCHIVE_ROOT = ".durable-agent/archive"
"""Under the workspace's reserved folder (activities/sandbox.py), which tools never write."""
TARGET_FILL = 0.7
"""When the last `keep_recent_steps` alone would not fit, fewer are kept, down to one, until
the request fits in this share of `max_context_tokens`: room for the steps that follow."""


def run_folder(workflow_id: str, first_run_id: str) -> str:
    """The name of a run chain's folders under `.durable-agent/` (archive, journal, outputs),
    from ids that stay the same across continue-as-new."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", workflow_id)[:100]
    return f"{safe}-{first_run_id}"


def archive_dir(workflow_id: str, first_run_id: str) -> str:
    """The chain's archive folder."""
    return f"{ARCHIVE_ROOT}/{run_folder(workflow_id, first_run_id)}"


def command_exit_code(result: str) -> int | None:
    """The exit code a `run_command` result reports, or None for any other result."""
    match = _EXIT_CODE.match(result)
    return int(match.group(1)) if match else None


# --- what to fold ------------------------------------------------------------------


@dataclass(frozen=True)
class Fold:
    folded: list[Message]
    kept: list[Message]

    @property
    def steps(self) -> list[int]:
        return sorted({m.step for m in self.folded})


def plan_fold(messages: list[Message], current_step: int, keep_recent_steps: int) -> Fold:
    """Fold every step before the last `keep_recent_steps`; whole steps only. Session-layer
    messages (a loaded skill, kind "skill") are never folded, wherever they stand."""
    last_folded = current_step - keep_recent_steps

    def folds(m: Message) -> bool:
        return m.step <= last_folded and m.kind not in SESSION_KINDS

    return Fold(folded=[m for m in messages if folds(m)], kept=[m for m in messages if not folds(m)])


def should_compact(request_tokens: int, max_context_tokens: int) -> bool:
    return request_tokens > max_context_tokens


def steps_to_keep(view: ModelView, current_step: int, keep_recent_steps: int, max_context_tokens: int) -> int:
    """`keep_recent_steps`, or fewer (at least one) when those alone would not fit."""
    summary = summary_message(view)
    reserve = int(max_context_tokens * (SUMMARY_SHARE + INDEX_SHARE))
    fixed = estimate_tokens(view.session) + max(reserve, estimate_tokens([summary]) if summary else 0)
    budget = int(max_context_tokens * TARGET_FILL)
    for keep in range(keep_recent_steps, 1, -1):
        kept = [m for m in view.messages if m.step > current_step - keep and m.kind not in RECORD_ONLY_KINDS]
        if fixed + estimate_tokens(kept) <= budget:
            return keep
    return 1


def first_unfolded(view: ModelView) -> int:
    return view.index.folded_through + 1


def archived_note(folder: str, last_step: int) -> Message | None:
    """The transcript's stand-in for steps folded in earlier runs (they are in the archive)."""
    if last_step < 1:
        return None
    text = (
        f"Steps 1-{last_step} were folded in earlier runs of this chain; they are kept whole in "
        f"{folder}/ in the workspace (`durable-agent export` reads them; the recall tool returns them)."
    )
    return Message(role="system", content=text, step=1, kind="archived")


# --- the index ---------------------------------------------------------------------


def index_steps(folded: list[Message]) -> list[FoldedStep]:
    """One index line per folded step, from its messages."""
    by_step: dict[int, FoldedStep] = {}
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    for message in folded:
        entry = by_step.setdefault(message.step, FoldedStep(step=message.step))
        for call in message.tool_calls:
            arguments = tool_arguments(call.arguments)
            calls[call.id] = (call.name, arguments)
            entry.tools.append(call.name)
            path = arguments.get("path")
            if call.name in FILE_TOOLS and isinstance(path, str) and path not in entry.files:
                entry.files.append(path)
        if message.role != "tool":
            continue
        name, arguments = calls.get(message.tool_call_id or "", (message.tool_name or "", {}))
        text = message.content or ""
        if name == "run_command" and not text.startswith(f"ERROR: {NOT_RUN}"):
            command = str(arguments.get("command", ""))[:200]
            entry.commands.append(CommandRun(command=command, exit_code=command_exit_code(text)))
        if text.startswith("ERROR"):
            entry.errors.append(_clip(text.splitlines()[0], 200))
    return [by_step[s] for s in sorted(by_step)]


def summary_chars(max_context_tokens: int) -> int:
    return int(max_context_tokens * SUMMARY_SHARE * 4)


def index_chars(max_context_tokens: int) -> int:
    return int(max_context_tokens * INDEX_SHARE * 4)


def recall_chars(settings: ContextSettings) -> int:
    """What one `recall` may return: a tool output's budget, or less in a small context
    (always at least one whole step)."""
    return min(settings.tool_output_chars, int(settings.max_context_tokens * RECALL_SHARE * 4))


def add_to_index(
    index: FoldIndex, entries: list[FoldedStep], max_chars: int = 10**9, line_limit: int = INDEX_STEP_LINES
) -> FoldIndex:
    """The index with `entries` added: the newest steps keep their lines, as many as fit
    in `max_chars` (and `line_limit`); the older ones join the digest."""
    steps = index.steps + entries
    digest = index.digest
    while steps and (len(steps) > line_limit or len(render_index(FoldIndex(digest=digest, steps=steps))) > max_chars):
        digest = _digest_add(digest, steps.pop(0))
    return FoldIndex(digest=digest, steps=steps)


def _digest_add(digest: IndexDigest | None, entry: FoldedStep) -> IndexDigest:
    if digest is None:
        digest = IndexDigest(first_step=entry.step, last_step=entry.step)
    counts = dict(digest.tool_counts)
    for tool in entry.tools:
        counts[tool] = counts.get(tool, 0) + 1
    files = [f for f in digest.files if f not in entry.files] + entry.files
    return IndexDigest(
        first_step=digest.first_step,
        last_step=entry.step,
        tool_counts=counts,
        files=files[-INDEX_FILES:],
        commands=digest.commands + len(entry.commands),
        failed_commands=digest.failed_commands + sum(1 for c in entry.commands if c.exit_code not in (0, None)),
        errors=digest.errors + len(entry.errors),
    )


def indexed_steps(index: FoldIndex) -> list[int]:
    """Every step the index covers (the digest's by range)."""
    covered = list(range(index.digest.first_step, index.digest.last_step + 1)) if index.digest else []
    return covered + [s.step for s in index.steps]


def render_index(index: FoldIndex) -> str:
    lines = [f"Folded steps 1-{index.folded_through}; the recall tool returns any of them verbatim."]
    if index.digest is not None:
        d = index.digest
        tools = ", ".join(f"{name} x{count}" for name, count in sorted(d.tool_counts.items()))
        lines.append(
            f"steps {d.first_step}-{d.last_step}: {tools or 'no tools'}; {d.commands} commands "
            f"({d.failed_commands} failed); {d.errors} errors; files: {', '.join(d.files) or 'none'}"
        )
    lines += [_index_line(entry) for entry in index.steps]
    return "\n".join(lines)


def _index_line(entry: FoldedStep) -> str:
    parts = [", ".join(entry.tools) or "no tools"]
    if entry.files:
        parts.append("files " + ", ".join(entry.files))
    parts += [f"`{_clip(c.command, 80)}` -> exit {'?' if c.exit_code is None else c.exit_code}" for c in entry.commands]
    parts += [f"error: {_clip(e, 120)}" for e in entry.errors]
    return f"step {entry.step}: " + "; ".join(parts)


def folded_through(index_text: str) -> int:
    """The last folded step named by a rendered index (for stubs that count turns)."""
    match = re.search(r"Folded steps 1-(\d+);", index_text)
    return int(match.group(1)) if match else 0


# --- the summary -------------------------------------------------------------------


def summary_request(previous: StructuredSummary | None, folded: list[Message], goal: str) -> list[dict[str, Any]]:
    """The summarising call's messages (wire format): the previous summary and the new steps."""
    body = {
        "goal": goal,
        "previous_summary": previous.model_dump() if previous else None,
        "new_steps": [_plain(m) for m in folded if m.kind not in RECORD_ONLY_KINDS],
    }
    return [
        {"role": "system", "content": SUMMARY_PROMPT},
        {"role": "user", "content": json.dumps(body, ensure_ascii=False)},
    ]


def retry_request(request: list[dict[str, Any]], reply: str | None, error: str) -> list[dict[str, Any]]:
    """The second try: the malformed reply and what was wrong with it."""
    return [
        *request,
        {"role": "assistant", "content": reply or ""},
        {"role": "user", "content": f"That was not valid: {error}. Reply with the JSON object only."},
    ]


def parse_summary(text: str | None, max_chars: int = 10**9) -> StructuredSummary:
    """The model's summary, validated; ValueError says what is wrong. Code fences are allowed."""
    raw = (text or "").strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", raw, re.DOTALL)
    if fenced:
        raw = fenced.group(1)
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at position {e.pos})") from None
    if not isinstance(decoded, dict) or set(decoded) != set(StructuredSummary.model_fields):
        keys = sorted(decoded) if isinstance(decoded, dict) else type(decoded).__name__
        raise ValueError(f"expected exactly the keys {sorted(StructuredSummary.model_fields)}, got {keys}")
    try:
        return bounded(StructuredSummary.model_validate(decoded), max_chars)
    except ValidationError as e:
        raise ValueError("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())) from None


def extractive_summary(
    previous: StructuredSummary | None, folded: list[Message], goal: str, max_chars: int = 10**9
) -> StructuredSummary:
    """The deterministic fallback: lines taken from the folded steps, merged with `previous`."""
    inputs: list[str] = []
    outputs: list[str] = []
    decisions: list[str] = []
    issues: list[str] = []
    for entry in index_steps(folded):
        for command in entry.commands:
            outputs.append(f"step {entry.step}: ran `{command.command}` (exit {command.exit_code})")
        issues += [f"step {entry.step}: {error}" for error in entry.errors]
    for message in folded:
        if message.role == "assistant":
            for call in message.tool_calls:
                path = tool_arguments(call.arguments).get("path")
                if call.name in ("write_file", "edit_file"):
                    outputs.append(f"step {message.step}: {call.name} {path}")
                elif call.name == "read_file":
                    inputs.append(f"step {message.step}: read {path}")
            if message.content and message.content.strip():
                decisions.append(f"step {message.step}: {message.content.strip()}")
        elif message.role == "user" and message.kind not in RECORD_ONLY_KINDS:
            inputs.append(f"step {message.step}: {message.kind or 'user'}: {message.content or ''}")
    base = previous or StructuredSummary(goal=goal, inputs=[], outputs=[], key_decisions=[], open_issues=[])
    return bounded(
        StructuredSummary(
            goal=base.goal or goal,
            inputs=base.inputs + inputs,
            outputs=base.outputs + outputs,
            key_decisions=base.key_decisions + decisions,
            open_issues=base.open_issues + issues,
        ),
        max_chars,
    )


def run_summary(view: ModelView, goal: str, output: str, unfinished: list[str]) -> StructuredSummary:
    """What a finished run amounted to (its result's summary, what a delegate's parent gets):
    the folded steps' summary merged with the unfolded ones, plus its answer and what is
    left. Deterministic: no model call."""
    steps = extractive_summary(view.summary, view.messages, goal)
    answer = [f"answer: {output}"] if output else []
    return bounded(
        steps.model_copy(update={"outputs": steps.outputs + answer, "open_issues": steps.open_issues + unfinished})
    )


def bounded(summary: StructuredSummary, max_chars: int = 10**9) -> StructuredSummary:
    """At most `SUMMARY_ITEMS` items of `ITEM_CHARS` per list and `max_chars` in all, the
    newest items kept: a summary's size stays fixed however many steps it covers (the
    index and recall hold the rest)."""

    def keep(items: list[str]) -> list[str]:
        return [_clip(str(item), ITEM_CHARS) for item in items[-SUMMARY_ITEMS:]]

    fields = {name: keep(getattr(summary, name)) for name in ("inputs", "outputs", "key_decisions", "open_issues")}
    goal = _clip(summary.goal, min(4 * ITEM_CHARS, max(80, max_chars // 4)))
    while len(StructuredSummary(goal=goal, **fields).model_dump_json(indent=1)) > max_chars:
        longest = max(fields.values(), key=len)
        if not longest:
            break
        longest.pop(0)  # the oldest item of the longest list
    return StructuredSummary(goal=goal, **fields)


# --- what the model is sent ----------------------------------------------------------


def summary_message(view: ModelView) -> Message | None:
    """The summary and the index, as one message after the session layer."""
    if view.summary is None:
        return None
    text = (
        "Earlier steps were folded out of this context. Summary of them:\n"
        + view.summary.model_dump_json(indent=1)
        + "\n\nIndex of folded steps:\n"
        + render_index(view.index)
    )
    return Message(role="user", content=text, step=view.index.folded_through, kind="summary")


def request_messages(view: ModelView) -> list[Message]:
    """What the model is sent: session layer, summary and index, the unfolded steps."""
    summary = summary_message(view)
    return [*view.session, *([summary] if summary else []), *model_context(view.messages)]


def layer_tokens(view: ModelView, current_step: int, keep_recent_steps: int) -> dict[str, int]:
    summary = summary_message(view)
    recent = model_context(view.messages)
    cut = current_step - keep_recent_steps
    return {
        "session": estimate_tokens(view.session),
        "summary": estimate_tokens([summary]) if summary else 0,
        "task": estimate_tokens([m for m in recent if m.step <= cut]),
        "step": estimate_tokens([m for m in recent if m.step > cut]),
    }


SOURCES = {"model": "the model", "model_retry": "the model, on its second try", "extractive": "extraction"}


def record_text(record: Compaction) -> str:
    """`folded steps 1-20 (size), ~3,100 → ~1,200 tokens; summary by the model (900 tokens)`."""
    spent = f" ({record.summary_tokens:,} tokens)" if record.summary_tokens else ""
    return (
        f"folded steps {record.first_step}-{record.last_step} ({record.trigger}), "
        f"~{record.tokens_before:,} → ~{record.tokens_after:,} tokens; "
        f"summary by {SOURCES[record.summary_source]}{spent}"
    )


def compaction_note(record: Compaction, view: ModelView) -> Message:
    """The transcript's record of a compaction (for people; never sent): what was folded,
    the tokens before and after, and the summary and index the model is now sent."""
    sent = summary_message(view)
    text = f"Compacted the context: {record_text(record)}.\n" + (sent.content or "" if sent else "")
    return Message(role="system", content=text, step=record.step, kind="compaction")


def _plain(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"step": message.step, "role": message.role}
    if message.content:
        out["content"] = message.content
    if message.tool_calls:
        out["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    return out


def tool_arguments(raw: str) -> dict[str, Any]:
    """A tool call's arguments as the model wrote them, or {} when they are not a JSON object."""
    try:
        decoded = json.loads(raw or "{}")
    except (ValueError, RecursionError):  # malformed, or nested too deep for the parser
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
