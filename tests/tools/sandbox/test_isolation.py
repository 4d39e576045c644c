"""Kernel state an episode must not share across episodes or with the host, and cleanup it cannot break.

Attacks (each one worked before the sandbox got a seccomp filter, a private host uid, host-side checks of the
warm parent's settings and iterative cleanup):

* kernel keyrings: a key added in one episode read by the next one, by a concurrent one, and the host's
  keys described and read from inside;
* per-user quotas: 128 inotify instances held inside made the host's ``inotify_init1`` fail;
* ``/proc/1/oom_score_adj`` (and the parent's nice, affinity and rlimits) changed by an episode were inherited
  by the next episode on the same worker;
* a 1,200-deep directory tree in ``/tmp`` made host-side cleanup raise ``RecursionError``: the worker was
  never released and later episodes failed or never ran.

The same attacks run against the Docker backend.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import secrets
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from agentgym.tools.sandbox import SandboxConfig, SandboxLimits, SandboxPool
from agentgym.tools.sandbox import backends
from agentgym.tools.sandbox.hostside import _empty_dir
from agentgym.tools.sandbox.seccomp import ARCHES, DENY_ENOSYS, DENY_EPERM, build_filter, syscall_numbers
from agentgym.tools.sandbox.uids import UID_BASE, UID_SLOTS

from tests.helpers.dockerd import docker_daemon

LIMITS = SandboxLimits(wall_timeout_s=20, cpu_timeout_s=15, memory_bytes=512 << 20, pids=32,
                       file_size_bytes=8 << 20, workdir_bytes=64 << 20)
NR = syscall_numbers()
LIBC = ctypes.CDLL(None, use_errno=True)
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
KEYCTL_DESCRIBE, KEYCTL_READ, KEYCTL_INVALIDATE = 6, 11, 21


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=4)) as p:
        yield p


@pytest.fixture(scope="module")
def shared_uid_pool():
    """A pool whose sandboxes run as the launcher's uid (host root here): only the host's checks protect it."""
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=2, bwrap_private_uid=False)) as p:
        yield p


@pytest.fixture(scope="module")
def docker_pool():
    with docker_daemon(), SandboxPool(SandboxConfig(backend="docker", limits=LIMITS, max_workers=2)) as p:
        yield p


def needs_private_uid() -> None:
    reason = backends.private_uid_unavailable()
    if reason is not None:
        pytest.skip(f"this host cannot run bwrap as a private uid: {reason}")


# ---- the seccomp program itself ------------------------------------------------------------------------


def _header_numbers(path: str, pattern: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(pattern, text)}


@pytest.mark.parametrize("arch,header,pattern", [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
    ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR_(\w+)\s+(\d+)"),
])
def test_syscall_tables_match_the_kernel_headers(arch, header, pattern):
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    kernel = _header_numbers(header, pattern)
    ours = ARCHES[arch].numbers
    checked = {name: nr for name, nr in ours.items() if name in kernel}
    assert checked == {name: kernel[name] for name in checked}
    # Names the header does not define must be the ones this arch never had (aarch64 has no _sysctl, iopl...).
    missing = set(ours) - set(kernel)
    assert not missing & {"keyctl", "add_key", "request_key", "bpf", "mount", "unshare", "setns", "ptrace", "clone"}


FILTER_PROBE = textwrap.dedent(r"""
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    nr = json.loads(sys.argv[2])
    prog = bytes.fromhex(sys.argv[1])

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    fprog = Fprog(len(prog) // 8, prog)
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER

    def call(*args):
        rc = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        return -ctypes.get_errno() if rc == -1 else "ok"

    out = {
        "add_key": call(nr["add_key"], b"user", b"k", b"v", 1, -3),
        "keyctl": call(nr["keyctl"], 0, -3, 0),
        "bpf": call(nr["bpf"], 0, 0, 0),
        "unshare": call(nr["unshare"], 0x10000000),
        "clone_newuser": call(nr["clone"], 0x10000000 | 17, 0, 0, 0, 0),
        "clone3": call(nr["clone3"], 0, 0),
        "io_uring_setup": call(nr["io_uring_setup"], 1, 0),
        "personality_query": call(nr["personality"], 0xFFFFFFFF),
        "personality_no_aslr": call(nr["personality"], 0x0040000),
        "prlimit_other": call(nr["prlimit64"], os.getppid(), 7, 0, 0),
        "prlimit_self": call(nr["prlimit64"], 0, 7, 0, 0),
        "mq_open": call(nr["mq_open"], b"q", 0x40, 0o600, 0),
        "ptrace": call(nr["ptrace"], 16, os.getppid(), 0, 0),
    }
    if "x86_64" in os.uname().machine:
        out["x32_getpid"] = call(0x40000000 | 39)
    pid = os.fork()  # plain fork (clone without namespace flags) still works
    if pid == 0:
        os._exit(7)
    out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out["subprocess"] = __import__("subprocess").run(["true"]).returncode
    print(json.dumps(out))
""")


def test_seccomp_program_denies_what_it_lists_and_allows_the_rest():
    """Loaded into a plain child process with prctl, independent of bwrap."""
    result = subprocess.run([sys.executable, "-I", "-c", FILTER_PROBE, build_filter().hex(), json.dumps(NR)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    eperm, enosys = -1, -38
    for name in ("add_key", "keyctl", "bpf", "unshare", "clone_newuser", "personality_no_aslr",
                 "prlimit_other", "mq_open", "ptrace"):
        assert out[name] == eperm, (name, out)
    assert out["clone3"] == enosys and out["io_uring_setup"] == enosys
    assert out.get("x32_getpid", enosys) == enosys
    assert out["personality_query"] == "ok" and out["prlimit_self"] == "ok"
    assert out["fork"] == 7 and out["subprocess"] == 0


def test_every_listed_syscall_has_a_number_and_unknown_arches_are_refused():
    for arch in ("x86_64", "aarch64"):
        numbers = syscall_numbers(arch)
        assert {"keyctl", "add_key", "request_key", "bpf", "clone", "personality", "prlimit64"} <= set(numbers)
        assert len(build_filter(arch)) % 8 == 0
    assert set(DENY_ENOSYS) <= set(syscall_numbers("aarch64"))
    assert {"keyctl", "userfaultfd", "perf_event_open", "kexec_load", "open_by_handle_at"} <= set(DENY_EPERM)
    with pytest.raises(OSError, match="no seccomp syscall table"):
        build_filter("riscv64")


# ---- keyrings ------------------------------------------------------------------------------------------


KEYS = textwrap.dedent("""
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(4096)

    def call(*args):
        rc = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        return [rc, ctypes.get_errno() if rc == -1 else 0]

    out = {{"add": [call({add_key}, b"user", desc.encode(), secret.encode(), len(secret), ring)
                    for ring in (-3, -4)]}}
    out["read"] = {{str(s): [call({keyctl}, 11, s, buf, 4096), buf.raw[:80].hex()] for s in serials}}
    out["describe"] = {{str(s): [call({keyctl}, 6, s, buf, 4096), buf.value.decode(errors="replace")]
                        for s in serials}}
    try:
        out["proc_keys"] = open("/proc/keys").read() + open("/proc/key-users").read()
    except OSError as exc:
        out["proc_keys"] = f"<{{exc.errno}}>"
    print(json.dumps(out))
""")


def keys_probe(desc: str, secret: str, serials: list[int]) -> str:
    return f"desc, secret, serials = {desc!r}, {secret!r}, {serials!r}\n" + KEYS.format(
        add_key=NR["add_key"], keyctl=NR["keyctl"])


def _host_key(desc: str, secret: bytes) -> int:
    serial = LIBC.syscall(ctypes.c_long(NR["add_key"]), b"user", desc.encode(), secret, ctypes.c_long(len(secret)),
                          ctypes.c_long(KEY_SPEC_SESSION_KEYRING))
    if serial < 0:
        pytest.skip(f"the host cannot add a key here (errno {ctypes.get_errno()})")
    return serial


def _check_no_key_crosses(sandbox_pool):
    host_secret = secrets.token_hex(8)
    host_serial = _host_key(f"agentgym-host-{host_secret}", host_secret.encode())
    try:
        secret = secrets.token_hex(8)
        with sandbox_pool.session() as a, sandbox_pool.session() as concurrent:
            first = json.loads(a.run(keys_probe(f"agentgym-{secret}", secret, [host_serial])).stdout)
            assert all(rc == -1 for rc, _ in first["add"]), f"a key was added inside: {first['add']}"
            assert first["read"][str(host_serial)][0][0] == -1, "the host's key was readable inside"
            assert first["describe"][str(host_serial)][0][0] == -1, "the host's key was described inside"
            assert host_secret not in first["proc_keys"]
            added = [rc for rc, _ in first["add"] if rc > 0]
            other = json.loads(concurrent.run(keys_probe("x", "y", added)).stdout)
        # Two later episodes at once: one of them reuses the worker of the episode that tried to add keys.
        with sandbox_pool.session() as later, sandbox_pool.session() as later2:
            after = [json.loads(s.run(keys_probe("x", "y", added)).stdout) for s in (later, later2)]
        for seen in (other, *after):
            assert secret not in json.dumps(seen) and host_secret not in json.dumps(seen)
            assert secret.encode().hex() not in json.dumps(seen)
    finally:
        LIBC.syscall(ctypes.c_long(NR["keyctl"]), ctypes.c_long(KEYCTL_INVALIDATE), ctypes.c_long(host_serial))


def test_keyrings_do_not_cross_episodes_sandboxes_or_the_host(pool):
    _check_no_key_crosses(pool)


def test_keyrings_do_not_cross_in_docker(docker_pool):
    _check_no_key_crosses(docker_pool)


# ---- per-user quotas -------------------------------------------------------------------------------------


HOLD_INOTIFY = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    held = []
    while len(held) < 128:
        fd = libc.inotify_init1(0)
        if fd < 0:
            break
        held.append(fd)
    print(len(held))
""")


