"""The sandbox's seccomp filter is kept in the worker's sealed memory file: never on disk,
where a command of a workspace holding it or another user owning a folder above it could
rewrite or swap it, and unchangeable by anyone, root included."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.tools import ToolActivities
from activities.tools.seccomp import filter_file
from tests.unprivileged import PROJECT
from workflows.types import ToolCallInput

pytest.importorskip("pyseccomp")


PRINT_FILTER = "from activities.tools.seccomp import filter_file as f; p = f(); print(p, len(open(p, 'rb').read()))"


def test_the_filter_never_lies_on_disk(tmp_path: Path) -> None:
    printed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from activities.tools.seccomp import filter_file as f; p = f(); print(p, len(open(p, 'rb').read()))",
        ],
        cwd=PROJECT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert re.fullmatch(r"/proc/\d+/fd/\d+", printed[0]) and int(printed[1]) > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["write", "truncate", "reopened for writing", "sealed again"])
def test_no_one_can_change_the_filter(how: str) -> None:
    path = filter_file()
    before = Path(path).read_bytes()
    with pytest.raises(OSError) as refused:
        if how == "write":
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"\0" * len(before))
            finally:
                os.close(fd)
        elif how == "truncate":
            os.truncate(path, 0)
        elif how == "reopened for writing":
            with open(path, "r+b") as f:
                f.write(b"\0")
                f.flush()
        else:
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.fcntl(
                    fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_FUTURE_WRITE if hasattr(fcntl, "F_SEAL_FUTURE_WRITE") else 1
                )
            finally:
                os.close(fd)
    assert refused.value.errno == errno.EPERM
    assert Path(path).read_bytes() == before


async def test_a_sandboxed_command_sees_no_descriptor_of_the_worker(tmp_path: Path) -> None:
    """The sandbox's /proc is its own PID namespace's: the worker's memory file is out of reach."""
    filter_file()
    command = (
        "ls -l /proc/*/fd/ 2>/dev/null | grep -c durable-agent-seccomp; ls /proc/*/fd/* >/dev/null 2>&1; echo done"
    )
    call = ToolCallInput(call_id="c", idempotency_key="k", workspace=str(tmp_path), arguments={"command": command})
    outcome = await ActivityEnvironment().run(ToolActivities().run_command, call)
    assert outcome.ok and outcome.output.split()[-2:] == ["0", "done"], outcome.output
