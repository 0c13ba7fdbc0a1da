"""A run chain's files under the workspace's reserved folder: where they live, their caps,
and finding and removing them without ever following a symlink.

    <workspace>/.durable-agent/journal/<chain>/step-<n>/   exactly-once records of step n's calls
    <workspace>/.durable-agent/outputs/<chain>/            whole outputs the model saw cut
    <workspace>/.durable-agent/archive/<chain>/            folded steps (`recall`, `export`)

`<chain>` names a run chain (the same across continue-as-new): `workflows.compaction.run_folder`.
Each chain folder holds `chain.json` with the chain's workflow id, so that `durable-agent gc`
can ask Temporal whether the chain is closed. Files from before per-chain folders lie
directly in `journal/` and `outputs/`.

Finding and removing work through folder file descriptors opened with O_NOFOLLOW: a
symlink, FIFO, socket or device where a folder or file of ours should be is refused
(`HostileLayout`), never followed, and nothing outside `.durable-agent/` is touched.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from pydantic import BaseModel, ValidationError
from temporalio import activity

from activities.journal import write_at
from activities.regular_files import SPECIAL_KINDS, read_regular_at
from activities.workspace import RESERVED_DIR

KINDS = ("journal", "outputs", "archive")
IDENTITY_FILE = "chain.json"
STEP_PREFIX = "step-"
LEGACY = ""
"""The chain name of files from before per-chain folders (directly in `journal/`, `outputs/`)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DEPTH = 2
"""chain folder / step folder / file: nothing of ours lies deeper."""


class HostileLayout(Exception):
    """Something other than a plain folder or file stands where durable-agent keeps its own."""


class ChainIdentity(BaseModel):
    workflow_id: str


class RunFileCaps(BaseModel):
    """What one run chain may keep, per kind; `DURABLE_AGENT_<KIND>_MAX_BYTES` sets each."""

    journal_max_bytes: int = 64 * 2**20
    outputs_max_bytes: int = 512 * 2**20
    archive_max_bytes: int = 256 * 2**20


CAP_ENV = {
    "journal_max_bytes": "DURABLE_AGENT_JOURNAL_MAX_BYTES",
    "outputs_max_bytes": "DURABLE_AGENT_OUTPUTS_MAX_BYTES",
    "archive_max_bytes": "DURABLE_AGENT_ARCHIVE_MAX_BYTES",
}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", re.IGNORECASE)


def run_file_caps() -> RunFileCaps:
    """The caps from the worker's environment (bytes, or with a K/M/G suffix: 64M)."""
    values = {}
    for field, var in CAP_ENV.items():
        given = os.environ.get(var)
        if given:
            values[field] = parse_size(given, var)
    return RunFileCaps(**values)


def parse_size(text: str, name: str) -> int:
    match = _SIZE.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"{name}={text!r} is not a size in bytes (e.g. 67108864 or 64M)")
    unit = (match.group(2) or " ")[0].lower()
    return int(match.group(1)) * {" ": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit]


# --- writing: the folders a run's tools write to ---------------------------------------------