def _host_inotify_works() -> bool:
    fd = LIBC.inotify_init1(0)
    if fd >= 0:
        os.close(fd)
    return fd >= 0


def _check_inotify_quota_is_not_the_hosts(sandbox_pool) -> int:
    with sandbox_pool.session() as py:
        held = py.run(HOLD_INOTIFY)
        assert held.ok, held
        assert _host_inotify_works(), "the episode's inotify instances exhausted the host root's quota"
    return int(held.stdout)


def test_inotify_instances_inside_do_not_count_against_host_root(pool):
    needs_private_uid()
    # 128 is fs.inotify.max_user_instances' default: the episode gets the whole quota of its own uid.
    held = _check_inotify_quota_is_not_the_hosts(pool)
    assert held == min(128, int(Path("/proc/sys/fs/inotify/max_user_instances").read_text()))


def test_inotify_instances_in_docker_do_not_count_against_host_root(docker_pool):
    _check_inotify_quota_is_not_the_hosts(docker_pool)


def test_concurrent_sandboxes_have_their_own_uid_and_quota(pool):
    needs_private_uid()
    with pool.session() as a, pool.session() as b:
        assert a.run(HOLD_INOTIFY).stdout == "128\n"
        assert b.run(HOLD_INOTIFY).stdout == "128\n"
        uids = {int(Path(f"/proc/{s._worker.launch.parent_pid}/status").read_text().split("Uid:")[1].split()[0])
                for s in (a, b)}
        assert len(uids) == 2 and all(UID_BASE <= u < UID_BASE + UID_SLOTS for u in uids)


