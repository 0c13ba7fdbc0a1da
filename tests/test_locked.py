"""`make run`'s lock: a second run of the recipe is refused while the first holds the folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def locked(lock: Path, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "durable_agent.locked", str(lock), "--", *command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_holder_is_refused_and_the_first_ones_files_stay(tmp_path: Path) -> None:
    lock, folder = tmp_path / "ws.lock", tmp_path / "ws"
    first = locked(lock, "sh", "-c", f"rm -rf {folder} && mkdir {folder} && echo mine > {folder}/f && sleep 30")
    try:
        deadline = time.monotonic() + 30
        while not (folder / "f").exists():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        second = locked(lock, "sh", "-c", f"rm -rf {folder}")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2 and f"(pid {first.pid}) holds {lock}" in err, err
        assert (folder / "f").read_text() == "mine\n"
    finally:
        first.kill()
        first.wait()


def test_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "ws.lock"
    first = locked(lock, "sleep", "5")
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text().strip() == str(first.pid)):  # it holds the lock
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)  # no clean-up ran: the kernel drops the flock
    first.wait()
    second = locked(lock, "true")
    assert second.wait(timeout=30) == 0, second.stderr.read() if second.stderr else ""


def test_the_exit_code_is_the_commands(tmp_path: Path) -> None:
    assert locked(tmp_path / "l", "sh", "-c", "exit 3").wait(timeout=30) == 3
