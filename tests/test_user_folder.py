"""One folder per user where a machine's processes meet (`activities.host.user_folder`): the
sandbox's seccomp filter, shared by every worker start, and the live reply sockets; never one
that someone else could have laid out.

Each filter case runs `filter_file()` in a fresh interpreter (it is built once per process)
with TMPDIR set to a folder of the test's own, and judges by what is on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.live_replies import live_socket_path
from activities.tools.seccomp import FOLDER_PREFIX
from tests.unprivileged import NOBODY, PROJECT

pytest.importorskip("pyseccomp")


def filter_files(tmp: Path, starts: int = 1) -> list[Path]:
    """The filter's path, as `starts` workers starting together would write it under TMPDIR=`tmp`."""
    # Each process waits for a file the test writes once all are up, then builds the filter.
    go = tmp / "go"
    script = (
        "import os, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
        "from activities.tools.seccomp import filter_file; print(filter_file())"
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    starting = [
        subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(starts)
    ]
    go.touch()
    printed = [process.communicate(timeout=60)[0] for process in starting]
    go.unlink()
    assert [process.returncode for process in starting] == [0] * starts
    return [Path(line.strip()) for line in printed]


def filter_file(tmp: Path) -> Path:
    return filter_files(tmp)[0]


def own_folder(tmp: Path) -> Path:
    return tmp / f"{FOLDER_PREFIX}{os.geteuid()}"


def test_worker_starts_share_one_folder_and_leave_nothing_else(tmp_path: Path) -> None:
    paths = filter_files(tmp_path, starts=6) + [filter_file(tmp_path)]
    assert len(set(paths)) == 1 and paths[0].parent == own_folder(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [own_folder(tmp_path).name]
    assert [p.name for p in own_folder(tmp_path).iterdir()] == [paths[0].name]
    assert own_folder(tmp_path).stat().st_mode & 0o777 == 0o700


def test_a_file_of_other_content_under_the_name_is_replaced(tmp_path: Path) -> None:
    path = filter_file(tmp_path)
    program = path.read_bytes()
    path.write_bytes(b"\0" * len(program))
    assert filter_file(tmp_path) == path
    assert path.read_bytes() == program


def test_a_symlink_in_the_folders_place_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    own_folder(tmp_path).symlink_to(elsewhere)
    path = filter_file(tmp_path)
    assert list(elsewhere.iterdir()) == []
    assert path.parent.parent == tmp_path and path.parent.name.startswith(FOLDER_PREFIX)
    assert path.parent != own_folder(tmp_path) and path.read_bytes()


def test_a_folder_open_to_others_is_not_used(tmp_path: Path) -> None:
    own_folder(tmp_path).mkdir()
    own_folder(tmp_path).chmod(0o777)
    path = filter_file(tmp_path)
    assert list(own_folder(tmp_path).iterdir()) == []
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.read_bytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_another_user_made_first_is_not_used(tmp_path: Path) -> None:
    own_folder(tmp_path).mkdir(mode=0o700)
    os.chown(own_folder(tmp_path), NOBODY, NOBODY)
    path = filter_file(tmp_path)
    assert list(own_folder(tmp_path).iterdir()) == []
    assert path.parent != own_folder(tmp_path) and path.parent.stat().st_uid == 0


@pytest.mark.parametrize("laid_out", ["symlink", "open to others", "another user's"])
def test_live_sockets_are_never_put_in_a_folder_someone_else_laid_out(
    laid_out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if laid_out == "another user's" and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = tmp_path / f"durable-agent-live-{os.geteuid()}"
    assert live_socket_path(1, "tag") == folder / "live-tag-1.sock"
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.rmdir()
    if laid_out == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir(mode=0o777 if laid_out == "open to others" else 0o700)
        folder.chmod(0o777 if laid_out == "open to others" else 0o700)
        if laid_out == "another user's":
            os.chown(folder, NOBODY, NOBODY)
    assert live_socket_path(1, "tag") is None
