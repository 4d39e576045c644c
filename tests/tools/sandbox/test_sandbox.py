"""The Python sandbox: escape attempts are contained, state persists per episode, nothing leaks.

Every escape attempt is followed by a working call in the same session: containment must not cost the
episode its sandbox (except for attacks on the sandbox parent, where a restart is the containment).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agentgym.tools.sandbox import (
    SandboxConfig,
    SandboxLimits,
    SandboxPool,
    SandboxUnavailable,
)
from agentgym.tools.sandbox.backends import BwrapBackend, python_roots
from agentgym.tools.sandbox.hostside import descendants, parent_doubt, worker_prefix
from agentgym.utils.procfs import start_ticks

from agentgym.errors import ConfigError
from tests.helpers.dockerd import docker_daemon

LIMITS = SandboxLimits(wall_timeout_s=5, cpu_timeout_s=3, memory_bytes=512 << 20, pids=32,
                       file_size_bytes=8 << 20, workdir_bytes=32 << 20)


def sandbox_processes() -> list[str]:
    """This test process's sandbox processes (other processes on the machine may run sandboxes too)."""
    mine = {str(pid) for pid in descendants(os.getpid())}
    out = subprocess.run(["ps", "-eww", "-o", "pid,stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if "/opt/agentgym/zygote.py" in line and "ps -eo" not in line and line.split()[0] in mine]


def default_pool_processes() -> set[str]:
    """Processes of the process-wide default pools (envs and the hijack test use them; closed at exit)."""
    from agentgym.tools.sandbox.pool import _DEFAULT_POOLS

    pids: set[str] = set()
    for shared in list(_DEFAULT_POOLS.values()):
        for worker in list(shared._idle) + list(shared._busy):
            if worker.launch is not None:
                pids |= {str(p) for p in descendants(worker.launch.process.pid)}
    return pids


def ipc_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{worker_prefix()}-*")}


@pytest.fixture(scope="module")
def pool():
    others = {line.split()[0] for line in sandbox_processes()}  # other tests' pools (envs share a default pool)
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=40)) as p:
        yield p
    left = {line.split()[0] for line in sandbox_processes()} - others - default_pool_processes()
    assert not left, f"sandbox processes left behind after close(): {sorted(left)}"


def assert_alive(session) -> None:
    result = session.run("print(6 * 7)")
    assert result.status == "ok" and result.stdout == "42\n", result


# ---- the escape battery -----------------------------------------------------------------------------


