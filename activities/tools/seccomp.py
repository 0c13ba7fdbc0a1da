"""The seccomp filter of `run_command`'s sandbox: system calls a command never needs and that
would let it undo the sandbox (mounts, namespaces) or reach the kernel's riskier surfaces.

Built with libseccomp (through `pyseccomp`) rather than written as BPF by hand: the library
knows each architecture's system call numbers and checks the architecture of every call,
so a 32-bit call (`int 0x80` on x86_64) cannot slip past the rules (the kernel kills it).
Refused calls fail with EPERM, as they would for an unprivileged user, so tools that try
them (`unshare`, `mount`) print an ordinary error instead of dying.
"""

from __future__ import annotations

import errno
import fcntl
import os
from functools import cache

REFUSED = (
    # mounts: remounting the read-only binds, unmounting the masks, new file systems (cgroup)
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # namespaces: entering another one, or making a user namespace where it would be root
    "setns",
    # debugging other processes, reading or writing their memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # the kernel's keyrings, BPF programs, performance counters
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    # the kernel itself and the machine
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "iopl", "ioperm", "lookup_dcookie", "vhangup",
    # files by handle bypass the path checks of the mounts above
    "open_by_handle_at", "name_to_handle_at",
)  # fmt: skip
"""Refused outright with EPERM."""

NAMESPACE_FLAGS = (
    0x10000000,  # CLONE_NEWUSER
    0x00020000,  # CLONE_NEWNS
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x02000000,  # CLONE_NEWCGROUP
    0x00000080,  # CLONE_NEWTIME
)
"""`unshare` and `clone` with any of these flags are refused; without them (threads, forks) they pass."""

TIOCSTI = 0x5412
"""The ioctl that pushes bytes into a terminal's input: a command must not type into the worker's."""


class SeccompUnavailable(Exception):
    """The filter cannot be built here; the message says why."""


SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
"""The filter's memory file can be neither written, nor resized, nor unsealed, even by the worker."""


def filter_file() -> str:
    """Where a command's bubblewrap opens the compiled BPF program: the worker's own sealed
    memory file, as `/proc/<worker pid>/fd/<n>`. Each open of that path is a new open file with
    an offset of its own (bubblewrap reads the program from a descriptor, and a shared
    descriptor's offset would be consumed by the first command).

    The program never lies on disk, where a command of a workspace holding the file, or another
    user owning a folder above it, could rewrite or swap it for every later sandbox. Only
    processes that may inspect the worker (its user, root) can open the path, none can change
    what it holds, and a sandboxed command sees a /proc of its own PID namespace."""
    return f"/proc/{os.getpid()}/fd/{_sealed_program()}"


@cache
def _sealed_program() -> int:
    """The program in a sealed memory file, built once per worker (a forked child inherits it)."""
    rules = _rules()
    try:
        fd = os.memfd_create("durable-agent-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        with os.fdopen(fd, "wb", closefd=False) as f:
            rules.export_bpf(f)  # type: ignore[attr-defined]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except OSError as e:
        raise SeccompUnavailable(f"the seccomp filter cannot be kept in a sealed memory file: {e}") from None
    return fd


def _rules() -> object:
    """The filter's rules, compiled by libseccomp."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError) as e:  # RuntimeError: libseccomp itself is missing
        raise SeccompUnavailable(f"libseccomp cannot be loaded ({e}); install libseccomp2 and pyseccomp") from None
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    refuse = seccomp.ERRNO(errno.EPERM)
    try:
        for name in REFUSED:
            _refuse(rules, refuse, name)
        for flag in NAMESPACE_FLAGS:
            rules.add_rule(refuse, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
            rules.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory, where seccomp cannot look: ENOSYS makes the C
        # library fall back on clone, whose flags the rules above do see.
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        rules.add_rule(refuse, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
        return rules
    except OSError as e:
        raise SeccompUnavailable(f"the seccomp filter cannot be built: {e}") from None


def _refuse(rules: object, action: int, name: str) -> None:
    try:
        rules.add_rule(action, name)  # type: ignore[attr-defined]
    except OSError as e:
        # A name this architecture does not have (umount, iopl on arm64) is nothing to refuse.
        if e.errno not in (errno.EDOM, errno.EINVAL, errno.EFAULT):
            raise
