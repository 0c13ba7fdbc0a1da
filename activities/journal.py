"""An on-disk journal that lets a retried tool call report its first outcome instead of acting twice.

Temporal retries an activity whose worker died, and the retry cannot know how far the
first attempt got. Tools with side effects therefore record, per idempotency key:

    <workspace>/.durable-agent/journal/<digest>.started.json   written before acting
    <workspace>/.durable-agent/journal/<digest>.done.json      the recorded ToolOutcome

Every write is atomic (temp file, rename), so a reader, or a retry after the worker was
killed, sees a whole entry or none: the page cache outlives a killed process. A start record
is also durable (fsync of the file and its folder before the call acts): after a machine
crash it is what stops a command or edit from running twice. A done record is not: a
crash can lose it or leave it empty, which reads as absent; the start record stays in the
step's folder until the next step removes the folder, so a command's or edit's retry finds
it and reports the call as interrupted, and a `write_file` writes the same bytes again.
The journal lives in the workspace because the workspace is what every worker that runs
its tools can see. Entries are redacted of secrets (activities/redaction.py) and readable
by the worker's user only.

Entries are authenticated: each holds an HMAC-SHA256 of its stage, its idempotency key and
its content, under a key that no command can read (`journal_key`: outside every
workspace). An entry whose HMAC does not verify, forged or moved from another call's
name, is never trusted: the call fails with a `JournalForged` tool error that says so.
Entries are read and written through the journal folder's descriptor, opened level by level
from the workspace with O_NOFOLLOW (`Journal._opened`): never through a swapped-in symlink.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.redaction import worker_redactor
from activities.regular_files import NotRegularFile, fdopen_regular, read_regular
from activities.workspace import RESERVED_DIR
from workflows.types import ToolOutcome

JOURNAL_DIR = f"{RESERVED_DIR}/journal"
ENTRY_MODE = 0o600
KEY_ENV = "DURABLE_AGENT_JOURNAL_KEY"
KEY_FILE = "journal.key"
MAC_FIELD = "mac"


@cache
def journal_key() -> bytes:
    """The key of the journal's HMACs: `DURABLE_AGENT_JOURNAL_KEY` (workers that share
    workspaces on several machines set the same one), else `journal.key` in
    `DURABLE_AGENT_HOME`, made on first use, 0600. Commands never see either: the sandbox
    binds no home and passes no `DURABLE_AGENT_*` variable."""
    from durable_agent.connection import home  # here: durable_agent.connection imports the tools

    given = os.environ.get(KEY_ENV)
    if given:
        return given.encode()
    path = home() / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        key = read_regular(path)
        if len(key) < 32:
            raise ValueError(f"{path} holds {len(key)} bytes, not a journal key: remove it to make a new one") from None
        return key
    with os.fdopen(fd, "wb") as f:
        key = secrets.token_bytes(32)
        f.write(key)
    return key


def _mac(stage: str, key: str, entry: dict[str, Any]) -> str:
    body = json.dumps({"stage": stage, "key": key, "entry": entry}, sort_keys=True, ensure_ascii=False)
    return hmac.new(journal_key(), body.encode(), hashlib.sha256).hexdigest()


def key_digest(idempotency_key: str) -> str:
    """A file-name-safe digest of an idempotency key (which may hold any characters)."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


class JournalUnsafe(Exception):
    """A folder on the way to the journal is a symlink or not a folder; the message is written for the model."""


class JournalFull(Exception):
    """The current step's entries fill the run's journal cap; the message is written for the model."""