def test_socket_to_host_loopback_listener_is_unreachable(pool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    with pool.session() as py:
        result = py.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert result.status == "error" and ("Connection refused" in result.stderr or "unreachable" in result.stderr)
        with pytest.raises(TimeoutError):
            listener.accept()
        assert_alive(py)
    listener.close()


def test_dns_lookup_fails(pool):
    with pool.session() as py:
        result = py.run("import socket\nsocket.getaddrinfo('pypi.org', 443)")
        assert result.status == "error" and "gaierror" in result.stderr
        assert_alive(py)


def test_writes_outside_the_work_dir_fail(pool, tmp_path):
    prefix = python_roots()[0]
    with pool.session() as py:
        # /dev is a tmpfs owned by the sandbox user: writable, it would be a place to park data across episodes.
        for target in ("/usr/evil", "/etc/evil", "/ipc/evil", f"{prefix}/evil", "/evil", str(tmp_path / "evil"),
                       "/dev/evil"):
            result = py.run(f"open({target!r}, 'w').write('x')")
            assert result.status == "error", (target, result)
            assert ("Read-only file system" in result.stderr or "Permission denied" in result.stderr
                    or "No such file" in result.stderr), result.stderr
        assert not (tmp_path / "evil").exists() and not Path(prefix, "evil").exists()
        assert py.run("open('notes.txt', 'w').write('mine')\nprint(open('notes.txt').read())").stdout == "mine\n"
        assert_alive(py)


def test_host_secrets_are_invisible(pool):
    with pool.session() as py:
        assert "FileNotFoundError" in py.run("open('/etc/shadow').read()").stderr
        # /root only holds the mount points of the Python installation, nothing of the host's home.
        visible = py.run("import os\nprint(sorted(os.listdir('/root')) if os.path.isdir('/root') else [])").stdout
        allowed = {p.split("/")[2] for p in python_roots() if p.startswith("/root/") and len(p.split("/")) > 2}
        assert set(eval(visible)) <= allowed, visible
        assert "PermissionError" in py.run("open('/root/.bashrc').read()").stderr or \
            "FileNotFoundError" in py.run("open('/root/.bashrc').read()").stderr
        env = py.run("import os\nprint(sorted(os.environ))").stdout
        assert "AGENTGYM" not in env and "HF_" not in env and "SSH" not in env
        # Only the sandbox's own processes are visible.
        assert len(eval(py.run("import os\nprint([p for p in os.listdir('/proc') if p.isdigit()])").stdout)) < 8
        assert_alive(py)


def test_a_100_mb_file_is_refused(pool):
    with pool.session() as py:
        result = py.run("with open('big.bin', 'wb') as f:\n    f.write(b'x' * (100 << 20))")
        assert result.status == "error" and ("File too large" in result.stderr or "No space" in result.stderr)
        size = int(py.run("import os\nprint(os.path.getsize('big.bin'))").stdout)
        assert size <= LIMITS.file_size_bytes
        assert_alive(py)


def test_fork_bomb_is_contained(pool):
    with pool.session() as py:
        assert_alive(py)
        before = len(sandbox_processes())
        result = py.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                        timeout_s=3)
        assert result.status in ("timeout", "crashed")
        assert_alive(py)
        assert len(sandbox_processes()) <= before, "fork bomb processes survived the call"


def test_30_gb_allocation_fails_cleanly(pool):
    with pool.session() as py:
        py.run("keep = 'still here'")
        result = py.run("block = bytearray(30 << 30)")
        assert result.status == "error" and "MemoryError" in result.stderr
        assert py.run("print(keep)").stdout == "still here\n"
        # Touching memory past the cgroup limit (but under RLIMIT_AS) is OOM-killed, and the next call works.
        result = py.run("import numpy as np\nblocks = [np.ones(64 << 20, dtype=np.uint8) for _ in range(40)]",
                        timeout_s=20)
        assert result.status in ("crashed", "error"), result
        assert_alive(py)


def test_infinite_loop_hits_the_cpu_limit_and_keeps_state(pool):
    with pool.session() as py:
        py.run("counter = 1")
        result = py.run("while True:\n    pass", cpu_s=0.5)
        assert result.status == "timeout" and "CPU time limit" in result.stderr
        assert not result.state_reset
        assert py.run("print(counter)").stdout == "1\n"


def test_sleep_forever_hits_the_wall_limit_and_says_state_was_reset(pool):
    with pool.session() as py:
        py.run("counter = 1")
        result = py.run("import time\ntime.sleep(10**9)", timeout_s=1)
        assert result.status == "timeout" and result.state_reset
        follow = py.run("print('counter' in globals())")
        assert follow.stdout == "False\n" and follow.state_reset and "restarted" in follow.notice
        assert_alive(py)


@pytest.mark.parametrize("target", ["os.getppid()", "1"])
def test_killing_the_parent_is_contained(pool, target):
    with pool.session() as py:
        py.run(f"import os, signal\nos.kill({target}, signal.SIGKILL)")
        for _ in range(3):  # the sandbox may take a moment to notice; then a fresh one serves the episode
            result = py.run("print(6 * 7)")
            if result.ok:
                break
        assert result.ok and result.stdout == "42\n", result


