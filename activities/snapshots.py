"""Workspace snapshots at step boundaries: a content-addressed store outside every workspace.

Layout under the store (`DURABLE_AGENT_SNAPSHOT_STORE`, default `DURABLE_AGENT_HOME/snapshots`):
- `blobs/ab/cdef…`: a file's bytes (a symlink's target), named by their sha256; written once.
- `manifests/ab/cdef…`: a snapshot, named by the sha256 of its zlib-compressed JSON. A manifest
  lists every file (`files`, a base) or only what changed since its `parent` (`changes`, a path
  mapped to its entry or to null when deleted); every `BASE_EVERY`th is a base, so a snapshot
  is rebuilt from at most that many small reads, and a step that changed one file costs that
  file's bytes (once, whoever wrote them before) plus a ~200-byte manifest. A manifest names
  the folder it was taken of (`root`, as the worker resolved and checked it): `rewind` resets
  no other. A step that changed nothing in the same folder costs nothing: its digest is its
  parent's.
- `refs/<chain>`: the digest of a run chain's latest snapshot, for `durable-agent gc`, and on a
  second line the workflow id of its runs; every snapshot of the chain is reached from it
  through the parents.

An entry is `[mode, size, mtime_ns, ctime_ns, inode, sha256]`. Those stat fields are the stat
cache: a file whose stat matches the previous snapshot's entry, and whose mtime is older than
that snapshot's start, is not read again (git's "racy" rule: a file changed during the walk, in
the clock tick the walk began, is hashed again next time). A run's first snapshot has no
previous one: it takes the stat cache from this worker's latest snapshot of the same folder
(another run's), trusting an entry only once its blob is found in the store. Not kept: empty folders, special
files, ownership. `docs/fork.md` has the figures that chose this over git's object store.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import functools
import hashlib
import json
import os
import secrets
import shutil
import stat
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.regular_files import open_regular_at
from activities.workspace import RESERVED_DIR, Workspace, WorkspaceError, check_allowed, workspace_roots
from workflows.hosts import RESTORE_ACTIVITY, RestoreDone, RestoreRequest
from workflows.snapshots import SNAPSHOT_ACTIVITY, SnapshotRequest, SnapshotTaken

STORE_ENV = "DURABLE_AGENT_SNAPSHOT_STORE"
BASE_EVERY = 256
"""A manifest with every file after this many deltas: bounds the reads a restore makes."""
CACHED_FILES = 100_000
"""File entries of workspaces' latest snapshots a worker keeps in memory (the stat cache, warm),
~500 bytes each: 50 MB, beyond the newest workspace's, which is always kept. Counted in files,
not workspaces: with a cap of 64 workspaces, a worker serving more runs re-read each run's
manifests at every step (docs/fork.md)."""

WHOLE_READ_BYTES = 1 << 20
"""A file up to this size is read whole and hashed in memory, as most are; a larger one is
copied into the store in pieces of this size while hashed: a snapshot never holds more of a
file in memory, whatever its size. The store holds every byte of it (a sparse file's holes
too): `snapshot_exclude` is for what is large and rebuilt (datasets, build output)."""
PERMISSIONS = 0o777
"""The mode bits a restore gives a file: setuid and setgid never (the restored file belongs to
whoever restores, root included), though a snapshot records them."""
DIFF_MAX_BYTES = 1 << 20
"""`unified_diff` shows a text file's lines up to this size; a larger one is named, not shown."""

Entry = list  # [mode, size, mtime_ns, ctime_ns, inode, sha256]
Files = dict[str, Entry]
_MODE, _SIZE, _MTIME, _CTIME, _INODE, _DIGEST = range(6)


class SnapshotError(Exception):
    """A snapshot that is missing or unreadable, in one line."""


def store_path() -> Path:
    explicit = os.environ.get(STORE_ENV)
    if explicit:
        return Path(explicit).resolve()
    home = os.environ.get("DURABLE_AGENT_HOME") or ".durable-agent"
    return Path(home).resolve() / "snapshots"


