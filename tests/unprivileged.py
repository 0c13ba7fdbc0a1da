"""Starting a process of this project as an unprivileged user from a test run as root.

The user is `nobody` (uid and gid 65534, no groups, no capabilities). It must be able to run
the project's Python: the project, its virtualenv and the Python installation behind it
(pyenv's lies under /root, mode 0700 on most machines), and a folder it writes in. Where a
folder on the way to one of them is closed to others, the process gets a mount namespace
of its own in which that folder is an empty tmpfs (mode 0755) holding only those paths,
bound back from the host; everything else is the host's view. Nothing on the host changes
(no chmod, no ACL), and the rest of a folder such as /root stays hidden from the process.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

NOBODY = 65534
PROJECT = Path(__file__).resolve().parent.parent
DROP = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def unprivileged_argv(argv: list[str], home: Path) -> list[str]:
    """`argv` run as nobody, with the project, its Python and `home` (owned by root, which
    only prepares the mounts) reachable; `home` also holds the staging mount points."""
    paths = _outermost([PROJECT, Path(sys.prefix), Path(sys.base_prefix), home])
    hidden = [(path, cover) for path in paths if (cover := _closed_ancestor(path)) is not None]
    steps = ["set -e"]
    for index, (path, _) in enumerate(hidden):
        steps.append(f"mkdir {home}/.stage-{index} && mount --bind {shlex.quote(str(path))} {home}/.stage-{index}")
    for cover in sorted({cover for _, cover in hidden}):
        steps.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(cover))}")
    for index, (path, _) in enumerate(hidden):
        quoted = shlex.quote(str(path))
        steps.append(f"mkdir -p {quoted} && mount --bind {home}/.stage-{index} {quoted}")
    steps.append(f'exec {shlex.join(DROP)} -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", "\n".join(steps), "nobody", *argv]


@cache
def unprivileged_unavailable() -> str | None:
    """Why no process can be started as nobody here, or None (checked once, by starting one)."""
    if os.getuid() != 0:
        return f"the suite runs as uid {os.getuid()}, so every other test here already runs unprivileged"
    missing = [tool for tool in ("unshare", "setpriv", "mount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (util-linux): cannot drop to uid {NOBODY}"
    home = Path(_private_folder())
    try:
        probe = unprivileged_argv([sys.executable, "-c", "import os, worker; print(os.getuid())"], home)
        done = subprocess.run(probe, cwd=PROJECT, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0 or done.stdout.strip() != str(NOBODY):
        return f"cannot run the project as uid {NOBODY} here: {done.stderr.strip()[-500:]}"
    return None


def nobody_folder() -> Path:
    """A folder for an unprivileged process (its home, its workspaces), owned by root and
    open for reading to all; what nobody writes in goes in subfolders it owns (`owned_by_nobody`)."""
    folder = Path(_private_folder())
    folder.chmod(0o755)
    return folder


def owned_by_nobody(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return folder


def _private_folder() -> str:
    return tempfile.mkdtemp(prefix="durable-agent-nobody-")


def _outermost(paths: list[Path]) -> list[Path]:
    """The resolved paths, without those inside another one of them."""
    resolved = sorted({path.resolve() for path in paths})
    return [p for p in resolved if not any(p != q and p.is_relative_to(q) for q in resolved)]


def _closed_ancestor(path: Path) -> Path | None:
    """The outermost folder above `path` that others may not enter (no o+x), if any."""
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None