def test_setuid_and_mount_are_denied(pool):
    with pool.session() as py:
        # uid 0 does not even exist in the sandbox's user namespace (EINVAL); without caps it would be EPERM.
        denied = py.run("import os\nos.setuid(0)")
        assert denied.status == "error" and ("Invalid argument" in denied.stderr or "PermissionError" in denied.stderr)
        result = py.run("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "rc = libc.mount(b'none', b'/work', b'tmpfs', 0, None)\n"
                        "print(rc, os.strerror(ctypes.get_errno()))")
        assert result.stdout.startswith("-1 "), result
        shell = py.run("import subprocess\nprint(subprocess.run(['mount', '-t', 'tmpfs', 'none', '/work'], "
                       "capture_output=True).returncode)")
        assert shell.stdout.strip() != "0", shell
        assert py.run("import os\nprint(os.getuid(), os.geteuid())").stdout == "65534 65534\n"
        # Host sysctls (kernel.core_pattern would run a program as host root) are read-only.
        sysctl = py.run("open('/proc/sys/vm/stat_interval', 'w').write(open('/proc/sys/vm/stat_interval').read())")
        assert sysctl.status == "error" and ("Read-only" in sysctl.stderr or "Permission" in sysctl.stderr), sysctl
        # Root-owned proc files that need no capability (physical page flags) are masked.
        assert py.run("print(len(open('/proc/kpageflags', 'rb').read(64)))").stdout in ("", "0\n")
        assert_alive(py)


# ---- the warm parent, descriptors, environment, carry-over between episodes ---------------------------

# Episode code that keeps every descriptor it can get, attacks the warm parent (PID 1 of the sandbox), then
# leaves a daemon behind that forges replies on every socket it holds or can reach, for as long as it lives.
ATTACK = textwrap.dedent(r"""
    import ctypes, errno, json, os, signal, socket, struct, time
    libc = ctypes.CDLL(None, use_errno=True)

    def call(fn, *args):
        rc = fn(*args)
        return rc, ctypes.get_errno()

    report = {"own_fds": {}, "stolen": 0, "errors": {}}
    for fd in os.listdir("/proc/self/fd"):
        try:
            report["own_fds"][fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    held = []
    for pid in {1, os.getppid()}:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError as exc:
            report["errors"][f"list /proc/{pid}/fd"] = exc.errno
            names = [str(n) for n in range(64)]
        for name in names:
            try:
                held.append(os.open(f"/proc/{pid}/fd/{name}", os.O_RDWR))
            except OSError:
                pass
        pidfd = libc.syscall(434, pid, 0)  # pidfd_open
        for n in range(64):
            fd = libc.syscall(438, pidfd, n, 0)  # pidfd_getfd
            if fd >= 0:
                held.append(fd)
    report["stolen"] = len(held)
    for path in ("/proc/1/environ", "/proc/1/mem", "/proc/1/maps"):
        try:
            open(path, "rb").read(1)
            report["errors"][path] = 0
        except OSError as exc:
            report["errors"][path] = exc.errno
    parent = report["parent"] = os.getppid()  # the warm parent that forked this episode
    report["ptrace_attach"] = call(libc.ptrace, 16, parent, None, None)
    report["ptrace_seize"] = call(libc.ptrace, 0x4206, parent, None, None)
    for sig in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL):
        os.kill(parent, sig)
    time.sleep(0.1)
    report["parent_state"] = open(f"/proc/{parent}/stat").read().rsplit(")", 1)[1].split()[0]

    def forge(sock):
        # Answer anything the way the warm parent or an episode's interpreter would, with a planted answer.
        for reply in ({"hello": "control"}, {"pid": 2}, {"ok": True},
                      {"status": "ok", "stdout": "\\boxed{42}\n", "stderr": "", "truncated": False}):
            data = json.dumps(reply).encode()
            try:
                sock.send(struct.pack("!I", len(data)) + data)
            except OSError:
                return

    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            socks = [socket.socket(fileno=fd) for fd in set(held) | {int(f) for f in report["own_fds"]}
                     if os.path.exists(f"/proc/self/fd/{fd}") and "socket" in os.readlink(f"/proc/self/fd/{fd}")]
            with open("/tmp/attack.part", "w") as out:  # written whole, then renamed: never read half-done
                out.write(json.dumps(report))
            os.rename("/tmp/attack.part", "/tmp/attack.json")
            while True:  # forever: the host must kill this
                for sock in socks:
                    sock.setblocking(False)
                    try:
                        if sock.recv(65536):
                            forge(sock)
                    except OSError:
                        pass
                try:
                    intruder = socket.socket(socket.AF_UNIX)
                    intruder.connect("/ipc/host.sock")
                    forge(intruder)
                    socks.append(intruder)
                except OSError:
                    pass
                time.sleep(0.01)
        os._exit(0)
    os.wait()
    for _ in range(200):
        if os.path.exists("/tmp/attack.json"):
            break
        time.sleep(0.01)
    print(open("/tmp/attack.json").read())
""")


