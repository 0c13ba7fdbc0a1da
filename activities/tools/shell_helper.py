"""PID 1 of a run's sandbox (`run_sandbox.py`): starts each command the worker asks for.

Run by the sandbox's own `python3 -I -S`, so it uses the standard library only and imports
nothing of the project (the project is not mounted in the sandbox). It is PID 1 of the
sandbox's PID namespace, which gives it two properties the design relies on: the commands
cannot signal it (the kernel drops signals to a namespace's init that it does not handle,
SIGKILL included), and when it exits the kernel kills every process left in the sandbox.
It is also not dumpable, so a command of the same uid cannot open its descriptors through
/proc/1/fd.

Protocol, over the SOCK_SEQPACKET socket on the descriptor its first argument names: each message is a
request (a dict in `marshal` format 4, from the worker only) with descriptors attached: a socket
of the command's own, the write end of its output pipe, then the `cgroup.procs` files of its
cgroups, opened by the worker. The command runs `argv` with `env` in a new session (process
group) of its own, after joining those cgroups and setting `limits` (`[resource, value]` pairs,
soft and hard); on its leader's exit the helper sends `exit <code>` on the command's socket,
then a newline and what the shell wrote to `state_file` if it wrote anything (only its
directory and `=dropped`, a name no variable has, when it is over STATE_SEND_MAX). A request
`{"end": grace_s}` on that socket, or the socket closing, ends the command's process group:
SIGTERM, SIGKILL after the grace, then `ended`. The control socket closing ends the sandbox.
What the helper sends is plain bytes, never `marshal`, whose reader is not made for data from
inside a sandbox. Its start is paid at every run's start, so it imports C modules only:
`_socket` and `_signal` in place of `socket` and `signal`, whose Python layers import `enum` and
`selectors` (as `json` would import `re`); `posix` in place of `os`, whose Python layer imports
`_collections_abc`, `stat` and `posixpath`; `_ctypes` for the one `prctl`, where `ctypes` and
`array` (descriptors are packed with `int.to_bytes`) would each import `collections`.

A request `{"standby": true}` with the `cgroup.procs` files of the NEXT command's cgroups
forks a standby child that joins them at once and waits: joining a cgroup waits for an RCU
grace period in the kernel (5-15 ms under load, most of a short command's time), and a
standby pays it between commands instead of inside one. A request with `"standby": true`
then goes to that child, which only sets its session, rlimits and descriptors and execs;
if the standby is gone (a command of the run killed it), the command is forked and joins
its cgroups as usual (the request carries their files either way).
"""

import _ctypes
import _signal as signal
import _socket
import marshal
import posix as os
import resource
import select
import sys
import time

PR_SET_DUMPABLE = 4
FD_BYTES = 4
"""A descriptor in SCM_RIGHTS data: a C int."""
STATE_SEND_MAX = 64 * 1024
"""Below what one SOCK_SEQPACKET message takes (~200 KB with Linux's default buffers); the
worker keeps no variables of a state over 32,000 characters anyway (MAX_STATE_CHARS)."""
DROPPED = b"=dropped"


class Standby:
    """A forked child already in the next command's cgroups, waiting on `sock` for its request."""

    def __init__(self, pid, sock):
        self.pid = pid
        self.sock = sock


class Command:
    def __init__(self, pid, sock, state_file):
        self.pid = pid
        self.sock = sock
        self.state_file = state_file
        self.exited = False
        self.kill_at = None
        self.killed = False


class _CInt(_ctypes._SimpleCData):
    _type_ = "i"


class _CFunction(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _CInt


class _ThisProcess:
    """The C library's symbols, as `ctypes.CDLL(None)` finds them."""

    _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)


