"""`durable-agent doctor ID`: the seed's recovery checklist (§6.2), run against one run.

Six checks, each `ok` or `FAIL` with what was found and the command that fixes a failure:
checkpoint integrity (the latest snapshot and its files are in the store), version
compatibility (today's workflow code replays every history of the chain), dependencies (the
model endpoint answers, a worker polls the run's task queue, run_command's sandbox can start),
context consistency (every tool result follows the call that asked for it, every call has its
result), quota left (no budget of the run is spent), idempotency (the tool journal's entries are
calls history asked for, and none was left started but unfinished).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus

from activities.journal import key_digest
from activities.run_files import step_journal_path
from activities.snapshots import SnapshotError, Store
from activities.tools.sandbox import SandboxUnavailable, bwrap_binary
from durable_agent.launch import has_worker
from durable_agent.step_history import ChainSteps, StepPoint
from workflows.compaction import run_folder
from workflows.types import Message

ENDPOINT_TIMEOUT_S = 5.0


class Check(BaseModel):
    name: str
    ok: bool
    found: str
    fix: str = ""

    def line(self) -> str:
        head = f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.found}"
        return head if self.ok else f"{head}; fix: {self.fix}"


async def diagnose(client: Client, workflow_id: str, steps: ChainSteps) -> list[Check]:
    last = steps.points[-1]
    description = await client.get_workflow_handle(workflow_id).describe()
    open_run = description.status == WorkflowExecutionStatus.RUNNING
    return [
        checkpoint(workflow_id, steps),
        version(workflow_id, steps.failures, last),
        await dependencies(client, description.task_queue, open_run),
        consistency(workflow_id, last),
        quota(workflow_id, last),
        idempotency(workflow_id, steps, last),
    ]


def checkpoint(workflow_id: str, steps: ChainSteps) -> Check:
    store, last = Store(), steps.points[-1]
    try:
        files = store.files(last.digest)
        missing = [
            p for p, entry in files.items() if not (store.root / "blobs" / entry[-1][:2] / entry[-1][2:]).exists()
        ]
    except SnapshotError as e:
        missing = [str(e)]
    name = "checkpoint integrity"
    if not missing:
        return Check(name=name, ok=True, found=f"step {last.step}'s snapshot and its {len(files)} files are stored")
    good = [p.step for p in steps.points[:-1] if _readable(store, p)]
    to = f"`durable-agent rewind {workflow_id} --to-step {good[-1]}`" if good else "no earlier step is readable"
    return Check(name=name, ok=False, found=f"step {last.step}'s snapshot lacks {', '.join(missing[:3])}", fix=to)


def _readable(store: Store, point: StepPoint) -> bool:
    try:
        return all((store.root / "blobs" / e[-1][:2] / e[-1][2:]).exists() for e in store.files(point.digest).values())
    except SnapshotError:
        return False


def version(workflow_id: str, failures: list[str], last: StepPoint) -> Check:
    name = "version compatibility"
    if not failures:
        return Check(name=name, ok=True, found="today's workflow code replays every run of the chain")
    fix = (
        f"run a worker of the code that recorded it, or `durable-agent fork {workflow_id} --at-step {last.step}` "
        "(a new run on today's code)"
    )
    return Check(name=name, ok=False, found=failures[0][:300], fix=fix)


async def dependencies(client: Client, queue: str, open_run: bool) -> Check:
    problems = []
    base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    try:
        urllib.request.urlopen(f"{base.rstrip('/')}/models", timeout=ENDPOINT_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        pass  # it answered: the endpoint is up (a 401 or 404 is the key's or the path's business)
    except (urllib.error.URLError, OSError) as e:
        problems.append(f"model endpoint {base} does not answer ({getattr(e, 'reason', e)})")
    if open_run and not await has_worker(client, queue):
        problems.append(f"no worker polls task queue {queue}")
    try:
        bwrap_binary()
    except SandboxUnavailable as e:
        problems.append(f"run_command's sandbox: {e}")
    fix = "set OPENAI_BASE_URL to a live endpoint, start `durable-agent worker`, see README on the sandbox"
    found = "; ".join(problems) or f"model endpoint {base} answers; " + (
        f"a worker polls {queue}; the sandbox runs"
        if open_run
        else "the sandbox runs (the run is closed: no worker needed)"
    )
    return Check(name="dependencies", ok=not problems, found=found, fix=fix)


def consistency(workflow_id: str, last: StepPoint) -> Check:
    asked: dict[str, int] = {}
    answered: set[str] = set()
    problems = []
    for message in last.carry.view.messages:
        problems += _message_problems(message, asked, answered)
    problems += [f"step {step}'s call {cid} has no result" for cid, step in asked.items() if cid not in answered]
    name = "context consistency"
    if not problems:
        return Check(
            name=name, ok=True, found=f"{len(last.carry.view.messages)} unfolded messages, calls and results paired"
        )
    step = next((int(p.split()[1].rstrip("'s")) for p in problems if p.startswith("step ")), last.step)
    fix = f"`durable-agent edit {workflow_id} --drop-step {step}` (pause the run first)"
    return Check(name=name, ok=False, found="; ".join(problems[:3]), fix=fix)


def _message_problems(message: Message, asked: dict[str, int], answered: set[str]) -> list[str]:
    if message.role == "assistant":
        asked.update({c.id: message.step for c in message.tool_calls})
        return []
    if message.role == "tool" and message.tool_call_id not in asked:
        return [f"step {message.step}'s tool result {message.tool_call_id} answers no call"]
    if message.role == "tool":
        answered.add(message.tool_call_id or "")
    return []


def quota(workflow_id: str, last: StepPoint) -> Check:
    usage, limits = last.carry.usage, last.agent.limits
    spent = {
        "hard_steps": (last.step, limits.hard_steps),
        "max_tokens": (usage.tokens, limits.max_tokens),
        "max_cost_usd": (usage.cost_usd, limits.max_cost_usd),
        "max_model_calls": (usage.model_calls, limits.max_model_calls),
        "max_tool_calls": (usage.tool_calls, limits.max_tool_calls),
    }
    out = [f"{name} {used:g} of {limit:g}" for name, (used, limit) in spent.items() if used >= limit]
    if not out:
        left = ", ".join(f"{name} {limit - used:g}" for name, (used, limit) in spent.items())
        return Check(name="quota left", ok=True, found=f"left after step {last.step}: {left}")
    options = " ".join(f"--{name.replace('_', '-')} N" for name, (used, limit) in spent.items() if used >= limit)
    return Check(
        name="quota left",
        ok=False,
        found="spent: " + ", ".join(out),
        fix=f"`durable-agent limits {workflow_id} {options}`",
    )


def idempotency(workflow_id: str, steps: ChainSteps, last: StepPoint) -> Check:
    """The journal keeps the current step's records (activities/journal.py): each must be a call
    history asked for, and finished (a start record alone is a call a crash cut short)."""
    chain = run_folder(workflow_id, last.carry.first_run_id)
    folder = step_journal_path(os.path.realpath(last.agent.workspace), chain, last.step + 1)
    base = f"{workflow_id}/{last.carry.first_run_id}"
    asked = [f"{base}/{turn.step}/{call.id}" for turn in steps.turns for call in turn.tool_calls]
    # A person's retry of a call gets a key of its own (workflows/tool_steps.py).
    keys = {key_digest(k + suffix) for k in asked for suffix in ["", *(f"/retry-{n}" for n in range(1, 10))]}
    records = sorted(Path(folder).glob("*.json")) if folder.is_dir() else []
    unknown = [r.name for r in records if r.name.split(".")[0] not in keys]
    started = {r.name.split(".")[0] for r in records if r.name.endswith(".started.json")}
    done = {r.name.split(".")[0] for r in records if r.name.endswith(".done.json")}
    cut_short = sorted(started - done)
    name = "idempotency"
    if not unknown and not cut_short:
        return Check(
            name=name,
            ok=True,
            found=f"{len(records)} journal record(s) of step {last.step + 1}, all asked for by history",
        )
    found = "; ".join(
        [
            *(f"journal record {u} is no call of history" for u in unknown[:3]),
            *(f"call {c} started, never finished" for c in cut_short[:3]),
        ]
    )
    fix = (
        f"`durable-agent resolve {workflow_id} retry` (or skip) if it needs attention, "
        f"else `durable-agent rewind {workflow_id} --to-step {last.step}`"
    )
    return Check(name=name, ok=False, found=json.dumps(found)[1:-1], fix=fix)