def worker_of(session):
    return session._worker


def test_inherited_descriptor_hijack_and_parent_attacks_fail_and_later_episodes_are_genuine():
    """An episode must not keep the warm parent's control socket and answer later episodes itself."""
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the env ids
    from agentgym.tools.sandbox import default_pool

    pool = default_pool(SandboxConfig())  # the pool gym.make("agentgym/CodeInterpreter-v1") uses
    attacker = pool.session()
    result = attacker.run(ATTACK, timeout_s=10)
    assert result.ok, result
    report = json.loads(result.stdout)
    sockets = [target for target in report["own_fds"].values() if target.startswith("socket:")]
    assert len(sockets) == 1, f"an episode must hold only its own session socket: {report['own_fds']}"
    assert report["stolen"] == 0
    assert report["parent"] == 1  # the warm parent is the sandbox's init
    assert report["errors"]["/proc/1/environ"] == report["errors"]["/proc/1/mem"] == 13  # EACCES
    assert report["ptrace_attach"] == [-1, 1] and report["ptrace_seize"] == [-1, 1]  # EPERM
    assert report["parent_state"] == "S", report
    worker = worker_of(attacker)
    parent = worker.launch.parent_pid
    assert parent_doubt(parent) is None
    attacker.close()
    assert pool.backend.members(worker.launch) == set(worker.launch.known_pids), "the attacker's daemon survived"

    for _ in range(3):  # brand-new sessions, each reusing the attacked sandbox
        a, b = random.randrange(10**6), random.randrange(10**6)
        with pool.session() as py:
            assert py.run(f"print({a} * {b})").stdout == f"{a * b}\n"
            assert worker_of(py).launch.parent_pid == parent  # same sandbox, not a fresh one
    for _ in range(3):  # and brand-new envs on the default pool
        a, b = random.randrange(10**6), random.randrange(10**6)
        env = gym.make("agentgym/CodeInterpreter-v1")
        try:
            env.reset(seed=0)
            obs, *_ = env.step(f"```python\nprint({a} * {b})\n```")
            assert obs == f"Code execution result: {a * b}\n", obs
        finally:
            env.close()


def test_the_warm_parent_cannot_be_stopped_killed_or_traced_and_state_survives(pool):
    with pool.session() as py:
        py.run("kept = 41")
        parent = worker_of(py).launch.parent_pid
        for sig in ("SIGSTOP", "SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGSEGV"):
            assert py.run(f"import os, signal\nos.kill(1, signal.{sig})").ok
        traced = py.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "print(libc.ptrace(16, 1, None, None), ctypes.get_errno())")
        assert traced.stdout == "-1 1\n", traced
        assert "PermissionError" in py.run("import os\nos.readlink('/proc/1/fd/3')").stderr
        time.sleep(0.1)
        assert parent_doubt(parent) is None
        # The episode's own interpreter was not touched either: its state is intact and no restart happened.
        follow = py.run("print(kept + 1)")
        assert follow.stdout == "42\n" and not follow.state_reset
    with pool.session() as py:
        assert_alive(py)


def test_orphans_are_reaped_during_an_episode(pool):
    """The parent is the sandbox's init: orphans' zombies are its to reap, or they fill the pids cgroup."""
    orphans = textwrap.dedent("""
        import os, time
        for round_ in range(6):  # 60 orphans in all, against a limit of 32 tasks
            for _ in range(10):
                child = os.fork()
                if child == 0:
                    if os.fork() == 0:
                        os._exit(0)  # orphaned once its parent exits: a zombie of PID 1 until reaped
                    os._exit(0)
                os.waitpid(child, 0)
            time.sleep(0.8)
        print('forked all')
    """)
    with pool.session() as py:
        result = py.run(orphans, timeout_s=10)
        assert result.stdout == "forked all\n", result
        launch = worker_of(py).launch
        assert launch.observed.pids_current() == launch.baseline_tasks + 1  # the parent's tasks + the episode