class Journal:
    def __init__(
        self,
        workspace_root: str | Path,
        folder: Path | None = None,
        max_bytes: int | None = None,
        make_folder: Callable[[], object] | None = None,
    ) -> None:
        """`folder`: the run's current step folder (activities/run_files.py), made by
        `make_folder` before the first entry is written (a run that only reads leaves no
        folder); default the workspace's shared `journal/` of calls recorded before
        per-chain folders, uncapped."""
        self.workspace_root = str(workspace_root)
        self.folder = folder if folder is not None else Path(workspace_root) / JOURNAL_DIR
        self._shared = folder is None
        self.max_bytes = max_bytes
        self._make_folder = make_folder

    def ensure_room(self) -> None:
        """Called before a call acts: a step whose entries fill the cap runs no more calls
        with side effects (each would act without a record for its retry). Makes the folder
        first: one that cannot be made safely refuses the call before it acts."""
        self._ensure_folder()
        if self.max_bytes is None:
            return
        try:
            with os.scandir(self.folder) as entries:
                held = sum(_size(entry) for entry in entries)
        except FileNotFoundError:
            return
        if held >= self.max_bytes:
            activity.logger.warning("journal %s at its cap of %d bytes: a call refused", self.folder, self.max_bytes)
            raise JournalFull(
                f"not run: this step's tool journal holds {held:,} bytes, the run's cap is {self.max_bytes:,} "
                "(DURABLE_AGENT_JOURNAL_MAX_BYTES); calls that change files or run commands can be recorded "
                "again from the next step: ask for fewer calls in one reply"
            )

    def completed(self, key: str) -> ToolOutcome | None:
        entry = self._load(key, "done")
        if entry is None:
            return None
        try:
            return ToolOutcome.model_validate(entry["outcome"])
        except (KeyError, ValidationError) as e:
            raise _corrupt(self._shown(self._path(key, "done"))) from e

    def started(self, key: str) -> dict[str, Any] | None:
        """The record of an attempt that began but never completed, if any. An empty one still
        says the attempt began: it is a synced record whose unsynced update (a command's
        process group) a machine crash cut short, never grounds to act again."""
        return self._load(key, "started", empty={})

    def start(self, key: str, record: dict[str, Any], durable: bool = True) -> None:
        """Note (or update) what an attempt is about to do or is doing. `durable`: on disk
        before returning; an update that only adds detail to a durable record need not be."""
        self._ensure_folder()
        entry = _signed("started", {"key": key, **record})
        with self._opened(create=True) as folder_fd:
            write_at(folder_fd, self._name(key, "started"), entry, ENTRY_MODE, durable=durable)

    def complete(self, key: str, outcome: ToolOutcome) -> None:
        self._ensure_folder()
        entry = _signed("done", {"key": key, "outcome": outcome.model_dump()})
        with self._opened(create=True) as folder_fd:
            write_at(folder_fd, self._name(key, "done"), entry, ENTRY_MODE)
            if self._shared:
                # The shared journal of calls recorded before per-step folders: nothing prunes it.
                # A step folder keeps the start record until the next step removes the folder:
                # should a machine crash leave the done record empty, the start record remains.
                _unlink_at(folder_fd, self._name(key, "started"))

    def forget_start(self, key: str) -> None:
        """Drop a start record for an attempt that provably did nothing."""
        try:
            with self._opened() as folder_fd:
                _unlink_at(folder_fd, self._name(key, "started"))
        except FileNotFoundError:
            pass

    @contextmanager
    def _opened(self, create: bool = False) -> Iterator[int]:
        """The journal's folder, opened level by level from the workspace with O_NOFOLLOW: a
        `.durable-agent` (or any folder below it) swapped for a symlink is refused, never
        written through, whenever it was swapped. `create`: missing levels are made."""
        fd = os.open(self.workspace_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != os.path.abspath(self.workspace_root):
                # A folder on the workspace's own path swapped for a symlink since it was resolved.
                raise JournalUnsafe(
                    f"not run: the workspace {self.workspace_root} was swapped while in use (a folder on its path "
                    "is now a link); durable-agent never keeps its journal through one"
                )
            for part in self.folder.relative_to(self.workspace_root).parts:
                try:
                    below = _open_level(part, fd, create)
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    raise JournalUnsafe(
                        f"not run: {self._shown(self.folder)} is a symlink or a file, or lies under one; "
                        "durable-agent never keeps its journal through one: remove it"
                    ) from None
                os.close(fd)
                fd = below
            yield fd
        finally:
            os.close(fd)

    def _ensure_folder(self) -> None:
        if self._make_folder is not None:
            self._make_folder()
            self._make_folder = None

    def _path(self, key: str, stage: str) -> Path:
        return self.folder / self._name(key, stage)

    @staticmethod
    def _name(key: str, stage: str) -> str:
        return f"{key_digest(key)}.{stage}.json"

    def _load(self, key: str, stage: str, empty: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The entry of `key` at `stage`, None if there is none, `empty` if the file is empty;
        raises JournalForged unless it is the authenticated entry of that key and stage."""
        path = self._path(key, stage)
        try:
            with self._opened() as folder_fd:
                fd = os.open(
                    self._name(key, stage), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd
                )
                with fdopen_regular(fd, self._shown(path)) as f:
                    data = f.read()
        except FileNotFoundError:
            return None
        except (NotRegularFile, IsADirectoryError) as e:
            raise _corrupt(self._shown(path)) from e
        except OSError as e:
            if e.errno != errno.ELOOP:  # the entry itself is a symlink
                raise
            raise _corrupt(self._shown(path)) from e
        if not data:
            # What a machine crash can leave of a record that was not synced: a done record
            # reads as never written, so a command or edit falls back on its start record.
            return empty
        try:
            entry = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise _corrupt(self._shown(path)) from e
        if not isinstance(entry, dict):
            raise _corrupt(self._shown(path))
        mac = entry.pop(MAC_FIELD, None)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(stage, key, entry)):
            activity.logger.warning("journal entry %s fails authentication: not trusted", path)
            raise ApplicationError(
                f"tool journal entry {self._shown(path)} fails authentication: it was forged, or moved from "
                "another call, or written by a worker without this journal key; it is not trusted and the "
                "call was not run: inspect it, then delete it to let the call run",
                type="JournalForged",
                non_retryable=True,
            )
        return entry

    def _shown(self, path: Path) -> str:
        return os.path.relpath(path, self.workspace_root)


def write_at(folder_fd: int, name: str, data: bytes, mode: int, durable: bool = False) -> None:
    """Replace `name` of the opened folder with `data`, whole: a temporary file renamed over it, both
    in `folder_fd`, so that a killed process or a reader sees the old content or the new, never a
    mix. `durable`: also on disk before returning (fsync of the file and its folder)."""
    temp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.rename(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        _unlink_at(folder_fd, temp)
        raise
    if durable:
        os.fsync(folder_fd)  # the rename is durable only once the folder entry is on disk


def _open_level(part: str, fd: int, create: bool) -> int:
    """One level of the journal's folder; made first only when missing (`create`): most writes
    find every level there, and a mkdir per level per write was most of a record's system calls."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(part, flags, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(part, dir_fd=fd)
    except FileExistsError:
        pass
    return os.open(part, flags, dir_fd=fd)


def _unlink_at(folder_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass


def _signed(stage: str, entry: dict[str, Any]) -> bytes:
    """The entry redacted, then with its HMAC (of what is written, so that it verifies)."""
    redacted = worker_redactor().value(entry)
    mac = _mac(stage, entry["key"], redacted)
    return json.dumps({**redacted, MAC_FIELD: mac}, ensure_ascii=False, indent=1).encode()


def _corrupt(shown: str) -> ApplicationError:
    # Retrying cannot repair the file; a person has to look at it.
    return ApplicationError(
        f"tool journal entry {shown} is unreadable; inspect it, then delete it to let the call run again",
        type="JournalCorrupt",
        non_retryable=True,
    )


def _size(entry: os.DirEntry[str]) -> int:
    """An entry's size; 0 for one removed since it was listed (a start record ended, a temporary file renamed)."""
    try:
        return entry.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0