def test_rlimit_nproc_counts_only_the_sandbox_uid(pool):
    """With a private uid RLIMIT_NPROC means something again: it counts the sandbox's own processes only."""
    needs_private_uid()
    with pool.session() as py:
        out = py.run("import resource, os\nresource.setrlimit(resource.RLIMIT_NPROC, (3, 3))\n"
                     "kids = []\ntry:\n    for _ in range(10):\n        pid = os.fork()\n"
                     "        if pid == 0:\n            import time; time.sleep(5); os._exit(0)\n"
                     "        kids.append(pid)\nexcept OSError as exc:\n    print('limited', len(kids))\n"
                     "for k in kids:\n    os.kill(k, 9)")
        assert out.stdout.startswith("limited "), out


# ---- the warm parent's inheritable settings ------------------------------------------------------------


CHANGE_PARENT = textwrap.dedent("""
    import os, resource
    done = []
    for name, action in [
        ("oom_score_adj", lambda: open("/proc/1/oom_score_adj", "w").write("1000")),
        ("nice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
        ("affinity", lambda: os.sched_setaffinity(1, {min(os.sched_getaffinity(0))})),
        ("rlimit", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (64, 64))),
    ]:
        try:
            action()
            done.append(name)
        except OSError:
            pass
    print(",".join(done))
""")
READ_STATE = ("import os, resource\nprint(open('/proc/1/oom_score_adj').read().strip(), open('/proc/self/oom_score_adj')"
              ".read().strip(), os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)), "
              "resource.getrlimit(resource.RLIMIT_NOFILE))")


