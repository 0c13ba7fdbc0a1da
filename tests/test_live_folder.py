"""One folder per user where a machine's processes meet (`activities.host.user_folder`): the
live reply sockets never go to a folder that someone else could have laid out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.live_replies import live_socket_path
from tests.unprivileged import NOBODY


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