def not_dumpable():
    """No process of the sandbox's uid may open this one's descriptors, memory or environment."""
    if _CFunction(("prctl", _ThisProcess))(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(_ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main():
    not_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1: a default disposition drops it
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    control = _socket.socket(fileno=int(sys.argv[1]))
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    commands = {}  # pid -> Command
    by_fd = {}  # the command socket's descriptor -> Command
    standby = [None]  # the Standby for the next command, if any
    while True:
        ending = [c for c in commands.values() if c.kill_at is not None]
        for fd, _ in poller.poll(20 if ending else None):
            if fd == control.fileno():
                if not receive(control, commands, by_fd, poller, standby):
                    return  # the worker closed the sandbox: exiting kills everything in it
            elif fd == wake_read:
                drain(wake_read)
            elif fd in by_fd:
                ask_end(by_fd, fd, poller)
        reap(commands, standby)
        for command in [c for c in commands.values() if c.kill_at is not None]:
            if finish_end(command):
                if by_fd.pop(command.sock.fileno(), None) is not None:
                    poller.unregister(command.sock)
                del commands[command.pid]
                command.sock.close()


def receive(control, commands, by_fd, poller, standby):
    """Handle one message of the worker; False when the worker closed the sandbox."""
    try:
        message, fds = recv_fds(control, 1 << 20, 64)
    except OSError:
        return False
    if not message:
        return False
    request = marshal.loads(message)
    if request.get("standby") and "argv" not in request:
        replace_standby(standby, fds)
    else:
        start(request, fds, commands, by_fd, poller, standby)
    return True


def replace_standby(standby, cgroups):
    if standby[0] is not None:
        signal_group(standby[0].pid, signal.SIGKILL)  # its cgroups are the worker's to remove
        standby[0].sock.close()
    mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        wait_as_standby(theirs, cgroups)
    theirs.close()
    for fd in cgroups:
        os.close(fd)
    standby[0] = Standby(pid, mine)


def wait_as_standby(sock, cgroups):
    """In the standby child: join the cgroups, then run the request that comes. Never returns."""
    failed = None
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()  # its own process group from now on, as a command's
        keep = sorted([sock.fileno(), *cgroups])
        low = 3
        for fd in keep:  # the helper's other descriptors: the control socket, other commands' sockets
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 65536)
        for fd in cgroups:
            os.write(fd, b"0")  # 0: the writing process itself
            os.close(fd)
    except BaseException as e:
        failed = f"durable-agent: could not put the command in its cgroup: {e}\n"
    try:
        message, fds = recv_fds(sock, 1 << 20, 1)
    except BaseException:
        os._exit(0)
    if not message or not fds:
        os._exit(0)  # replaced, or the sandbox ended
    if failed is not None:  # fails closed: nothing of the command runs
        os.write(fds[0], failed.encode())
        os._exit(125)
    run_child(marshal.loads(message), fds[0], [], new_session=False)


def start(request, fds, commands, by_fd, poller, standby):
    sock = _socket.socket(fileno=fds[0])
    output, cgroups = fds[1], fds[2:]
    pid = hand_to_standby(standby, request, output) if request.get("standby") else None
    if pid is None:
        pid = os.fork()
        if pid == 0:
            run_child(request, output, cgroups)
    os.close(output)
    for fd in cgroups:
        os.close(fd)
    command = Command(pid, sock, request.get("state_file"))
    commands[pid] = command
    by_fd[sock.fileno()] = command
    poller.register(sock, select.POLLIN)
    return True


def hand_to_standby(standby, request, output):
    """The standby's pid once it has the request, or None if there is no live standby."""
    waiting, standby[0] = standby[0], None
    if waiting is None:
        return None
    try:
        send_fds(waiting.sock, marshal.dumps(request, 4), [output])
    except OSError:
        return None  # it died (a command of the run killed it): its pid is reaped as nobody's
    finally:
        waiting.sock.close()
    return waiting.pid


def run_child(request, output, cgroups, new_session=True):
    """In the forked child: never returns. Fails closed: nothing of the command runs if a step fails."""
    step = "start a session"
    try:
        if new_session:
            os.setsid()
        step = "put the command in its cgroup"
        for fd in cgroups:
            os.write(fd, b"0")  # 0: the writing process itself
            os.close(fd)
        step = "set the command's resource limits"
        for which, value in request["limits"]:
            resource.setrlimit(which, (value, value))
        step = "start the command"
        os.dup2(output, 1)
        os.dup2(output, 2)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.closerange(3, 65536)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.execve(request["argv"][0], request["argv"], request["env"])
    except BaseException as e:
        try:
            os.write(output if step != "start the command" else 2, f"durable-agent: could not {step}: {e}\n".encode())
        finally:
            os._exit(125)


def drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def reap(commands, standby):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if standby[0] is not None and standby[0].pid == pid:
            standby[0].sock.close()
            standby[0] = None
        command = commands.get(pid)
        if command is not None and not command.exited:
            command.exited = True
            state = sendable(read_state(command.state_file))
            exit_line = b"exit %d" % os.waitstatus_to_exitcode(status)
            send(command.sock, exit_line if state is None else exit_line + b"\n" + state)


def sendable(state):
    """The state, or only its directory and the DROPPED mark when it is larger than one message
    on the command's socket may be (such a send fails, and the worker would wait for good)."""
    if state is None or len(state) <= STATE_SEND_MAX:
        return state
    return state.split(b"\0", 1)[0] + b"\0" + DROPPED + b"\0"


def read_state(path):
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    finally:
        for leftover in (path, path + ".names"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
    return text


def ask_end(by_fd, fd, poller):
    command = by_fd[fd]
    try:
        message = command.sock.recv(65536)
    except OSError:
        message = b""
    grace = marshal.loads(message).get("end", 0) if message else 0
    if command.kill_at is None:
        command.kill_at = time.monotonic() + grace
        signal_group(command.pid, signal.SIGTERM if grace else signal.SIGKILL)
    if not message:  # the worker is gone: only the group is left to end
        poller.unregister(fd)
        del by_fd[fd]


def finish_end(command):
    """Whether the command's process group is gone (and its end reported); kills it after the grace."""
    if not signal_group(command.pid, 0) and command.exited:
        send(command.sock, b"ended")
        return True
    if not command.killed and time.monotonic() >= command.kill_at:
        command.killed = True
        signal_group(command.pid, signal.SIGKILL)
    return False


def signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def recv_fds(sock, size, max_fds):
    """A message and the descriptors that came with it (what `socket.recv_fds` does)."""
    fds = []
    message, ancillary, _, _ = sock.recvmsg(size, _socket.CMSG_LEN(max_fds * FD_BYTES))
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            whole = len(data) - len(data) % FD_BYTES
            fds += [int.from_bytes(data[i : i + FD_BYTES], sys.byteorder) for i in range(0, whole, FD_BYTES)]
    return message, fds


def send_fds(sock, message, fds):
    data = b"".join(fd.to_bytes(FD_BYTES, sys.byteorder) for fd in fds)
    sock.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)])


def send(sock, message):
    try:
        sock.send(message)
    except OSError:
        pass  # the worker stopped listening


main()
