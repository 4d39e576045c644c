"""Host side of the sandbox: warm workers in a pool, leased one per episode as a :class:`SandboxSession`.

A *worker* is one isolated sandbox (bwrap or container) whose warm parent forks one child per episode.
A worker serves one episode at a time, so nothing an episode does (a fork bomb, filling memory, parking
files) can reach another episode. When the episode ends the host itself kills every process of the sandbox
but the ones it recorded at launch, empties the writable dirs and checks the parent's state and the
cgroup's counters against their launch baseline (see :mod:`hostside`); only then does the worker go back to
the pool for the next episode (a fork, ~2 ms, instead of a new sandbox). Any doubt destroys the worker.
Nothing the sandbox replies is trusted for this.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from agentgym.tools.sandbox._zygote import ProtocolError, recv_msg, send_msg
from agentgym.tools.sandbox.backends import (
    Backend,
    Launch,
    resolve_backend,
)
from agentgym.tools.sandbox.config import SandboxConfig
from agentgym.tools.sandbox.hostside import (
    empty_dirs,
    kill_all_but,
    parent_changes,
    parent_doubt,
    worker_prefix,
)
from agentgym.utils.singletons import ProcessSingletons

__all__ = ["ExecutionResult", "SandboxError", "SandboxPool", "SandboxSession", "default_pool"]

log = logging.getLogger(__name__)
_IDS = itertools.count()

# bwrap runs with --die-with-parent, i.e. PR_SET_PDEATHSIG, which Linux ties to the *thread* that forked it:
# a sandbox launched from a short-lived worker thread (a rollout's env executor) would be killed the
# moment that thread exits, while the pool still lists it as idle. Every launch therefore happens on
# one thread that lives as long as the process.
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentgym-sandbox-launcher")
CONTROL_TIMEOUT_S = 10.0
# Memory the sandbox may hold above its launch baseline after cleanup before it is recycled instead of
# reused: kernel objects and the parent's own small allocations, not an episode's parked data.
MEMORY_SLACK_BYTES = 32 << 20


class SandboxError(RuntimeError):
    """The sandbox machinery itself failed (not the model's code); the message says what to do."""


@dataclass(frozen=True)
class ExecutionResult:
    """What one call produced.

    Attributes:
        status: ``ok``; ``error`` (the code raised; state kept); ``timeout`` (CPU limit: state kept, or wall
            limit: interpreter restarted); ``crashed`` (the interpreter died: restarted).
        stdout: Captured output (``print``, a trailing expression's value, and fd-level output), capped.
        stderr: The traceback or error text, capped.
        truncated: Whether any output was cut.
        duration_s: Wall time of the call as seen by the host.
        state_reset: The interpreter was restarted during or before this call, so earlier variables are gone.
        notice: A sentence for the model explaining a restart (empty when nothing happened).
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    duration_s: float = 0.0
    state_reset: bool = False
    notice: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Worker:
    """One sandbox process tree plus its control connection."""

    def __init__(self, backend: Backend, config: SandboxConfig) -> None:
        self.backend, self.config = backend, config
        self.id = f"{worker_prefix()}-{next(_IDS)}"
        self.ipc_dir = tempfile.mkdtemp(prefix=f"{self.id}-")
        os.chmod(self.ipc_dir, 0o755)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.launch: Launch | None = None
        self.control: socket.socket | None = None
        try:
            path = os.path.join(self.ipc_dir, "host.sock")
            self.listener.bind(path)
            os.chmod(path, 0o777)  # uid 65534 in a container must be able to connect
            self.listener.listen(8)
            self.launch = _LAUNCHER.submit(backend.launch, self.id, self.ipc_dir, config).result()
            self.control, hello = self._accept(config.start_timeout_s)
            if hello.get("hello") != "control":
                raise SandboxError(f"unexpected greeting from the sandbox: {hello!r}")
            try:
                backend.attach(self.launch)
            except OSError as exc:
                raise SandboxError(f"could not inspect the new {backend.name} sandbox from the host: {exc}") from exc
        except BaseException:
            self.destroy()
            raise

    def _accept(self, timeout_s: float) -> tuple[socket.socket, dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError(f"the {self.backend.name} sandbox did not connect within {timeout_s:.0f} s"
                                   + self._stderr_hint())
            self.listener.settimeout(min(remaining, 0.25))
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if self.launch is not None and self.launch.process.poll() is not None:
                    raise SandboxError(f"the {self.backend.name} sandbox exited with code "
                                       f"{self.launch.process.returncode}" + self._stderr_hint()) from None
                continue
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                return conn, recv_msg(conn, max_bytes=4096)
            except (ProtocolError, OSError):
                conn.close()  # a stray connection (e.g. from a killed child): ignore it

    def _stderr_hint(self) -> str:
        process = self.launch.process if self.launch else None
        if process is None or process.poll() is None or process.stderr is None:
            return ""
        err = process.stderr.read().decode(errors="replace").strip()
        return f": {err[-500:]}" if err else ""

    def _control(self, payload: dict[str, Any], timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        if self.control is None:
            raise SandboxError("worker is closed")
        self.control.settimeout(timeout_s)
        send_msg(self.control, payload)
        reply = recv_msg(self.control, max_bytes=1 << 16)
        if "error" in reply:
            raise SandboxError(f"sandbox parent: {reply['error']}")
        return reply

    def spawn(self) -> socket.socket:
        """Fork a fresh episode interpreter and return the socket that talks to it."""
        nonce = secrets.token_hex(16)
        assert self.control is not None
        self.control.settimeout(CONTROL_TIMEOUT_S)
        send_msg(self.control, {"op": "spawn", "nonce": nonce, "limits": self.config.limits.for_child()})
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while True:
            conn, hello = self._accept(max(deadline - time.monotonic(), 0.1))
            if hello.get("hello") == nonce:
                break
            conn.close()
        reply = recv_msg(self.control, max_bytes=1 << 16)
        if "error" in reply:
            conn.close()
            raise SandboxError(f"sandbox parent could not fork: {reply['error']}")
        return conn

    def clean(self) -> None:
        """Make the sandbox as it was at launch, checked from the host; raises :class:`SandboxError` on doubt.

        Order: the host kills every process but the recorded sandbox ones; the parent reaps the zombies
        (only it can) and drops SysV IPC objects; the host empties the writable dirs and then checks the
        process list, the parent's state and the cgroup's task and memory counters itself.
        """
        launch = self.launch
        if launch is None or not launch.verifiable or launch.parent_pid is None:
            raise SandboxError("this sandbox cannot be checked from the host, so it is not reused")
        doubt = kill_all_but(launch.known_pids, functools.partial(self.backend.members, launch))
        if doubt is None:
            self._control({"op": "kill"})
            doubt = empty_dirs(launch.parent_pid, self.backend.writable_dirs) or self._doubt_after_cleanup()
        if doubt is not None:
            raise SandboxError(f"sandbox not reused: {doubt}")

    def _doubt_after_cleanup(self, settle_s: float = 1.0) -> str | None:
        """Compare the sandbox with its launch baseline; the first difference found, or ``None``."""
        launch = self.launch
        assert launch is not None and launch.parent_pid is not None
        doubt = parent_doubt(launch.parent_pid)
        if doubt is None and launch.baseline_parent is not None:
            doubt = parent_changes(launch.parent_pid, launch.baseline_parent)
        if doubt is not None:
            return doubt
        left = self.backend.members(launch) - launch.known_pids
        if left:
            return f"processes {sorted(left)} appeared after cleanup"
        observed = launch.observed
        if observed is None:
            return None
        deadline = time.monotonic() + settle_s
        while (tasks := observed.pids_current()) != launch.baseline_tasks:
            if time.monotonic() > deadline:
                return f"{tasks} tasks counted after cleanup, {launch.baseline_tasks} at launch"
            time.sleep(0.001)
        if launch.baseline_memory is not None:
            limit = launch.baseline_memory + MEMORY_SLACK_BYTES
            usage = observed.memory_usage() or 0
            if usage > limit:
                observed.reclaim()
                usage = observed.memory_usage() or 0
            if usage > limit:
                return f"memory at {usage >> 20} MiB after cleanup, {launch.baseline_memory >> 20} MiB at launch"
        return None

    @property
    def alive(self) -> bool:
        return self.launch is not None and self.launch.process.poll() is None and self.control is not None

    def destroy(self) -> None:
        """Stop the sandbox and free what it held; never raises, so a failing step cannot leak the rest."""
        for sock in (self.control, self.listener):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        self.control = None
        steps: list[Any] = []
        if self.launch is not None:
            launch = self.launch
            steps.append(functools.partial(self.backend.stop, launch))
            if launch.process.stderr is not None:
                steps.append(launch.process.stderr.close)
        steps.append(functools.partial(shutil.rmtree, self.ipc_dir, ignore_errors=True))
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep going: every later step frees something too.
                log.warning("while destroying sandbox %s: %s: %s", self.id, type(exc).__name__, exc)


class SandboxPool:
    """Warm sandboxes shared by many episodes; thread-safe. Use :meth:`session` per episode.

    Args:
        config: Backend and limits. The backend is resolved once, at construction: if no isolation works
            here this raises :class:`SandboxUnavailable` with what to install.
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.backend = resolve_backend(self.config)
        self.backend.reap_stale()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._lock = threading.Condition()
        self._closed = False
        self._finalizer = weakref.finalize(self, SandboxPool._destroy_all, self._idle, self._busy)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def session(self) -> SandboxSession:
        """A private interpreter for one episode (lazily started on its first call)."""
        return SandboxSession(self)

    def prewarm(self, n: int) -> None:
        """Start ``n`` idle workers now (in parallel) so the first episodes do not wait for sandboxes."""
        n = min(n, self.config.max_workers)
        threads = []
        for _ in range(max(n - len(self._idle) - len(self._busy), 0)):
            thread = threading.Thread(target=lambda: self.release(self.acquire()), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()

    def acquire(self, timeout_s: float = 300.0) -> _Worker:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                while self._idle:
                    worker = self._idle.pop()
                    if worker.alive:
                        self._busy.add(worker)
                        return worker
                    worker.destroy()
                if len(self._busy) + self._starting < self.config.max_workers:
                    self._starting += 1
                    break
                if not self._lock.wait(timeout=max(deadline - time.monotonic(), 0)):
                    raise SandboxError(f"all {self.config.max_workers} sandboxes are busy; raise "
                                       "SandboxConfig.max_workers or run fewer episodes at once")
        try:
            worker = _Worker(self.backend, self.config)
        finally:
            with self._lock:
                self._starting -= 1
                self._lock.notify()
        with self._lock:
            if self._closed:
                worker.destroy()
                raise SandboxError("the sandbox pool is closed")
            self._busy.add(worker)
        return worker

    def release(self, worker: _Worker, *, healthy: bool = True) -> None:
        """Clean the worker for the next episode, or destroy it if it is broken."""
        if healthy and worker.alive:
            try:
                worker.clean()
            except Exception as exc:  # noqa: BLE001 - whatever went wrong, the worker is not reused.
                # Not only SandboxError/OSError: an episode shapes what cleanup walks through, so any
                # exception (a RecursionError once) must end in a destroyed worker, never a leaked busy one.
                if not isinstance(exc, (SandboxError, ProtocolError, OSError)):
                    log.warning("sandbox cleanup failed unexpectedly (%s: %s); destroying the worker",
                                type(exc).__name__, exc)
                healthy = False
        else:
            healthy = False
        with self._lock:
            self._busy.discard(worker)
            if healthy and not self._closed:
                self._idle.append(worker)
                worker = None  # type: ignore[assignment]
            self._lock.notify()
        if worker is not None:
            worker.destroy()

    def close(self) -> None:
        """Destroy every worker; no sandbox process is left behind."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._finalizer()

    @staticmethod
    def _destroy_all(idle: list[_Worker], busy: set[_Worker]) -> None:
        for worker in list(idle) + list(busy):
            worker.destroy()
        idle.clear()
        busy.clear()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxSession:
    """One episode's interpreter: state persists across :meth:`run` calls until :meth:`reset` or close.

    Not thread-safe (one episode = one caller); many sessions may run concurrently on one pool.
    """

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self._worker: _Worker | None = None
        self._conn: socket.socket | None = None
        self._pending_notice = ""
        self.calls = 0

    def run(self, code: str, *, timeout_s: float | None = None, cpu_s: float | None = None,
            max_output: int | None = None) -> ExecutionResult:
        """Execute ``code`` in this episode's namespace; never raises for anything the code does."""
        limits = self.pool.config.limits
        wall = limits.wall_timeout_s if timeout_s is None else float(timeout_s)
        cpu = min(limits.cpu_timeout_s if cpu_s is None else float(cpu_s), wall)
        cap = limits.max_output_chars if max_output is None else int(max_output)
        notice, reset = self._pending_notice, bool(self._pending_notice)
        self._pending_notice = ""
        if not isinstance(code, str):
            return ExecutionResult("error", stderr=f"TypeError: code must be a string, not {type(code).__name__}")
        self.calls += 1
        start = time.monotonic()
        conn = self._connection()
        try:
            conn.settimeout(wall)
            send_msg(conn, {"code": code, "cpu_s": cpu, "max_output": cap})
            reply = recv_msg(conn, max_bytes=8 * cap + 4096)
        except TimeoutError:
            self._restart()
            return ExecutionResult(
                "timeout", stderr=f"TimeoutError: the call ran longer than {wall:g} s of wall time and was killed.",
                duration_s=time.monotonic() - start, state_reset=True,
                notice=f"The interpreter was restarted because the call exceeded {wall:g} s; "
                       "variables defined earlier are gone.")
        except (ProtocolError, OSError) as exc:
            self._restart()
            return ExecutionResult(
                "crashed", stderr=f"The interpreter process died ({exc}).", duration_s=time.monotonic() - start,
                state_reset=True,
                notice="The interpreter crashed and was restarted; variables defined earlier are gone.")
        status = str(reply.get("status", "error"))
        return ExecutionResult(status if status in ("ok", "error", "timeout") else "error",
                               stdout=str(reply.get("stdout", "")), stderr=str(reply.get("stderr", "")),
                               truncated=bool(reply.get("truncated")), duration_s=time.monotonic() - start,
                               state_reset=reset, notice=notice)

    @property
    def container(self) -> str | None:
        """The Docker container this session runs in (``None`` before its first call, or on bwrap): what a
        grader snapshots with ``docker commit`` to check an episode's final state in a fresh container."""
        worker = self._worker
        return worker.launch.container if worker is not None and worker.launch is not None else None

    def _connection(self) -> socket.socket:
        if self._conn is not None:
            return self._conn
        for attempt in range(2):
            if self._worker is None:
                self._worker = self.pool.acquire()
            try:
                self._conn = self._worker.spawn()
                return self._conn
            except (SandboxError, ProtocolError, OSError) as exc:
                self.pool.release(self._worker, healthy=False)
                self._worker = None
                if attempt:
                    raise SandboxError(f"could not start an interpreter: {exc}") from exc
        raise AssertionError("unreachable")

    def _restart(self) -> None:
        """Replace a dead or stuck interpreter now, so a broken sandbox shows up as :class:`SandboxError`."""
        self._discard_child()
        self._connection()

    def _discard_child(self) -> None:
        """Kill this episode's processes; the next call starts a fresh interpreter (and says so)."""
        self._pending_notice = "The interpreter was restarted after the previous call failed; variables defined earlier are gone."
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._worker is not None:
            worker, self._worker = self._worker, None
            healthy = worker.alive
            if healthy:
                try:
                    worker.clean()
                except Exception:  # noqa: BLE001 - any failure: replace the worker (see SandboxPool.release)
                    healthy = False
            # A worker whose parent was killed is replaced; a healthy one is reused at once.
            if healthy:
                self._worker = worker
            else:
                self.pool.release(worker, healthy=False)

    def reset(self) -> None:
        """Forget all state (a new episode on the same session)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._worker is not None:
            worker, self._worker = self._worker, None
            self.pool.release(worker)
        self._pending_notice = ""

    def close(self) -> None:
        self.reset()

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


#: The process-wide pools, one per config (tests close some early through it).
_DEFAULT_POOLS: ProcessSingletons[SandboxConfig, SandboxPool] = ProcessSingletons(
    SandboxPool, reusable=lambda pool: not pool._closed)


def default_pool(config: SandboxConfig | None = None) -> SandboxPool:
    """The process-wide pool for ``config`` (envs share it, so workers are reused across env instances)."""
    return _DEFAULT_POOLS.get(config or SandboxConfig())