def test_no_host_variable_is_visible_in_any_process_inside():
    token = secrets.token_hex(16)
    os.environ["AGENTGYM_TEST_API_KEY"] = token
    try:
        with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS)) as fresh, fresh.session() as py:
            walk = py.run(textwrap.dedent("""
                import os, subprocess
                subprocess.Popen(["sleep", "5"])  # one more process whose environment is listed
                seen, unreadable = [], []
                for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
                    for name in ('environ', 'cmdline'):
                        try:
                            seen.append(open(f'/proc/{pid}/{name}', 'rb').read().decode(errors='replace'))
                        except OSError:
                            unreadable.append(f'{pid}/{name}')
                shell = subprocess.run(['bash', '-c', 'env; cat /proc/1/environ; cat /proc/*/environ'],
                                       capture_output=True, text=True)
                print(len(seen), unreadable)
                print('\\n'.join(seen) + shell.stdout + shell.stderr)
            """))
            assert walk.ok, walk
            assert token not in walk.stdout and "AGENTGYM_TEST_API_KEY" not in walk.stdout
            assert int(walk.stdout.split()[0]) >= 4  # the episode and its subprocess were read, not skipped
            assert "PATH=" in walk.stdout
            # Host side: bwrap itself was started without the host's environment.
            monitor = worker_of(py).launch.process.pid
            assert token not in Path(f"/proc/{monitor}/environ").read_bytes().decode(errors="replace")
    finally:
        del os.environ["AGENTGYM_TEST_API_KEY"]


CARRY = textwrap.dedent("""
    import ctypes, os
    for d in ('/work', '/tmp', '/dev/shm'):
        open(f'{d}/left.txt', 'w').write('episode A')
        os.makedirs(f'{d}/.hidden/deep', exist_ok=True)
        os.symlink('/usr', f'{d}/.hidden/link')
        os.chmod(f'{d}/.hidden', 0)
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(0, 1 << 20, 0o1600)  # IPC_CREAT | 0600, never removed
    print(shm)
""")


def test_files_and_shared_memory_do_not_carry_over_to_the_next_episode():
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=1)) as one:
        with one.session() as a:
            assert a.run(CARRY).ok
            parent = worker_of(a).launch.parent_pid
        for _ in range(3):
            with one.session() as b:
                seen = b.run("import os\nprint([os.listdir(d) for d in ('/work', '/tmp', '/dev/shm')])\n"
                             "print(open('/proc/sysvipc/shm').read().splitlines()[1:])")
                assert seen.stdout == "[[], [], []]\n[]\n", seen
                assert worker_of(b).launch.parent_pid == parent  # cleaned and reused, not replaced
                b.run("open('/tmp/x', 'w').write('x')\nprint(1)")  # per-call files must not pile up either
        assert not [p for p in Path(f"/proc/{parent}/root/tmp").iterdir()]


def test_parked_shared_memory_does_not_starve_the_next_episode():
    """880 MB parked in /dev/shm by one episode must not make later episodes die on a 300 MB allocation."""
    limits = SandboxLimits(memory_bytes=640 << 20, workdir_bytes=64 << 20, wall_timeout_s=30, cpu_timeout_s=30)
    park = textwrap.dedent("""
        import ctypes, mmap, os
        parked = {}
        for d in ('/dev/shm', '/tmp', '/work'):
            n = 0
            try:
                with open(f'{d}/park', 'wb') as f:
                    while n < (900 << 20):
                        f.write(b'x' * (1 << 20)); n += 1 << 20
            except OSError:
                pass
            parked[d] = n >> 20
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        shm = libc.shmget(0, 400 << 20, 0o1600)
        addr = libc.shmat(shm, None, 0)
        ctypes.memset(addr, 1, 400 << 20)  # touched: 400 MB charged to the sandbox, and no IPC_RMID
        parked['sysv'] = 400
        print(parked)
    """)
    with SandboxPool(SandboxConfig(backend="bwrap", limits=limits, max_workers=1)) as one:
        with one.session() as a:
            parked = a.run(park)
            assert parked.ok, parked
            assert eval(parked.stdout)["/dev/shm"] <= 64  # /dev/shm is a private, capped tmpfs
        for _ in range(3):
            with one.session() as b:
                grab = b.run("import numpy as np\nblock = np.ones(300 << 20, dtype=np.uint8)\nprint(int(block.sum()))")
                assert grab.stdout == f"{300 << 20}\n", grab


