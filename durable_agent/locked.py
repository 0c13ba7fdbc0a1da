"""`python -m durable_agent.locked LOCKFILE -- COMMAND...`: run COMMAND while holding LOCKFILE.

`make run` empties ./demo-workspace before each run; a second `make run` started meanwhile
would delete the first one's files under it. The lock is an `flock` on a file beside the
folder, released by the kernel when the holder exits however it exits (SIGKILL included),
so a crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys

EXIT_BUSY = 2


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m durable_agent.locked LOCKFILE -- COMMAND [ARGS...]", file=sys.stderr)
        return EXIT_BUSY
    lock_path, command = argv[0], argv[2:]
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            print(f"error: another command (pid {holder}) holds {lock_path}; wait for it to finish", file=sys.stderr)
            return EXIT_BUSY
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        child = subprocess.Popen(command)
        # Ctrl-C reaches the child too (same process group), which says what it did; this
        # process only waits for it, holding the lock until it is gone.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