def _check_parent_settings_do_not_persist(sandbox_pool) -> str:
    with sandbox_pool.session() as py:
        baseline = py.run(READ_STATE).stdout
        changed = py.run(CHANGE_PARENT).stdout.strip()
    for _ in range(2):
        with sandbox_pool.session() as py:
            assert py.run(READ_STATE).stdout == baseline
    return changed


@pytest.mark.parametrize("which", ["private_uid", "shared_uid"])
def test_oom_score_adj_and_scheduling_of_the_parent_do_not_persist(which, request):
    """With the launcher's uid the episode can change them (it owns the parent): the host must notice."""
    if which == "private_uid":
        needs_private_uid()
    sandbox_pool = request.getfixturevalue("pool" if which == "private_uid" else "shared_uid_pool")
    changed = _check_parent_settings_do_not_persist(sandbox_pool)
    if which == "shared_uid" and os.geteuid() == 0:
        assert "oom_score_adj" in changed  # the attack itself works here; only the host's check stops it


def test_oom_score_adj_does_not_persist_in_docker(docker_pool):
    _check_parent_settings_do_not_persist(docker_pool)


def test_process_settings_and_files_of_an_episode_do_not_reach_the_next(pool):
    with pool.session() as py:
        baseline = py.run("import os, signal, resource\nprint(oct(os.umask(0o022)), os.getcwd(), "
                          "sorted(os.environ), signal.getsignal(signal.SIGTERM), "
                          "resource.getrlimit(resource.RLIMIT_NOFILE), sorted(os.listdir(os.path.expanduser('~'))))")
        py.run("import os, signal, resource\nos.umask(0)\nos.chdir('/tmp')\nos.environ['EVIL'] = '1'\n"
               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nresource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))\n"
               "open(os.path.expanduser('~/.bashrc'), 'w').write('evil')")
    with pool.session() as py:
        assert py.run("import os, signal, resource\nprint(oct(os.umask(0o022)), os.getcwd(), "
                      "sorted(os.environ), signal.getsignal(signal.SIGTERM), "
                      "resource.getrlimit(resource.RLIMIT_NOFILE), sorted(os.listdir(os.path.expanduser('~'))))"
                      ).stdout == baseline.stdout


# ---- cleanup that cannot be broken from inside ---------------------------------------------------------


DEEP_TREE = textwrap.dedent("""
    import os
    os.chdir("/tmp")
    for i in range(1200):
        name = ("d" * 100) if i % 2 else "x\\n\\udcff"
        os.mkdir(name)
        os.chdir(name)
        open("f", "w").write("x")
    os.chdir("/tmp")
    os.makedirs("/tmp/ro/inner/deeper")
    open("/tmp/ro/inner/file", "w").write("x")
    os.chmod("/tmp/ro/inner", 0o000)
    os.chmod("/tmp/ro", 0o555)
    os.makedirs("/work/locked/a")
    os.chmod("/work/locked", 0)
    os.symlink("/usr", "/tmp/link-out")
    os.mkfifo("/tmp/fifo")
    print("planted")
""")


