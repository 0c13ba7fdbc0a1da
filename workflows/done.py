"""A definition of done: the criteria a final answer is checked against before it is accepted.

Input (or agent file) `success_criteria` gives statements ("the tests pass", "README says
how to run it") and `check_command` a command whose exit code 0 means done. When the model
answers without tools, the run checks them (workflows/done_steps.py): the command in the
command sandbox, like `run_command`, and one model call (the judge) that says of each
statement whether the transcript shows it met. Unmet criteria go back to the model as a user
message, at most `limits.max_done_checks` times; the result lists every criterion and
whether it was met.

Pure and deterministic: the judge's prompt, the reading of its reply (a malformed reply
counts its statements unmet, with the reason, never fails the run) and the texts.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, ValidationError

if TYPE_CHECKING:  # workflows/types.py imports this module: no import back at run time
    from workflows.types import Message

JUDGE_PROMPT = (
    "You check whether an agent's work meets its success criteria. You get the goal, the criteria "
    "(numbered from 1), the agent's final answer and the latest steps of its transcript as evidence. "
    "Judge each criterion only by that evidence: a claim in the answer that nothing in the steps "
    'supports is not met. Reply with JSON only: {"criteria": [{"index": 1, "met": true, '
    '"evidence": "one line: what shows it, or what is missing"}, ...]}, one entry per criterion.'
)
"""The judge call's system message; the tests' model stub recognises a judge call by it."""

EVIDENCE_MESSAGES = 30
"""The latest messages of the unfolded steps the judge reads; older ones are in the summary."""
EVIDENCE_CHARS = 1_500
"""Each message's text is cut to this: a check reads what was done, not whole files."""
COMMAND_OUTPUT_CHARS = 4_000
"""The check command's output, head and tail, as the model and the judge see it."""


class CriterionResult(BaseModel):
    """One criterion as the last check found it."""

    criterion: str
    kind: Literal["statement", "command"]
    met: bool
    evidence: str = ""
    """One line: what shows it met, or what is missing (the command's exit code and output)."""
    check: int = Field(default=0, ge=0)
    """Which check (1-based) decided it."""


class _Verdict(BaseModel):
    index: int
    met: bool
    evidence: str = ""


class _Verdicts(BaseModel):
    criteria: list[_Verdict]


def statements_of(value: str | list[str] | None) -> list[str]:
    """`success_criteria` as a list: one string is one statement; blanks are dropped."""
    items = [value] if isinstance(value, str) else value or []
    return [item.strip() for item in items if item.strip()]


def judge_messages(
    goal: str, statements: list[str], answer: str, messages: list[Message], summary: Any
) -> list[dict[str, Any]]:
    """The judge call's context, in the wire format: the prompt and one user message (JSON)."""
    body = {
        "goal": goal,
        "criteria": [{"index": i, "statement": s} for i, s in enumerate(statements, 1)],
        "final_answer": answer[: EVIDENCE_CHARS * 2],
        "summary_of_earlier_steps": summary.model_dump() if summary is not None else None,
        "latest_steps": [_evidence(m) for m in messages[-EVIDENCE_MESSAGES:]],
    }
    return [
        {"role": "system", "content": JUDGE_PROMPT},
        {"role": "user", "content": json.dumps(body, ensure_ascii=False)},
    ]


def _evidence(message: Message) -> dict[str, Any]:
    entry: dict[str, Any] = {"step": message.step, "role": message.role}
    if message.content:
        entry["content"] = _cut(message.content, EVIDENCE_CHARS)
    if message.tool_calls:
        entry["tool_calls"] = [{"name": c.name, "arguments": _cut(c.arguments, 300)} for c in message.tool_calls]
    return entry


def verdicts(reply: str | None, statements: list[str], check: int) -> list[CriterionResult]:
    """The judge's reply read as one result per statement. A reply that is not the JSON asked
    for leaves every statement unmet, saying why; a statement it skips is unmet too."""
    try:
        parsed = _Verdicts.model_validate_json(_json_text(reply or ""))
    except ValidationError as e:
        return unconfirmed(statements, check, f"the judge's reply could not be read ({e.errors()[0]['msg']})")
    said = {v.index: v for v in parsed.criteria}
    results = []
    for index, statement in enumerate(statements, 1):
        verdict = said.get(index)
        results.append(
            CriterionResult(
                criterion=statement,
                kind="statement",
                met=verdict.met if verdict else False,
                evidence=_cut(verdict.evidence, 300) if verdict else "the judge did not say",
                check=check,
            )
        )
    return results


def unconfirmed(statements: list[str], check: int, why: str) -> list[CriterionResult]:
    """Statements no judge confirmed (its reply unreadable, its call failed): unmet, saying why."""
    evidence = f"{why}; not confirmed"
    return [
        CriterionResult(criterion=s, kind="statement", met=False, evidence=evidence, check=check) for s in statements
    ]


def unchecked(statements: list[str], command: str | None, budget: str, check: int) -> list[CriterionResult]:
    """The criteria when a budget is used up as the model answers: not checked (a check would
    spend past it), so not met, saying why."""
    why = f"not checked: the run's {budget} is used up"
    named = [(f"`{command}` exits 0", "command")] if command else []
    named += [(statement, "statement") for statement in statements]
    return [CriterionResult(criterion=c, kind=kind, met=False, evidence=why, check=check) for c, kind in named]


def _json_text(reply: str) -> str:
    """The JSON in a reply, also when a model wraps it in a ```json fence."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", reply, re.DOTALL)
    return (fenced.group(1) if fenced else reply).strip()


def command_result(command: str, ok: bool, output: str, error: str | None, check: int) -> CriterionResult:
    """`check_command`'s run: met when it ran and exited 0 (`run_command`'s text starts so)."""
    met = ok and output.startswith("exit code: 0\n")
    text = output if ok else f"ERROR: {error}\n{output}".rstrip()
    return CriterionResult(
        criterion=f"`{command}` exits 0",
        kind="command",
        met=met,
        evidence=_cut(text, COMMAND_OUTPUT_CHARS),
        check=check,
    )


def unmet_text(results: list[CriterionResult], check: int, allowed: int) -> str:
    """The user message that sends unmet criteria back to the model."""
    lines = [f"Your answer is not accepted yet: the success criteria were checked ({check} of {allowed} checks)."]
    for r in results:
        if not r.met:
            lines.append(f"- NOT MET: {r.criterion}\n  {r.evidence}")
    lines += [f"- met: {r.criterion}" for r in results if r.met]
    lines.append("Fix what is not met, then answer again.")
    return "\n".join(lines)


def unfinished_lines(results: list[CriterionResult]) -> list[str]:
    return [f"criterion not met: {r.criterion}" for r in results if not r.met]


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n… {len(text) - 2 * keep:,} characters cut …\n{text[-keep:]}"