def test_a_killed_host_leaves_nothing_that_the_next_pool_does_not_reap():
    script = textwrap.dedent("""
        import json, sys, time
        from agentgym.tools.sandbox import SandboxConfig, SandboxLimits, SandboxPool
        from agentgym.utils.procfs import start_ticks
        pool = SandboxPool(SandboxConfig(backend="bwrap", limits=SandboxLimits(memory_bytes=256 << 20)))
        py = pool.session()
        py.run("import subprocess\\nsubprocess.Popen(['sleep', '600'], start_new_session=True)")
        worker = py._worker
        pids = sorted(pool.backend.members(worker.launch))
        print(json.dumps({"ipc": worker.ipc_dir, "cgroups": [str(d) for d in worker.launch.cgroup.dirs],
                          "pids": pids, "started": {p: start_ticks(p) for p in pids}}), flush=True)
        time.sleep(600)
    """)
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        left = json.loads(host.stdout.readline())
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    assert len(left["pids"]) == 4 and Path(left["ipc"]).exists() and all(Path(d).exists() for d in left["cgroups"])
    SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS)).close()  # any new pool reaps what the dead one left
    assert not Path(left["ipc"]).exists()
    assert not any(Path(d).exists() for d in left["cgroups"])
    started = {pid: ticks for pid, ticks in left["started"].items()}

    def survivors() -> list[str]:  # same pid and same start time: the same process, not a reused pid
        return [pid for pid, ticks in started.items() if start_ticks(int(pid)) == ticks]

    deadline = time.monotonic() + 5
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not survivors(), f"sandbox processes of the killed host survive: {survivors()}"


# ---- semantics ---------------------------------------------------------------------------------------


def test_notebook_semantics_and_output_capping(pool):
    with pool.session() as py:
        assert py.run("x = 21").stdout == ""
        assert py.run("x * 2").stdout == "42\n"  # a trailing expression is shown
        assert py.run("import numpy as np\nint(np.arange(4).sum())").stdout == "6\n"
        err = py.run("def f():\n    return 1 / 0\nf()")
        assert err.status == "error" and err.stderr.splitlines()[-1] == "ZeroDivisionError: division by zero"
        assert "zygote" not in err.stderr  # only the model's own frames
        big = py.run("print('a' * 50000)")
        assert big.truncated and len(big.stdout) <= LIMITS.max_output_chars + 100
        assert "characters truncated" in big.stdout
        assert py.run("import sys\nsys.exit(3)").stderr == "SystemExit: 3\n"
        assert py.run("print(x)").stdout == "21\n"  # SystemExit did not end the episode


def test_sessions_are_isolated_and_reset_between_episodes(pool):
    with pool.session() as a, pool.session() as b:
        a.run("secret = 'a'\nopen('file_a', 'w').write('a')")
        assert "NameError" in b.run("secret").stderr
        assert b.run("import os\nprint(os.listdir('.'))").stdout == "[]\n"
        a.reset()
        assert "NameError" in a.run("secret").stderr
        assert a.run("import os\nprint(os.listdir('.'))").stdout == "[]\n"


def test_a_sandbox_started_by_a_short_lived_thread_outlives_that_thread():
    """bwrap's --die-with-parent follows the launching *thread*; rollouts start sandboxes from executor
    threads that exit when the rollout ends, and the pooled sandboxes must survive for the next episode."""
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS)) as fresh:
        session = fresh.session()
        starter = threading.Thread(target=lambda: session.run("kept = 41"))
        starter.start()
        starter.join()
        time.sleep(0.3)  # a death signal from the exited thread would have landed by now
        assert session.run("print(kept + 1)").stdout == "42\n"
        session.close()


