"""The process that runs *inside* the sandbox: a warm parent that forks one child per episode.

Why a fork server: starting an isolated interpreter and importing numpy/sympy costs ~0.2-0.5 s, while
forking a warm parent costs ~1-2 ms. The parent (this module, run as a script with ``python -I``) imports
the preload modules once, connects to the host's control socket and then obeys three commands:

* ``spawn``: connect a fresh session socket to the host and fork a child that serves it. The child runs
  the model's code in one persistent namespace (notebook semantics) under per-call CPU and output limits.
* ``kill``: kill every other process of the sandbox (``kill(-1)`` inside the pid namespace), reap them and
  remove SysV IPC objects. This is only a helper: the host kills from outside first, empties the writable
  dirs itself and checks the result from outside (cgroup, /proc); it never trusts this reply.
* ``ping``: liveness check.

Why the parent cannot be hijacked by the episode it serves (an episode's code is hostile):

* The parent is PID 1 of the sandbox's pid namespace (bwrap ``--as-pid-1``; a container's init in Docker).
  The kernel drops SIGKILL/SIGSTOP sent to a namespace's init from inside it, and every other signal for
  which init has no handler, so the parent installs no handler at all (SIGINT is ignored, not handled).
* It is not dumpable (``PR_SET_DUMPABLE 0``): nothing in the sandbox can ptrace it or open its
  ``/proc/1/{mem,fd,environ}``, so its control socket cannot be stolen.
* The forked child closes every descriptor except its own session socket and stdio, so it never holds the
  control socket, and it restores default signal handling and dumpability for the model's code.
* As PID 1 the parent adopts every orphan: it reaps zombies on each command (they count in the pids cgroup).

The module is also imported by the host for the wire format (:func:`send_msg` / :func:`recv_msg`), so the
framing exists once. It must only use the standard library at import time: inside the sandbox the
agentgym package is not visible.
"""

from __future__ import annotations

import ast
import ctypes
import io
import json
import linecache
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

HEADER = struct.Struct("!I")
MAX_MESSAGE_BYTES = 64 << 20
TRUNCATION_MARKER = "\n... [{n} characters truncated] ...\n"


class ProtocolError(ConnectionError):
    """The peer closed the connection or sent something that is not a framed JSON message."""


