"""`clean_up_run`: when a run chain closes, its journal goes; its outputs and archive stay.

The run's sandbox on this worker (`shell: persistent`) ends with it, and every process left in it.
The journal only lets a retried tool call report its first outcome; once the chain is
closed no call of it can be retried. Saved outputs stay for the people who read the
transcript, until `durable-agent gc` removes them (by default 7 days after the close);
the archive is the chain's long-term transcript, removed only by `durable-agent gc
--archives`. The workflow runs this once, at its close (not at continue-as-new), and only
reports a failure: the run's result never depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import run_files
from activities.run_files import HostileLayout
from activities.tools.run_sandbox import RUN_SANDBOXES
from activities.workspace import Workspace, WorkspaceError, workspace_roots
from workflows.types import RunFilesCleaned, RunFilesCleanup

OUTPUTS_GRACE_DAYS = 7
"""How long after its close `durable-agent gc` keeps a chain's saved outputs, by default."""


def clean_up(request: RunFilesCleanup, roots: list[str]) -> RunFilesCleaned:
    root = Workspace(request.workspace, roots).root
    journal = run_files.remove_chain(root, "journal", request.run_folder)
    outputs = run_files.measure_chain(root, "outputs", request.run_folder)
    archive = run_files.measure_chain(root, "archive", request.run_folder)
    # What is true at the close, not what this attempt did: an earlier attempt of this
    # clean-up (a worker killed mid-close, a workflow task the server dropped after it ran)
    # may have removed the journal already, and the run's result must not depend on that.
    note = (
        f"the tool journal is removed; kept the saved outputs "
        f"({outputs.files} files, {outputs.bytes:,} bytes) for `durable-agent gc` ({OUTPUTS_GRACE_DAYS} days "
        f"after the close by default) and the archive ({archive.files} files, {archive.bytes:,} bytes) "
        f"for `recall` and `export`"
    )
    activity.logger.info(
        "run files of %s in %s: %s (this attempt removed %d files, %d bytes)",
        request.run_folder,
        root,
        note,
        journal.files,
        journal.bytes,
    )
    return RunFilesCleaned(
        removed_files=journal.files,
        removed_bytes=journal.bytes,
        kept_files=outputs.files + archive.files,
        kept_bytes=outputs.bytes + archive.bytes,
        note=note,
    )


class CleanupActivities:
    def __init__(self, roots: list[str] | None = None) -> None:
        self._roots = roots if roots is not None else workspace_roots()

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.clean_up_run]

    @activity.defn(name="clean_up_run")
    async def clean_up_run(self, request: RunFilesCleanup) -> RunFilesCleaned:
        # The run's sandbox, if this worker holds it (another worker's ends after its idle timeout).
        await RUN_SANDBOXES.end_run(request.workspace, request.run_folder)
        try:
            return await asyncio.to_thread(clean_up, request, self._roots)
        except (WorkspaceError, HostileLayout) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from None
        except OSError as e:
            raise ApplicationError(f"clean_up_run could not remove the run's files: {e}", type="CleanupFailed") from e