def test_32_parallel_episodes_20_turns_no_cross_talk_no_leaks():
    config = SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=32)
    errors: list[str] = []

    def episode(i: int) -> None:
        with pool.session() as py:
            py.run(f"mine = {i}\nturns = 0\nvar_{i} = True")
            for turn in range(1, 20):
                result = py.run("turns += 1\nprint(mine, turns, sorted(k for k in globals() if k.startswith('var_')))")
                expected = f"{i} {turn} ['var_{i}']\n"
                if result.stdout != expected:
                    errors.append(f"episode {i} turn {turn}: {result.stdout!r} != {expected!r} ({result.stderr})")

    dirs_before = ipc_dirs()
    already_running = {line.split()[0] for line in sandbox_processes()}  # other pools' workers (e.g. this module's fixture)
    with SandboxPool(config) as pool, ThreadPoolExecutor(32) as executor:
        list(executor.map(episode, range(32)))
        assert len(pool._idle) <= 32
    assert not errors, errors[:5]
    assert {line.split()[0] for line in sandbox_processes()} <= already_running, "sandbox processes left behind"
    assert ipc_dirs() <= dirs_before, "ipc dirs left behind"


def test_concurrent_calls_on_one_pool_from_threads_share_nothing(pool):
    results: dict[int, str] = {}

    def worker(i: int) -> None:
        with pool.session() as py:
            py.run(f"v = {i}")
            results[i] = py.run("print(v)").stdout

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n" for i in range(6)}


# ---- configuration and refusal ---------------------------------------------------------------------


def test_bad_configuration_says_how_to_fix():
    with pytest.raises(ConfigError, match="positive"):
        SandboxLimits(wall_timeout_s=0)
    with pytest.raises(ConfigError, match="choose one of"):
        SandboxConfig(backend="none")
    with pytest.raises(ConfigError, match="Unknown sandbox option"):
        SandboxConfig.from_kwargs(wall_timeout=3)
    assert SandboxConfig.from_kwargs(wall_timeout_s=3, backend="bwrap").limits.wall_timeout_s == 3
    with pytest.raises(ConfigError, match="needs backend='docker'"):  # auto could pick bwrap: no silent offline
        SandboxConfig(docker_network="bridge")
    with pytest.raises(ConfigError, match="Docker network name"):
        SandboxConfig(backend="docker", docker_network="--privileged")
    assert SandboxConfig(backend="docker", docker_network="bridge").docker_network == "bridge"