def send_msg(sock: socket.socket, payload: dict[str, Any]) -> None:
    """Send one length-prefixed JSON message."""
    data = json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
    sock.sendall(HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_msg(sock: socket.socket, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """Receive one message; a message larger than ``max_bytes`` or not a JSON object is a protocol error."""
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if size > max_bytes:
        raise ProtocolError(f"message of {size} bytes exceeds the {max_bytes}-byte limit")
    try:
        payload = json.loads(_recv_exact(sock, size).decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"malformed message: {exc}") from exc
    if not isinstance(payload, dict):
        raise ProtocolError("message is not a JSON object")
    return payload


# ---- the session child ------------------------------------------------------------------------------


class _CappedWriter(io.TextIOBase):
    """A text stream that keeps the first characters and the last ``cap // 4``, counting what it drops.

    Memory stays bounded however much the code prints; :meth:`render` elides the middle with a marker
    that gives the true number of characters left out.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head: list[str] = []
        self.head_len = 0
        self.tail = ""
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self.total += len(s)
        room = self.cap - self.head_len
        if room > 0:
            self.head.append(s[:room])
            self.head_len += min(len(s), room)
            s = s[room:]
        if s:
            self.tail = (self.tail + s)[-(self.cap // 4):]
        return len(s)

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def render(self) -> str:
        head = "".join(self.head)
        if not self.truncated:
            return head
        keep = max(self.cap - len(self.tail) - len(TRUNCATION_MARKER) - 8, 0)
        return head[:keep] + TRUNCATION_MARKER.format(n=self.total - keep - len(self.tail)) + self.tail


def _format_exception(exc: BaseException) -> str:
    """The traceback as the model should see it: only frames of its own code, not this module's."""
    summary = traceback.extract_tb(exc.__traceback__)
    frames = traceback.StackSummary.from_list([f for f in summary if f.filename != __file__])
    lines = ["Traceback (most recent call last):\n", *frames.format()] if frames else []
    return "".join(lines + traceback.format_exception_only(type(exc), exc))


class _Session:
    """One episode's interpreter: a persistent namespace, per-call limits, captured output."""

    def __init__(self, conn: socket.socket, limits: dict[str, Any]) -> None:
        self.conn = conn
        self.limits = limits
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.cell = 0
        # Output written to file descriptors 1/2 directly (os.write, subprocesses, C code) lands here: an
        # anonymous memory file, so nothing is left in /tmp and it vanishes with the episode's processes.
        self.fd_out = open(os.memfd_create("agentgym-fd-output", os.MFD_CLOEXEC), "w+b")  # noqa: SIM115
        os.dup2(self.fd_out.fileno(), 1)
        os.dup2(self.fd_out.fileno(), 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        signal.signal(signal.SIGPROF, self._cpu_exceeded)
        signal.signal(signal.SIGXCPU, self._cpu_exceeded)

    @staticmethod
    def _cpu_exceeded(signum: int, frame: Any) -> None:
        raise TimeoutError("CPU time limit of this call exceeded")

    def serve(self) -> None:
        while True:
            try:
                request = recv_msg(self.conn)
            except (ProtocolError, OSError):
                os._exit(0)
            send_msg(self.conn, self.execute(str(request.get("code", "")), float(request.get("cpu_s", 10)),
                                             int(request.get("max_output", 8192))))

    def _arm_cpu_limit(self, cpu_s: float) -> None:
        """A precise per-call CPU timer (SIGPROF) plus an RLIMIT_CPU backstop the code cannot lift past hard."""
        signal.setitimer(signal.ITIMER_PROF, max(cpu_s, 0.001))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(usage.ru_utime + usage.ru_stime + cpu_s) + 2
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))

    @staticmethod
    def _disarm_cpu_limit() -> None:
        signal.setitimer(signal.ITIMER_PROF, 0)
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))

    def execute(self, code: str, cpu_s: float, max_output: int) -> dict[str, Any]:
        self.cell += 1
        filename = f"<cell {self.cell}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        out, err = _CappedWriter(max_output), _CappedWriter(max_output)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        status = "ok"
        try:
            self._arm_cpu_limit(cpu_s)
            self._run_cell(code, filename)
        except SystemExit as exc:
            status = "error"
            err.write(f"SystemExit: {exc.code}\n")
        except BaseException as exc:  # noqa: BLE001 - the model's code may raise anything; report it.
            status = "timeout" if isinstance(exc, TimeoutError) and "CPU time" in str(exc) else "error"
            err.write(_format_exception(exc))
        finally:
            self._disarm_cpu_limit()
            sys.stdout, sys.stderr = saved
        self._drain_fd_output(out)
        return {"status": status, "stdout": out.render(), "stderr": err.render(),
                "truncated": out.truncated or err.truncated}

    def _run_cell(self, code: str, filename: str) -> None:
        tree = ast.parse(code, filename, "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            # Notebook behaviour: the value of a trailing expression is shown.
            tree.body.pop()
            exec(compile(tree, filename, "exec"), self.namespace)  # noqa: S102 - this is the sandbox.
            value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
            if value is not None:
                print(repr(value))
        else:
            exec(compile(tree, filename, "exec"), self.namespace)  # noqa: S102

    def _drain_fd_output(self, out: _CappedWriter) -> None:
        """Append what was written to file descriptors 1/2 directly (bounded read), then clear the file."""
        self.fd_out.seek(0, os.SEEK_END)
        size = self.fd_out.tell()
        self.fd_out.seek(0)
        data = self.fd_out.read(min(size, 4 * out.cap)).decode("utf-8", "replace")
        out.write(data)
        out.total += max(size - len(data), 0)
        self.fd_out.seek(0)
        self.fd_out.truncate(0)


# ---- the warm parent --------------------------------------------------------------------------------


def _apply_child_limits(limits: dict[str, Any]) -> None:
    """Per-episode rlimits; the memory and pids cgroups (set by the host) bound the whole sandbox."""
    for name, value in (("RLIMIT_AS", limits.get("address_space_bytes")),
                        ("RLIMIT_FSIZE", limits.get("file_size_bytes")),
                        ("RLIMIT_NOFILE", limits.get("open_files")),
                        ("RLIMIT_CPU", limits.get("episode_cpu_s")),
                        ("RLIMIT_NPROC", limits.get("processes")),
                        # POSIX message queues live in the ipc namespace, outside every dir the host empties.
                        ("RLIMIT_MSGQUEUE", 0),
                        ("RLIMIT_CORE", 0)):
        if value is not None:
            resource.setrlimit(getattr(resource, name), (int(value), int(value)))


PR_SET_DUMPABLE = 4
IPC_RMID = 0
REAP_INTERVAL_S = 0.5


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _set_dumpable(value: int) -> None:
    """``prctl(PR_SET_DUMPABLE)``: 0 makes this process untraceable and its /proc files private."""
    if _libc().prctl(PR_SET_DUMPABLE, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def _reap() -> bool:
    """Reap every exited child without blocking (as PID 1, orphans are ours too); True while some live on."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _kill_everything_else(timeout_s: float = 2.0) -> None:
    """Kill every process in the sandbox but this one until none is left (a fork bomb races)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not _reap():
            return
        time.sleep(0.001)


def _remove_sysv_ipc() -> None:
    """Delete SysV shared memory, semaphores and queues: they outlive their processes and hold memory."""
    libc = _libc()
    for table, remove in (("shm", lambda i: libc.shmctl(i, IPC_RMID, None)),
                          ("sem", lambda i: libc.semctl(i, 0, IPC_RMID)),
                          ("msg", lambda i: libc.msgctl(i, IPC_RMID, None))):
        try:
            lines = open(f"/proc/sysvipc/{table}").read().splitlines()[1:]  # noqa: SIM115
        except OSError:
            continue
        for line in lines:
            remove(int(line.split()[1]))


def _become_episode_process(keep_fd: int) -> None:
    """In the forked child: hold only the session socket and stdio, and undo the parent's protections."""
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, 1 << 20)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGALRM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _set_dumpable(1)


def _spawn(socket_path: str, nonce: str, limits: dict[str, Any], workdir: str) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    send_msg(conn, {"hello": nonce})
    pid = os.fork()
    if pid == 0:
        try:
            _become_episode_process(conn.fileno())
            os.setsid()
            os.chdir(workdir)
            _apply_child_limits(limits)
            _Session(conn, limits).serve()
        finally:
            os._exit(1)
    conn.close()
    return pid


def _protect_parent() -> None:
    """No signal handler (so PID 1 ignores signals from inside) and not dumpable (so nothing can trace it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_dumpable(0)


def main(argv: list[str]) -> None:
    socket_path, workdir, preload = argv[0], argv[1], [m for m in argv[2].split(",") if m]
    _protect_parent()
    for module in preload:
        __import__(module)
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.connect(socket_path)
    send_msg(control, {"hello": "control", "pid": os.getpid()})
    while True:
        # Orphans of the episode are re-parented to us; reap them while idle, not only on commands, so
        # zombies do not fill the pids cgroup during a long episode.
        while not select.select([control], [], [], REAP_INTERVAL_S)[0]:
            _reap()
        try:
            request = recv_msg(control)
        except (ProtocolError, OSError):
            os._exit(0)
        _reap()
        op = request.get("op")
        try:
            if op == "spawn":
                reply: dict[str, Any] = {"pid": _spawn(socket_path, str(request["nonce"]), request.get("limits") or {},
                                                       workdir)}
            elif op == "kill":
                _kill_everything_else()
                _remove_sysv_ipc()
                reply = {"ok": True}
            elif op == "ping":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # noqa: BLE001 - report to the host instead of dying silently.
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        send_msg(control, reply)


if __name__ == "__main__":
    main(sys.argv[1:])