@contextmanager
def opened_chain(workspace_root: str, kind: str, chain: str, workflow_id: str) -> Iterator[int]:
    """`.durable-agent/<kind>/<chain>/`, made if missing with its `chain.json`, opened.

    Made level by level through descriptors from the workspace's (`_opened`): a symlink or
    file in a level's place is refused, and a folder on the workspace's own path swapped for
    a symlink meanwhile leads nowhere, so nothing is ever created through a link."""
    with made_reserved(workspace_root, kind, chain) as fd:
        try:
            os.stat(IDENTITY_FILE, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            write_at(fd, IDENTITY_FILE, ChainIdentity(workflow_id=workflow_id).model_dump_json().encode(), 0o600)
        yield fd


@contextmanager
def made_reserved(workspace_root: str, *names: str) -> Iterator[int]:
    """`.durable-agent/<names...>`, each level made if missing, opened as `reserved_folder` does."""
    with ExitStack() as stack:
        fd = stack.enter_context(_opened(workspace_root, None, workspace_root))
        shown = "."
        for name in (RESERVED_DIR, *names):
            with suppress(FileExistsError):  # another call of the same run made it meanwhile
                os.mkdir(name, dir_fd=fd)
            fd = stack.enter_context(_opened(name, fd, shown))
            shown = f"{shown}/{name}"
        yield fd


def step_journal_path(workspace_root: str, chain: str, step: int) -> Path:
    return Path(workspace_root) / RESERVED_DIR / "journal" / chain / f"{STEP_PREFIX}{step:06d}"


def make_step_journal(workspace_root: str, chain: str, step: int, workflow_id: str) -> Path:
    """Create the journal folder of the chain's current step. At a step's first entry the
    folders of earlier steps go: every call of theirs is over and its result is in history
    (the workflow starts a step once the last one's calls have all closed), so no retry reads them."""
    folder = step_journal_path(workspace_root, chain, step)
    chain_path = folder.parent
    with opened_chain(workspace_root, "journal", chain, workflow_id) as chain_fd:
        try:
            os.stat(folder.name, dir_fd=chain_fd, follow_symlinks=False)
        except FileNotFoundError:
            _prune_steps(chain_fd, chain_path, step)
        with suppress(FileExistsError):
            os.mkdir(folder.name, dir_fd=chain_fd)
        with _opened(folder.name, chain_fd, str(chain_path)):
            pass  # a folder: a link or file in its place is refused (HostileLayout)
    return folder


def _prune_steps(chain_fd: int, chain_path: Path, step: int) -> None:
    removed = ChainFiles(workspace=str(chain_path), kind="journal", chain=chain_path.name)
    with os.scandir(chain_fd) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        number = name.removeprefix(STEP_PREFIX)
        if name.startswith(STEP_PREFIX) and number.isdigit() and int(number) < step:
            try:
                remove_folder(chain_fd, name, f"{chain_path}/{name}", removed)
            except FileNotFoundError:
                pass  # a concurrent call of the same step removed it first
    if removed.files:
        activity.logger.info(
            "journal %s: removed %d entries (%d bytes) of steps before %d; their results are in history",
            chain_path,
            removed.files,
            removed.bytes,
            step,
        )


def _read_identity(chain_fd: int) -> ChainIdentity | None:
    """The chain's `chain.json`, read through its folder; None if missing or not ours."""
    data = read_regular_at(chain_fd, IDENTITY_FILE, 4096)
    if data is None:
        return None
    try:
        return ChainIdentity.model_validate_json(data)
    except ValidationError:
        return None


# --- reading and removing: folder descriptors, never a symlink followed ----------------------


class ChainFiles(BaseModel):
    """What one chain keeps of one kind in one workspace (files, bytes, newest change)."""

    workspace: str
    kind: str
    chain: str
    """The chain's folder name; LEGACY for the files lying directly in the kind's folder."""
    workflow_id: str | None = None
    files: int = 0
    bytes: int = 0
    newest_mtime: float = 0.0

    @property
    def path(self) -> str:
        return os.path.join(self.workspace, RESERVED_DIR, self.kind, self.chain)


def scan(workspace_root: str) -> list[ChainFiles]:
    """Every chain's files in the workspace, per kind. Raises HostileLayout for a planted link,
    FIFO or device anywhere in our folders."""
    found: list[ChainFiles] = []
    for kind in KINDS:
        try:
            with _kind_folder(workspace_root, kind) as kind_fd:
                found += _scan_kind(workspace_root, kind, kind_fd)
        except FileNotFoundError:
            continue  # no such folder: nothing of this kind
    return found


def _scan_kind(workspace_root: str, kind: str, kind_fd: int) -> list[ChainFiles]:
    shown = f"{workspace_root}/{RESERVED_DIR}/{kind}"
    legacy = ChainFiles(workspace=workspace_root, kind=kind, chain=LEGACY)
    chains: list[ChainFiles] = []
    for entry in sorted(os.scandir(kind_fd), key=lambda e: e.name):
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISREG(mode):
            _count(legacy, entry.stat(follow_symlinks=False))
        elif stat.S_ISDIR(mode):
            chain = ChainFiles(workspace=workspace_root, kind=kind, chain=entry.name)
            with _opened(entry.name, kind_fd, shown) as chain_fd:
                _walk(chain_fd, f"{shown}/{entry.name}", _MAX_DEPTH - 1, lambda _n, st, c=chain: _count(c, st))
                identity = _read_identity(chain_fd)
            chain.workflow_id = identity.workflow_id if identity else None
            chains.append(chain)
        else:
            raise _hostile(f"{shown}/{entry.name}", mode)
    return [legacy, *chains] if legacy.files else chains


def measure_chain(workspace_root: str, kind: str, chain: str) -> ChainFiles:
    """What one chain keeps of one kind (nothing if its folder is missing)."""
    measured = ChainFiles(workspace=workspace_root, kind=kind, chain=chain)
    shown = f"{workspace_root}/{RESERVED_DIR}/{kind}"
    try:
        with _kind_folder(workspace_root, kind) as kind_fd, _opened(chain, kind_fd, shown) as chain_fd:
            _walk(chain_fd, f"{shown}/{chain}", _MAX_DEPTH - 1, lambda _n, st: _count(measured, st))
    except FileNotFoundError:
        pass
    return measured


def remove_chain(workspace_root: str, kind: str, chain: str) -> ChainFiles:
    """Remove a chain's folder of one kind (LEGACY: the loose files of the kind's folder);
    returns what was removed. Checks everything first: a hostile entry removes nothing."""
    removed = ChainFiles(workspace=workspace_root, kind=kind, chain=chain)
    shown = f"{workspace_root}/{RESERVED_DIR}/{kind}"
    try:
        with _kind_folder(workspace_root, kind) as kind_fd:
            if chain == LEGACY:
                _remove_loose_files(kind_fd, shown, removed)
            else:
                remove_folder(kind_fd, chain, f"{shown}/{chain}", removed)
    except FileNotFoundError:
        pass  # nothing there (any more): removing is idempotent
    return removed


@contextmanager
def reserved_folder(workspace_root: str, *names: str) -> Iterator[int]:
    """`.durable-agent/<names...>` of the workspace, opened level by level without following
    a link: one swapped in at any level, whenever, is refused (HostileLayout), never used."""
    with ExitStack() as stack:
        fd = stack.enter_context(_opened(workspace_root, None, workspace_root))
        shown = "."
        for name in (RESERVED_DIR, *names):
            fd = stack.enter_context(_opened(name, fd, shown))
            shown = f"{shown}/{name}"
        yield fd


@contextmanager
def _kind_folder(workspace_root: str, kind: str) -> Iterator[int]:
    """`.durable-agent/<kind>` of the workspace, opened without following a link at either level."""
    with (
        _opened(workspace_root, None, workspace_root) as root_fd,
        _opened(RESERVED_DIR, root_fd, workspace_root) as fd,
        _opened(kind, fd, f"{workspace_root}/{RESERVED_DIR}") as kind_fd,
    ):
        yield kind_fd


def remove_folder(parent_fd: int, name: str, shown: str, removed: ChainFiles) -> None:
    """Remove folder `name` of `parent_fd` and what it holds, counting into `removed`."""
    with _opened(name, parent_fd, shown) as fd:
        _walk(fd, shown, _MAX_DEPTH - 1, lambda _n, _st: None)  # refuse before removing anything
        _walk(fd, shown, _MAX_DEPTH - 1, lambda n, st: _unlink(n, st, removed), remove_folders=True)
    os.rmdir(name, dir_fd=parent_fd)


def _remove_loose_files(kind_fd: int, shown: str, removed: ChainFiles) -> None:
    loose: list[tuple[str, os.stat_result]] = []
    with os.scandir(kind_fd) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                loose.append((entry.name, st))
            elif not stat.S_ISDIR(st.st_mode):
                raise _hostile(f"{shown}/{entry.name}", st.st_mode)
    for name, st in loose:
        _unlink((kind_fd, name), st, removed)


Visit = Callable[[tuple[int, str], os.stat_result], None]


def _walk(fd: int, shown: str, depth: int, visit: Visit, remove_folders: bool = False) -> None:
    """Visit every regular file under `fd` as `visit((folder_fd, name), stat)`."""
    with os.scandir(fd) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                visit((fd, entry.name), st)
            elif stat.S_ISDIR(st.st_mode) and depth > 0:
                with _opened(entry.name, fd, shown) as child:
                    _walk(child, f"{shown}/{entry.name}", depth - 1, visit, remove_folders)
                if remove_folders:
                    os.rmdir(entry.name, dir_fd=fd)
            else:
                raise _hostile(f"{shown}/{entry.name}", st.st_mode)


def _unlink(where: tuple[int, str], st: os.stat_result, removed: ChainFiles) -> None:
    folder_fd, name = where
    os.unlink(name, dir_fd=folder_fd)  # unlink never follows: a swapped-in link goes, not its target
    _count(removed, st)


def _count(into: ChainFiles, st: os.stat_result) -> None:
    into.files += 1
    into.bytes += st.st_size
    into.newest_mtime = max(into.newest_mtime, st.st_mtime)


@contextmanager
def _opened(name: str, dir_fd: int | None, shown_parent: str) -> Iterator[int]:
    """Folder `name` of `dir_fd`, never through a link; without `dir_fd`, `name` is a resolved
    absolute path, and the folder opened must be the one it named: a folder on the way swapped
    for a symlink meanwhile (by a command of a run whose workspace holds this one) is refused."""
    shown = name if dir_fd is None else f"{shown_parent}/{name}"
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise _hostile(shown, os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode) from None
    if dir_fd is None and os.readlink(f"/proc/self/fd/{fd}") != os.path.abspath(name):
        os.close(fd)
        raise HostileLayout(f"{name} was swapped while in use: a folder on its path is now a link; refused")
    try:
        yield fd
    finally:
        os.close(fd)


def _hostile(shown: str, mode: int) -> HostileLayout:
    return HostileLayout(
        f"{shown} is {_kind_text(mode)}; durable-agent never follows or removes it: inspect it and remove it by hand"
    )


def _kind_text(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a folder nested deeper than durable-agent writes"
    return f"a {SPECIAL_KINDS.get(stat.S_IFMT(mode), 'special file')}"