def test_no_isolation_means_refusal_not_fallback(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    from agentgym.tools.sandbox import backends

    backends._bwrap_unavailable.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            SandboxPool(SandboxConfig(backend="auto"))
    finally:
        backends._bwrap_unavailable.cache_clear()


def test_bwrap_command_has_the_isolation_flags():
    cmd = BwrapBackend().command("/tmp/ipc", SandboxConfig())
    for flag in ("--unshare-all", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv", "--as-pid-1"):
        assert flag in cmd
    shm = cmd.index("/dev/shm")
    assert cmd[shm - 1] == "--tmpfs" and cmd[shm + 1:shm + 3] == ["--remount-ro", "/dev"]
    assert cmd[cmd.index("--cap-drop") + 1] == "ALL" and cmd[cmd.index("--uid") + 1] == "65534"


# ---- the Docker backend ------------------------------------------------------------------------------


DOCKER_SECRET = secrets.token_hex(16)


@pytest.fixture(scope="module")
def docker_pool():
    os.environ["AGENTGYM_TEST_DOCKER_TOKEN"] = DOCKER_SECRET  # a host secret present when containers start
    try:
        with docker_daemon(), SandboxPool(SandboxConfig(backend="docker", limits=LIMITS, max_workers=4)) as p:
            yield p
    finally:
        del os.environ["AGENTGYM_TEST_DOCKER_TOKEN"]


def test_docker_backend_same_interface_and_containment(docker_pool):
    with docker_pool.session() as py:
        assert py.run("x = 2").ok
        assert py.run("import numpy as np\nprint(np.ones(3).sum() + x)").stdout == "5.0\n"
        assert py.run("import socket\nsocket.getaddrinfo('pypi.org', 443)").status == "error"
        assert "Read-only file system" in py.run("open('/usr/evil', 'w')").stderr
        assert "MemoryError" in py.run("b = bytearray(30 << 30)").stderr
        assert py.run("import time\ntime.sleep(100)", timeout_s=1).status == "timeout"
        follow = py.run("print('x' in globals())")
        assert follow.stdout == "False\n" and follow.state_reset
        bomb = py.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                      timeout_s=3)
        assert bomb.status in ("timeout", "crashed")
        assert_alive(py)
        assert py.run("import os\nprint(os.getuid())").stdout == "65534\n"


def test_docker_backend_same_isolation_guarantees(docker_pool):
    """Descriptors, the parent (the container's init), environment and carry-over, as for bwrap."""
    with docker_pool.session() as a:
        report = json.loads(a.run(ATTACK, timeout_s=10).stdout)
        worker = worker_of(a)
        assert worker.launch.verifiable, "the host must be able to check the container itself"
        assert [t for t in report["own_fds"].values() if t.startswith("socket:")] and report["stolen"] == 0
        assert len([t for t in report["own_fds"].values() if t.startswith("socket:")]) == 1, report["own_fds"]
        assert report["errors"]["/proc/1/environ"] == 13 and report["ptrace_attach"] == [-1, 1]
        assert report["parent_state"] == "S" and parent_doubt(worker.launch.parent_pid) is None
    assert docker_pool.backend.members(worker.launch) == set(worker.launch.known_pids), "the attacker survived"
    with docker_pool.session() as a:  # the attacker's daemon would read this session's requests if it lived
        environ = a.run("import glob\nprint(b''.join(open(p, 'rb').read() for p in glob.glob('/proc/[0-9]*/environ')"
                        " if p != '/proc/1/environ'))")
        assert "PATH=" in environ.stdout and DOCKER_SECRET not in environ.stdout
        assert a.run(CARRY).ok
    assert docker_pool.backend.members(worker.launch) == set(worker.launch.known_pids), "episode processes survived"
    with docker_pool.session() as b:
        a_, b_ = random.randrange(10**6), random.randrange(10**6)
        assert b.run(f"print({a_} * {b_})").stdout == f"{a_ * b_}\n"
        seen = b.run("import os\nprint([os.listdir(d) for d in ('/work', '/tmp', '/dev/shm')])\n"
                     "print(open('/proc/sysvipc/shm').read().splitlines()[1:])")
        assert seen.stdout == "[[], [], []]\n[]\n", seen
        assert worker_of(b) is worker  # the same container, cleaned and reused


def test_docker_leftovers_of_a_killed_host_are_reaped(docker_pool):
    script = textwrap.dedent("""
        import json, time
        from agentgym.tools.sandbox import SandboxConfig, SandboxPool
        pool = SandboxPool(SandboxConfig(backend="docker", max_workers=1))
        py = pool.session()
        py.run("x = 1")
        print(json.dumps({"ipc": py._worker.ipc_dir, "container": py._worker.launch.container}), flush=True)
        time.sleep(600)
    """)
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        left = json.loads(host.stdout.readline())
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()

    def running() -> str:
        return subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{left['container']}$"],
                              capture_output=True, text=True).stdout.strip()

    # SIGKILL left the ipc dir behind; the container ends itself (its parent sees the control socket close)
    # unless it hangs, and then the reaping below removes it.
    assert Path(left["ipc"]).exists()
    SandboxPool(SandboxConfig(backend="docker", limits=LIMITS)).close()
    assert not Path(left["ipc"]).exists()
    deadline = time.monotonic() + 20  # `docker run --rm` may be removing it at the same time: let it finish
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(), "the killed host's container survived"
