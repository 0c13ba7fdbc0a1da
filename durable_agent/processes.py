"""Worker processes started and killed from outside: the demo, crash tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "worker.py"


def spawn_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """`python worker.py` in its own session, so a SIGKILL hits only it and its children."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def kill_hard(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as an OOM killer or a node drain would: no cleanup runs."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def stop_gently(process: subprocess.Popen[bytes], timeout_s: float = 10) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGCONT)  # one stopped (SIGSTOP) would not see the SIGINT
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_hard(process)