def _kept(path: str) -> bool:
    """Whether the store holds the object at `path`; if so, stamped now: `durable-agent gc`
    spares an object younger than an hour, and this one is about to be reached by a manifest
    and a ref still to be written (a blob of a closed chain that a new snapshot reuses)."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except PermissionError:  # another user's object in a shared store: there, if not stamped
        return os.path.exists(path)


def _temporary_in(folder: str) -> tuple[int, str]:
    """A new file of its own in `folder` (descriptor, path), named at random and made
    exclusively: two runs' snapshots may write the same blob at once, in one worker or in
    workers of several hosts sharing the store, whose pids and thread ids may be the same.
    Its mode is the umask's, as the object's will be."""
    path = f"{folder}/.{secrets.token_hex(12)}.tmp"
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), path


def _write_whole(path: str, data: bytes) -> None:
    """`data` at `path`, whole or not at all: a reader never sees half an object or ref, and a
    failed write leaves no temporary file behind."""
    fd, temporary = _temporary_in(os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _coarse_now_ns() -> int:
    """The clock file times are stamped with (a coarse one on Linux): a file stamped at or
    after this instant may still change within the same tick."""
    clock = getattr(time, "CLOCK_REALTIME_COARSE", time.CLOCK_REALTIME)
    return time.clock_gettime_ns(clock)


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or store_path()
        self._latest = LatestSnapshots()
        self._lock = threading.Lock()  # takes of several workspaces run in threads at once
        self._ref_seen: dict[str, str] = {}
        """folder -> the chain whose ref this store wrote or found for it last: an unchanged
        snapshot of the same chain looks for no ref (no `stat` per step)."""

    # --- taking -------------------------------------------------------------------------

    def take(
        self,
        workspace: str,
        previous: str | None,
        chain: str | None = None,
        exclude: Sequence[str] = (),
        owner: str | None = None,
    ) -> tuple[str, int]:
        """Snapshot `workspace` (resolved: its real path, as `Workspace.root` gives it) but the
        names matching `exclude`; returns the digest and the bytes it added to the store.
        `chain`: the ref to point at it, `owner` the workflow id of that chain's runs."""
        root = os.path.abspath(workspace)
        verified_ns = _coarse_now_ns()
        old_files, depth, old_verified, taken_from = self._previous(root, previous)
        known, known_verified = (old_files, old_verified) if previous is not None else self._stat_hints(root)
        added = 0
        files: Files = {}
        for rel, st, where in _walk(root, exclude):
            old = known.get(rel)
            if (
                old is not None
                and _same_stat(old, st)
                and old[_MTIME] < known_verified
                and (previous is not None or self._has_blob(old[_DIGEST]))
            ):
                files[rel] = old
                continue
            put = self._put_blob(where, st)
            if put is None:
                continue  # no longer a file or link (changed meanwhile): the next snapshot has it
            digest, written = put
            added += written
            files[rel] = [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest]
        changes = {p: e for p, e in files.items() if old_files.get(p) != e}
        changes.update({p: None for p in old_files.keys() - files.keys()})
        if previous is not None and not changes and taken_from == root:
            self._remember(root, previous, files, depth, verified_ns)
            if chain and self._ref_seen.get(root) != chain:  # a chain begun on another's snapshot (a rewind's)
                self.ref_unless_there(chain, previous, owner)
                self._ref_seen[root] = chain
            return previous, added
        base = previous is None or depth + 1 >= BASE_EVERY
        manifest = {"parent": previous, "verified_ns": verified_ns, "root": root}
        manifest.update({"depth": 0, "files": files} if base else {"depth": depth + 1, "changes": changes})
        digest, written = self._put_manifest(manifest)
        self._remember(root, digest, files, manifest["depth"], verified_ns)
        if chain:
            self.write_ref(chain, digest, owner)
            self._ref_seen[root] = chain
        return digest, added + written

    def _previous(self, root: str, previous: str | None) -> tuple[Files, int, int, str | None]:
        """The previous snapshot's files, depth, `verified_ns` and the folder it was taken of."""
        with self._lock:
            cached = self._latest.get(root)
        if previous is None:
            return ({}, 0, 0, None)
        if cached is not None and cached[0] == previous:
            return (*cached[1:], root)
        manifest = self.manifest(previous)
        verified_ns = int(manifest.get("verified_ns", 0))
        return (self.files(previous), int(manifest["depth"]), verified_ns, manifest.get("root"))

    def has(self, digest: str) -> bool:
        """Whether the store holds the snapshot `digest` (`gc` removes those of closed chains)."""
        return os.path.exists(self.object_path("manifests", digest))

    def taken_from(self, digest: str) -> str | None:
        """The folder (resolved, as the worker that checked it saw it) a snapshot was taken of;
        None for a snapshot stored before manifests named it. A step that changed nothing
        shares its parent's digest only when taken of the same folder."""
        return self.manifest(digest).get("root")

    def _stat_hints(self, root: str) -> tuple[Files, int]:
        """For a run's first snapshot: the file entries of the latest snapshot this worker took
        of the same folder (another run's, most often the run before on the same repository),
        so that its unchanged files are not read and hashed again. Their blobs belong to
        another chain, which `durable-agent gc` may have removed since: each is checked."""
        with self._lock:
            cached = self._latest.get(root)
        return (cached[1], cached[3]) if cached is not None else ({}, 0)

    def object_path(self, kind: str, digest: str) -> str:
        """Where the store keeps an object (`blobs` or `manifests`). A string, not a Path: a
        snapshot asks for one per file, where building a Path cost more than its `stat`."""
        return f"{os.fspath(self.root)}/{kind}/{digest[:2]}/{digest[2:]}"

    def _has_blob(self, digest: str) -> bool:
        return _kept(self.object_path("blobs", digest))

    def _remember(self, root: str, digest: str, files: Files, depth: int, verified_ns: int) -> None:
        with self._lock:
            self._latest.put(root, (digest, files, depth, verified_ns))

    def _put_blob(self, where: tuple[int, str], st: os.stat_result) -> tuple[str, int] | None:
        """A walked file's bytes (as many as the walk saw: a file something appends to
        meanwhile is read to that size, and read again next time, its stat changed) or link's
        target stored; None if it is neither now."""
        if stat.S_ISLNK(st.st_mode):
            target = _link_target(where)
            return None if target is None else self._put_bytes(target)
        opened = open_regular_at(*where)
        if opened is None:
            return None
        with opened as f:
            if st.st_size <= WHOLE_READ_BYTES:
                return self._put_bytes(f.read(st.st_size))
            return self._put_streamed(f, st.st_size)

    def _put_bytes(self, data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        return digest, self._write_object("blobs", digest, data)

    def _put_streamed(self, source: BinaryIO, size: int) -> tuple[str, int]:
        """A large file's blob: its first `size` bytes copied into a temporary file of the
        store while hashed, then named by its digest (dropped if the store has it already). A
        copy left by a killed worker is in `blobs/incoming/`, which `durable-agent gc` sweeps."""
        folder = f"{os.fspath(self.root)}/blobs/incoming"
        os.makedirs(folder, exist_ok=True)
        fd, temporary = _temporary_in(folder)
        hashed = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as copy:
                while chunk := source.read(min(WHOLE_READ_BYTES, size - copy.tell())):
                    hashed.update(chunk)
                    copy.write(chunk)
                size = copy.tell()
            digest = hashed.hexdigest()
            path = self.object_path("blobs", digest)
            if _kept(path):
                return digest, 0
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.replace(temporary, path)
            return digest, size
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    def _put_manifest(self, manifest: dict) -> tuple[str, int]:
        data = zlib.compress(json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode(), 6)
        digest = hashlib.sha256(data).hexdigest()
        return digest, self._write_object("manifests", digest, data)

    def _write_object(self, kind: str, digest: str, data: bytes) -> int:
        path = self.object_path(kind, digest)
        if _kept(path):  # most blobs of a snapshot are there already
            return 0
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_whole(path, data)
        return len(data)

    def write_ref(self, chain: str, digest: str, owner: str | None = None) -> None:
        """Point the ref `chain` (a run folder's name: workflows/compaction.run_folder) at
        `digest`. Its second line names `owner`, the workflow id whose runs use the chain:
        `durable-agent gc` asks Temporal about it (the name holds the id made safe for a file)."""
        if "/" in chain or "\0" in chain or chain in ("", ".", "..") or len(chain.encode()) > 255:
            raise SnapshotError(f"{chain!r} is not a ref's name: one file name")
        path = self._ref_path(chain)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(str(path), (digest if owner is None else f"{digest}\n{owner}").encode())

    def ref_unless_there(self, chain: str, digest: str, owner: str | None = None) -> None:
        """`write_ref`, unless the chain has a ref already: a chain that starts on another's
        snapshot (a fork's, a rewound run's) is reached from its first moment."""
        if not self._ref_path(chain).exists():
            self.write_ref(chain, digest, owner)

    def _ref_path(self, chain: str) -> Path:
        return self.root / "refs" / chain

    # --- reading ------------------------------------------------------------------------

    def manifest(self, digest: str) -> dict:
        """A snapshot's manifest, decoded: what `durable-agent gc` walks too."""
        try:
            with open(self.object_path("manifests", digest), "rb") as f:
                return json.loads(zlib.decompress(f.read()))
        except FileNotFoundError:
            raise SnapshotError(f"snapshot {digest[:12]} is not in the store {self.root}") from None
        except (zlib.error, ValueError) as e:
            raise SnapshotError(f"snapshot {digest[:12]} in {self.root} is damaged: {e}") from None

    def files(self, digest: str) -> Files:
        """Every file of a snapshot: its base, then each delta after it, applied in order."""
        chain = [self.manifest(digest)]
        while "files" not in chain[-1]:
            chain.append(self.manifest(chain[-1]["parent"]))
        files = dict(chain.pop()["files"])
        for manifest in reversed(chain):
            for path, entry in manifest["changes"].items():
                if entry is None:
                    files.pop(path, None)
                else:
                    files[path] = entry
        return files

    def blob(self, digest: str) -> bytes:
        with self._opened_blob(digest) as f:
            return f.read()

    def _opened_blob(self, digest: str) -> BinaryIO:
        try:
            return open(self.object_path("blobs", digest), "rb")
        except FileNotFoundError:
            raise SnapshotError(f"file content {digest[:12]} is not in the store {self.root}") from None

    def restore(self, digest: str, folder: str) -> int:
        """Write the snapshot's files into `folder` (a resolved path, its parent there), a new
        or empty folder; returns their count. The parent must still be the folder its path
        names (a folder on it swapped for a link is refused), and `folder` is entered without
        following a link, and found empty through its descriptor."""
        files = self.files(digest)
        parent = _opened_root(os.path.dirname(folder) or "/")
        try:
            top = _folder_made(parent, [os.path.basename(folder)])
        finally:
            os.close(parent)
        try:
            if os.listdir(top):
                raise SnapshotError(f"{folder} holds files: a snapshot is restored into a new or empty folder only")
            self._write_files_at(top, files)
        finally:
            os.close(top)
        return len(files)

    def reset(self, digest: str, workspace: str, exclude: Sequence[str] = ()) -> int:
        """Make `workspace` (resolved, as `Workspace.root` gives it) hold exactly the snapshot's
        files, with their permission bits (PERMISSIONS); `.durable-agent/` and the names
        matching `exclude` (which the run's snapshots leave out: `node_modules`, a virtualenv)
        are left as they are, but for a folder standing where the snapshot has a file.
        Returns how many files the snapshot holds."""
        wanted = self.files(digest)
        count = len(wanted)
        root = os.path.abspath(workspace)
        for rel, st, (folder_fd, name) in _walk(root, exclude):
            entry = wanted.get(rel)
            if entry is not None and _holds(entry, st, (folder_fd, name)):
                wanted.pop(rel)
                continue
            os.unlink(name, dir_fd=folder_fd)  # never follows: a link swapped in goes, not its target
        top = _opened_root(root)
        try:
            self._write_files_at(top, wanted)
        finally:
            os.close(top)
        with self._lock:
            self._latest.drop(root)
        return count

    def _write_files_at(self, top: int, files: Files) -> None:
        """Each file and link of `files` into the opened folder `top`, through descriptors as
        `_walk` reads: never through a link planted in the folder."""
        for rel, entry in sorted(files.items()):
            *folders, name = rel.split("/")
            fd = _folder_made(top, folders)
            try:
                _remove_at(fd, name)  # what stood there goes, never what a link names
                if stat.S_ISLNK(entry[_MODE]):
                    os.symlink(self.blob(entry[_DIGEST]).decode("utf-8", "surrogateescape"), name, dir_fd=fd)
                    continue
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                with (
                    self._opened_blob(entry[_DIGEST]) as blob,
                    os.fdopen(os.open(name, flags, 0o600, dir_fd=fd), "wb") as f,
                ):
                    shutil.copyfileobj(blob, f)  # in pieces: a file of any size, never whole in memory
                    os.fchmod(f.fileno(), entry[_MODE] & PERMISSIONS)
            finally:
                if fd != top:
                    os.close(fd)


class LatestSnapshots:
    """workspace -> (digest, files, depth, verified_ns) of its latest snapshot, the least
    recently taken dropped first while more than CACHED_FILES file entries are held."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[str, Files, int, int]] = OrderedDict()
        self.files_held = 0

    def get(self, root: str) -> tuple[str, Files, int, int] | None:
        return self._entries.get(root)

    def put(self, root: str, latest: tuple[str, Files, int, int]) -> None:
        self.drop(root)
        self._entries[root] = latest
        self.files_held += len(latest[1])
        while self.files_held > CACHED_FILES and len(self._entries) > 1:
            _, (_, evicted, _, _) = self._entries.popitem(last=False)
            self.files_held -= len(evicted)

    def drop(self, root: str) -> None:
        dropped = self._entries.pop(root, None)
        if dropped is not None:
            self.files_held -= len(dropped[1])


def changed(before: Files, after: Files) -> tuple[list[str], list[str], list[str]]:
    """Files added, modified (content or mode) and deleted between two snapshots."""
    added = sorted(after.keys() - before.keys())
    deleted = sorted(before.keys() - after.keys())
    modified = sorted(
        p
        for p in after.keys() & before.keys()
        if (after[p][_DIGEST], after[p][_MODE]) != (before[p][_DIGEST], before[p][_MODE])
    )
    return added, modified, deleted


def unified_diff(store: Store, before: Files, after: Files) -> str:
    """A unified diff of the text files; a binary one, or one over DIFF_MAX_BYTES, is named, not shown."""
    added, modified, deleted = changed(before, after)
    out: list[str] = []
    for path in sorted([*added, *modified, *deleted]):
        old = _text(store, before.get(path))
        new = _text(store, after.get(path))
        if old is None or new is None:
            large = any(e is not None and e[_SIZE] > DIFF_MAX_BYTES for e in (before.get(path), after.get(path)))
            out.append(f"{'Large' if large else 'Binary'} file {path} differs\n")
            continue
        out += difflib.unified_diff(
            old,
            new,
            fromfile=f"a/{path}" if path in before else "/dev/null",
            tofile=f"b/{path}" if path in after else "/dev/null",
        )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


def _text(store: Store, entry: Entry | None) -> list[str] | None:
    """A file's lines; None for a binary file or one over DIFF_MAX_BYTES."""
    if entry is None:
        return []
    if entry[_SIZE] > DIFF_MAX_BYTES:
        return None
    try:
        return store.blob(entry[_DIGEST]).decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _same_stat(entry: Entry, st: os.stat_result) -> bool:
    return (entry[_MODE], entry[_SIZE], entry[_MTIME], entry[_CTIME], entry[_INODE]) == (
        st.st_mode,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
    )


def _walk(root: str, exclude: Sequence[str] = ()) -> Iterator[tuple[str, os.stat_result, tuple[int, str]]]:
    """(relative path, lstat, (folder descriptor, name)) of every regular file and symlink,
    `.durable-agent/` at the top excluded; symlinked folders are recorded as links, never
    entered. Through descriptors from the root's, which must be `root` itself: a folder on the
    way swapped for a symlink (by a command of a run whose workspace holds this one) is
    refused at the root and skipped below it, never followed out of the workspace. A folder's
    descriptor is valid until the walk moves on; one per level is open at a time."""
    try:
        top = _opened_root(root)
    except (FileNotFoundError, NotADirectoryError):
        return  # no folder: nothing to snapshot
    frames: list[tuple[str, int, Iterator[str]]] = []
    try:
        files, folders = _listing("", top, exclude)
        yield from ((path, st, (top, name)) for path, st, name in files)
        frames.append(("", top, iter(folders)))
        while frames:
            rel, fd, pending = frames[-1]
            name = next(pending, None)
            if name is None:
                frames.pop()
                if fd != top:
                    os.close(fd)
                continue
            try:
                child = os.open(name, _FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno not in _GONE:
                    raise  # a folder the worker may not read fails the snapshot: never left out
                continue  # gone, or no longer a folder: not part of this snapshot
            path = f"{rel}/{name}" if rel else name
            frames.append((path, child, iter(())))  # so that `finally` closes it, should the listing fail
            files, folders = _listing(path, child, exclude)
            frames[-1] = (path, child, iter(folders))
            yield from ((p, st, (child, n)) for p, st, n in files)
    finally:
        for _, fd, _ in frames:
            if fd != top:
                os.close(fd)
        os.close(top)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL)
"""What a walked name may have become meanwhile: gone, a file or link where a folder was, or no
longer a link (readlink's EINVAL)."""


def _opened_root(root: str) -> int:
    """The folder `root` names, checked to be that folder: none on its path swapped for a link."""
    fd = os.open(root, _FOLDER_FLAGS)
    if os.readlink(f"/proc/self/fd/{fd}") != root:
        os.close(fd)
        raise SnapshotError(f"{root} was swapped while in use: a folder on its path is now a link")
    return fd


def _remove_at(folder_fd: int, name: str) -> None:
    """Whatever stands at `name` in the opened folder: a file or link, or a folder with all it
    holds (where the snapshot has a file, a folder made since, its excluded names included)."""
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(name, dir_fd=folder_fd)  # through descriptors, never following a link


def _folder_made(top: int, names: list[str]) -> int:
    """The folder `names` leads to from `top`, each level made if missing and entered without
    following a link (SnapshotError for one); `top` itself when `names` is empty."""
    fd = top
    try:
        for name in names:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=fd)
            try:
                below = os.open(name, _FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise SnapshotError(f"{name} is not a folder (a link or a file stands there): {e.strerror}") from None
            if fd != top:
                os.close(fd)
            fd = below
    except BaseException:
        if fd != top:
            os.close(fd)
        raise
    return fd


def _listing(rel: str, fd: int, exclude: Sequence[str]) -> tuple[list[tuple[str, os.stat_result, str]], list[str]]:
    """The files and links of an open folder (relative path, lstat, name), and its folders."""
    files, folders = [], []
    with os.scandir(fd) as entries:
        for entry in entries:
            if (not rel and entry.name == RESERVED_DIR) or any(fnmatch(entry.name, p) for p in exclude):
                continue
            st = entry.stat(follow_symlinks=False)
            path = f"{rel}/{entry.name}" if rel else entry.name
            if stat.S_ISDIR(st.st_mode):
                folders.append(entry.name)
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                files.append((path, st, entry.name))
    return files, folders


def _holds(entry: Entry, st: os.stat_result, where: tuple[int, str]) -> bool:
    """Whether a walked regular file is the entry's already: its permission bits, size and
    content. A link is never taken to hold: it is made again, which costs a few bytes."""
    same_bits = stat.S_IMODE(st.st_mode) == entry[_MODE] & PERMISSIONS  # a setuid bit added since goes too
    if not stat.S_ISREG(st.st_mode) or not stat.S_ISREG(entry[_MODE]) or not same_bits or st.st_size != entry[_SIZE]:
        return False
    opened = open_regular_at(*where)
    if opened is None:
        return False
    with opened as f:  # in pieces; bytes beyond the size (written meanwhile) differ too
        return hashlib.file_digest(f, "sha256").hexdigest() == entry[_DIGEST]


def _link_target(where: tuple[int, str]) -> bytes | None:
    """A walked link's target; None if it is no longer a link."""
    folder_fd, name = where
    try:
        return os.readlink(name, dir_fd=folder_fd).encode("utf-8", "surrogateescape")
    except OSError as e:
        if e.errno not in _GONE:
            raise
        return None


_T = TypeVar("_T")

AFTER_TOOL_MARGIN_S = 10.0
"""What a call's snapshot leaves of its attempt's time: the outcome must reach the server."""


def time_left_s() -> float | None:
    """Of the current attempt's start-to-close timeout; None without one."""
    info = activity.info()
    if info.start_to_close_timeout is None:
        return None
    ends = info.started_time + info.start_to_close_timeout
    return (ends - datetime.now(UTC)).total_seconds()


async def within_time_left(part: Callable[[], Awaitable[_T]], what: str, then_s: float = 0.0) -> _T | None:
    """`part()`, a part of an activity its outcome does not depend on (a snapshot after a tool
    call, the parts of a run's opening after its check); None when it would leave less than
    AFTER_TOOL_MARGIN_S and `then_s` of the attempt's time, or fails (logged as "no `what`"):
    the run then asks the part's own activity, which reports why."""
    left = time_left_s()
    if left is not None and left < AFTER_TOOL_MARGIN_S + then_s:
        return None
    try:
        return await asyncio.wait_for(part(), None if left is None else left - AFTER_TOOL_MARGIN_S - then_s)
    except Exception as e:  # noqa: BLE001 - the activity is done whatever this part does
        activity.logger.warning("no %s: %s", what, e or type(e).__name__)
        return None


class SnapshotActivities:
    def __init__(self, roots: list[str] | None = None, store: Store | None = None) -> None:
        self._roots = roots if roots is not None else workspace_roots()
        self._store = store or Store()

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.snapshot_workspace, self.restore_snapshot]

    @activity.defn(name=SNAPSHOT_ACTIVITY)
    async def snapshot_workspace(self, request: SnapshotRequest) -> SnapshotTaken:
        return await self.take(request)

    async def after_tool(self, request: SnapshotRequest) -> SnapshotTaken | None:
        """The step's snapshot taken by its last tool call's activity; None when it cannot be,
        or not within the call's time left less AFTER_TOOL_MARGIN_S (the run then asks
        `snapshot_workspace` for it, which reports why): the call's outcome never depends on it."""
        return await within_time_left(
            functools.partial(self.take, request), f"snapshot of step {request.step} with its tool call"
        )

    async def take(self, request: SnapshotRequest) -> SnapshotTaken:
        try:
            root = Workspace(request.workspace, self._roots).root
            owner = activity.info().workflow_id
            take = functools.partial(self._store.take, exclude=request.exclude, owner=owner)
            digest, added = await asyncio.to_thread(take, root, request.previous, request.chain or None)
        except (WorkspaceError, SnapshotError) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from None
        except OSError as e:
            message = f"snapshot_workspace could not store the workspace: {e}"
            raise ApplicationError(message, type="SnapshotFailed") from e
        return SnapshotTaken(digest=digest, step=request.step, added_bytes=added)

    @activity.defn(name=RESTORE_ACTIVITY)
    async def restore_snapshot(self, request: RestoreRequest) -> RestoreDone:
        """A moved run's workspace on its new host: exactly the snapshot's files, read from the
        store both hosts share (`DURABLE_AGENT_SNAPSHOT_STORE`); the folder is made if missing."""
        try:
            check_allowed(request.workspace, self._roots)
            await asyncio.to_thread(os.makedirs, request.workspace, exist_ok=True)
            root = Workspace(request.workspace, self._roots).root
            files = await asyncio.to_thread(self._store.reset, request.digest, root, request.exclude)
            return RestoreDone(files=files)
        except (WorkspaceError, SnapshotError) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from None
        except OSError as e:
            message = f"restore_snapshot could not write the workspace: {e}"
            raise ApplicationError(message, type="RestoreFailed") from e