def _check_deep_tree_cannot_break_cleanup(sandbox_pool):
    with sandbox_pool.session() as py:
        planted = py.run(DEEP_TREE)
        assert planted.stdout == "planted\n", planted
    results: list[str] = []
    errors: list[BaseException] = []

    def episode(i: int) -> None:
        try:
            with sandbox_pool.session() as s:
                out = s.run(f"import os\nprint({i}, os.listdir('/tmp'), os.listdir('/work'))").stdout
                results.append(out)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    for round_ in range(3):
        threads = [threading.Thread(target=episode, args=(2 * round_ + k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert sorted(results) == [f"{i} [] []\n" for i in range(6)]
    assert not sandbox_pool._busy, "a worker was leaked as busy"


def test_a_1200_deep_tree_does_not_break_cleanup_and_later_episodes_all_run():
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=2)) as two_workers:
        _check_deep_tree_cannot_break_cleanup(two_workers)


def test_a_1200_deep_tree_does_not_break_docker_cleanup(docker_pool):
    _check_deep_tree_cannot_break_cleanup(docker_pool)


def test_host_cleanup_is_iterative_and_handles_odd_trees(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(3000):  # far past Python's recursion limit, and past PATH_MAX with 255-byte names
            os.mkdir("n" * 255, dir_fd=fd)
            new = os.open("n" * 255, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = new
            os.close(os.open("file", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    (root / "locked" / "inner").mkdir(parents=True)
    (root / "locked" / "inner" / "f").write_text("x")
    os.chmod(root / "locked" / "inner", 0)
    os.chmod(root / "locked", 0o500)
    os.mkdir(os.fsencode(root) + b"/\xff\nodd")
    (root / "escape").symlink_to(tmp_path)  # must be removed, not followed
    keep = tmp_path / "outside"
    keep.write_text("keep")
    assert _empty_dir(str(root)) == []
    assert keep.read_text() == "keep"


def test_any_exception_in_cleanup_destroys_the_worker_and_the_pool_goes_on(pool, monkeypatch, caplog):
    with pool.session() as py:
        assert py.run("x = 1").ok
        worker = py._worker
        monkeypatch.setattr(worker, "clean", lambda: (_ for _ in ()).throw(RecursionError("deep")))
        with caplog.at_level(logging.WARNING):
            py.reset()  # must not raise
        assert "RecursionError" in caplog.text
    assert worker not in pool._busy and worker not in pool._idle and not worker.alive
    with pool.session() as py:
        assert py.run("print(1)").stdout == "1\n"


# ---- the private uid, and the fallback when the host does not allow it ----------------------------------


def test_sandbox_runs_as_a_private_host_uid_and_still_reads_its_mounts(pool, tmp_path):
    needs_private_uid()
    private = tmp_path / "private"  # pytest's tmp dirs are 0700: only root can traverse them
    private.mkdir()
    (private / "data.txt").write_text("hello")
    os.chmod(private, 0o755)
    assert not stat.S_IMODE(os.stat(tmp_path.parent).st_mode) & 0o001
    with SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=1,
                                   mounts=((str(private), "/opt/data"),))) as p, p.session() as py:
        out = py.run("import os\nprint(os.getuid(), open('/opt/data/data.txt').read())\n"
                     "open('/work/mine', 'w').write('x')\nprint(os.stat('/work/mine').st_uid)")
        assert out.stdout == "65534 hello\n65534\n", out
        parent = py._worker.launch.parent_pid
        host_uid = int(Path(f"/proc/{parent}/status").read_text().split("Uid:")[1].split()[0])
        assert host_uid != os.geteuid() and os.stat(f"/proc/{parent}/root/work/mine").st_uid == host_uid
        # The launcher's stage mounts live only in the sandbox's mount namespace, never in the host's.
        assert backends.STAGE_DIR not in Path("/proc/self/mountinfo").read_text()


def test_without_a_private_uid_the_reason_is_logged_and_the_filter_still_holds(monkeypatch, caplog):
    reason = f"test: no private uid {secrets.token_hex(4)}"
    monkeypatch.setattr(backends, "private_uid_unavailable", lambda: reason)
    with caplog.at_level(logging.WARNING, logger=backends.__name__), \
            SandboxPool(SandboxConfig(backend="bwrap", limits=LIMITS, max_workers=1)) as p, p.session() as py:
        out = json.loads(py.run(keys_probe("agentgym-fallback", "s", [])).stdout)
        assert all(rc == -1 for rc, _ in out["add"])
        parent = py._worker.launch.parent_pid
        assert int(Path(f"/proc/{parent}/status").read_text().split("Uid:")[1].split()[0]) == os.geteuid()
        assert py.run("print(open('/proc/self/status').read().count('Seccomp:\\t2'))").stdout == "1\n"
    assert reason in caplog.text


def test_bwrap_gets_the_seccomp_filter_and_masks_proc_keys():
    cmd = backends.BwrapBackend().command("/tmp/ipc", SandboxConfig(), seccomp_fd=9)
    assert cmd[cmd.index("--seccomp") + 1] == "9"
    if os.path.exists("/proc/keys"):
        assert cmd[cmd.index("/proc/keys") - 2:cmd.index("/proc/keys")] == ["--ro-bind", "/dev/null"]
