"""The Python sandbox: escape attempts are contained, state persists per episode, nothing leaks.

Every escape attempt is followed by a working call in the same session: containment must not cost the
episode its sandbox (except for attacks on the sandbox parent, where a restart is the containment).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
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

from agentgym.errors import ConfigError
from tests.dockerd import docker_daemon

LIMITS = SandboxLimits(wall_timeout_s=5, cpu_timeout_s=3, memory_bytes=512 << 20, pids=32,
                       file_size_bytes=8 << 20, workdir_bytes=32 << 20)


def sandbox_processes() -> list[str]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "/opt/agentgym/zygote.py" in line and "ps -eo" not in line]


def ipc_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"agentgym-sbx-{os.getpid()}-*")}


@pytest.fixture(scope="module")
def pool():
    others = {line.split()[0] for line in sandbox_processes()}  # other tests' pools (envs share a default pool)
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=40)) as p:
        yield p
    left = {line.split()[0] for line in sandbox_processes()} - others
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
        for target in ("/usr/evil", "/etc/evil", "/ipc/evil", f"{prefix}/evil", "/evil", str(tmp_path / "evil")):
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
        assert_alive(py)


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
    for flag in ("--unshare-all", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in cmd
    assert cmd[cmd.index("--cap-drop") + 1] == "ALL" and cmd[cmd.index("--uid") + 1] == "65534"


# ---- the Docker backend ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_pool():
    with docker_daemon(), SandboxPool(SandboxConfig(backend="docker", limits=LIMITS, max_workers=4)) as p:
        yield p


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
