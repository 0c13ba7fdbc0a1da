"""The diff a person sees when a write awaits approval: what the call would change in the
file as it is when approval is asked (#23). The diff is computed by an activity
(activities/approval_diff.py), since it reads the file, and recorded in history with the
request; this module holds its contract and how it is shown. Pure: the workflow uses it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.failures import ACTIVITY_FAILED, failure_message, raise_if_cancelled
    from workflows.hosts import HOST_FIRST_PROBE
    from workflows.visible import one_line, visible

DIFFED_TOOLS = ("write_file", "edit_file")

SHOWN_DIFF_CHARS = 4_000
"""Of the unified diff, what `status`, `watch`, the approval prompt and the Web UI show."""


APPROVAL_DIFF_TIMEOUT = timedelta(seconds=30)
"""Reading at most 1 MiB and diffing it (activities/approval_diff.py), on a thread of its own."""
APPROVAL_DIFF_RETRY = RetryPolicy(
    initial_interval=options.RETRY_FIRST,
    backoff_coefficient=options.RETRY_GROWTH,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
)
"""A diff that keeps failing is only missing: the approval is asked without it, saying why."""


class ApprovalDiffInput(BaseModel):
    workspace: str
    tool: str
    arguments: dict[str, Any]
    """Validated by the workflow against the tool's argument model, as for the tool itself."""


class ApprovalDiff(BaseModel):
    diff: str = ""
    """A unified diff against the file as it is now (a new file: against nothing), whole."""
    note: str = ""
    """Why there is no diff, or what the call would do instead (old_text not found): one line."""


def diff_lines(found: ApprovalDiff) -> list[str]:
    """The diff under its heading, escaped (workflows/visible.py) and cut at SHOWN_DIFF_CHARS,
    saying how much is not shown."""
    if not found.diff:
        return [f"diff against the current file: {one_line(found.note) or 'no change'}"]
    shown = found.diff[:SHOWN_DIFF_CHARS]
    rest = len(found.diff) - len(shown)
    body = visible(shown).split("\n")
    if len(body) > 1 and body[-1] == "":
        body.pop()
    tail = [f"… {rest:,} more characters of the diff not shown"] if rest else []
    return ["diff against the current file:", *(f"  {line}" for line in body), *tail]


async def approval_diff_lines(
    workspace: str, tool: str, arguments: dict[str, Any], task_queue: str | None = None
) -> list[str]:
    """The diff's lines for the approval of a `write_file` or `edit_file` call, computed now
    by the `approval_diff` activity and recorded with its result. `task_queue`: the run's
    host's (workflows/hosts.py), where the workspace is; a host that does not take the call
    within its first probe leaves the approval without a diff rather than waiting."""
    request = ApprovalDiffInput(workspace=workspace, tool=tool, arguments=arguments)
    try:
        found = await workflow.execute_activity(
            "approval_diff",
            request,
            result_type=ApprovalDiff,
            start_to_close_timeout=APPROVAL_DIFF_TIMEOUT,
            retry_policy=APPROVAL_DIFF_RETRY,
            task_queue=task_queue,
            schedule_to_start_timeout=HOST_FIRST_PROBE if task_queue else None,
            summary=f"approval_diff: {arguments.get('path', '')}"[:120],
        )
    except ACTIVITY_FAILED as e:
        raise_if_cancelled(e)
        found = ApprovalDiff(note=f"the diff could not be computed: {failure_message(e)}")
    return diff_lines(found)
