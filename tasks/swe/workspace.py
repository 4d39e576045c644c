"""Code that runs *inside* the sandbox to set up an episode's repository, run its tests and grade a patch.

The host never executes the library or its tests: it sends these snippets to a sandbox session (bwrap
or Docker). Episodes are sent their repository (:func:`tree_payload`: the buggy files, no hidden tests), so
the agent's sandbox holds neither the unmutated source nor the hidden tests; the task builder instead mounts
the pristine library read-only at :data:`PRISTINE`. Test results come back per test id (a pytest plugin),
so FAIL_TO_PASS / PASS_TO_PASS checks do not depend on parsing pytest's human output.

Grading (:func:`patch_code` in the agent's sandbox, then :func:`grade_code` in a fresh one) trusts nothing the
agent wrote except source modules of the library's package; see :func:`grade_code` for what is restored. The
graded modules necessarily run inside the test process (the tests call them), so the verdict is decided
there by a guard the tested code cannot reach, not by pytest's reports alone: ``grade_boot.py`` (the test
process's whole program) installs an audit hook before any library code runs that alone holds the report key,
credits a test only when it sees the genuine test function (compiled from the pristine files) return
normally, and ends the run on the introspection that could reach it. What it does not stop (code in the
process that makes the tests' own assertions lie, or targeted rewrites of pytest helpers and third-party test
decorators) is listed in that file's docstring.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentgym.tasks.swe.libraries import Library

__all__ = ["PRISTINE", "REPO", "RepoLayout", "collect_results", "grade_code", "parse_json_reply", "patch_code",
           "run_tests_code", "setup_code", "tree_payload"]


@dataclass(frozen=True)
class RepoLayout:
    """Where a repository keeps its code and tests: what the snippets below need of a :class:`Library`.

    A repository brought by the user (a SWE-bench instance) has no pinned sdist, only this layout.

    Attributes:
        key: A name for messages (``owner/name@commit``).
        package_dir: The only directory whose ``.py`` modules a submitted patch may change (relative to the root).
        test_dir: The test directory (never graded from the patch).
        python_path: What goes on ``sys.path`` to import the package from the repo root.
        test_path: Sandbox paths the tests need on ``sys.path`` besides the repo.
    """

    key: str
    package_dir: str
    test_dir: str = "tests"
    python_path: str = "."
    test_path: tuple[str, ...] = ()


PRISTINE = "/opt/agentgym/repo"
REPO = "/work/repo"
GRADER_PRISTINE = "/work/pristine"  # where a grading session writes the pristine tree it was sent
RESULT_MARK = "@@agentgym-results@@"

PLUGIN_SOURCE = '''
import json, os

class Recorder:
    def __init__(self):
        self.outcomes = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            previous = self.outcomes.get(report.nodeid)
            if previous in ("failed", "error"):
                return
            outcome = report.outcome if report.when == "call" else ("error" if report.failed else report.outcome)
            self.outcomes[report.nodeid] = outcome

    def pytest_collectreport(self, report):
        if report.failed:
            self.outcomes[report.nodeid or "<collection>"] = "error"

recorder = Recorder()

def pytest_configure(config):
    config.pluginmanager.register(recorder, "agentgym-recorder")

def pytest_unconfigure(config):
    path = os.environ.get("AGENTGYM_RESULTS")
    if path:
        with open(path, "w") as fh:
            json.dump(recorder.outcomes, fh)
'''


def tree_payload(root: Path, files: Mapping[str, str] | None = None, drop: Sequence[str] = ()) -> dict[str, str]:
    """Every file under ``root`` as base64, with ``files`` (texts) written over it and ``drop`` left out.

    Episodes ship their repository this way instead of mounting the pristine tree: a mounted pristine tree
    would hand the agent the unmutated source and the hidden tests.
    """
    tree = dict(_read_tree(str(root)))
    tree.update({path: base64.b64encode(text.encode("utf-8")).decode() for path, text in (files or {}).items()})
    for path in drop:
        tree.pop(path, None)
    return tree


@functools.lru_cache(maxsize=16)
def _read_tree(root: str) -> tuple[tuple[str, str], ...]:
    found = []
    for path in sorted(Path(root).rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        found.append((str(path.relative_to(root)), base64.b64encode(path.read_bytes()).decode()))
    return tuple(found)


# Writes a tree_payload() into a directory; shared by episode setup and grading.
_WRITE_TREE = '''
def _write_tree(_root, _tree):
    import base64, os
    _made = set()
    for _rel, _data in _tree.items():
        _full = os.path.join(_root, _rel)
        _folder = os.path.dirname(_full)
        if _folder not in _made:
            os.makedirs(_folder, exist_ok=True)
            _made.add(_folder)
        with open(_full, "wb") as _fh:
            _fh.write(base64.b64decode(_data))
'''


def setup_code(lib: Library | RepoLayout, files: Mapping[str, str], hidden_tests: Sequence[str], *,
               tree: Mapping[str, str] | None = None) -> str:
    """Build the episode's repo in the work dir (buggy files written, hidden tests gone) and commit a baseline.

    The repo comes from ``tree`` (a :func:`tree_payload` that already has the buggy files and no hidden tests;
    what episodes use) or else from the pristine tree mounted at :data:`PRISTINE` (the task builder).
    Prints ``ready <commit>``: the baseline commit the submitted patch is taken against (an agent that commits
    or moves HEAD still has all its work in the patch).
    """
    if tree is not None:
        source = f"_write_tree({REPO!r}, json.loads({json.dumps(dict(tree))!r}))\nos.chdir({REPO!r})\n"
    else:
        source = f'''shutil.copytree({PRISTINE!r}, {REPO!r}, symlinks=True)
os.chdir({REPO!r})
for _path, _text in {dict(files)!r}.items():
    with open(_path, "w", encoding="utf-8") as _fh:
        _fh.write(_text)
for _path in {list(hidden_tests)!r}:
    os.remove(_path)
'''
    return f'''
import json, os, shutil, subprocess
{_WRITE_TREE}
shutil.rmtree({REPO!r}, ignore_errors=True)
{source}
with open("/tmp/agentgym_results.py", "w") as _fh:
    _fh.write({PLUGIN_SOURCE!r})
_git = ["git", "-c", "user.name=agentgym", "-c", "user.email=agentgym@localhost", "-c", "init.defaultBranch=main"]
subprocess.run(_git + ["init", "-q"], check=True)
subprocess.run(_git + ["add", "-A"], check=True)
subprocess.run(_git + ["commit", "-q", "-m", "baseline"], check=True)
_head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
print("ready " + _head.stdout.strip())
'''


def run_tests_code(lib: Library | RepoLayout, args: Sequence[str], *, timeout_s: float, restore_tests: bool = False,
                   output_chars: int = 6000) -> str:
    """Run pytest in a subprocess in the repo; print its (capped) output and then the per-test results.

    ``restore_tests`` first puts back every pristine test file (the hidden ones, and any the agent edited),
    which is how a submission is graded.
    """
    restore = f'''
shutil.rmtree({lib.test_dir!r}, ignore_errors=True)
shutil.copytree(os.path.join({PRISTINE!r}, {lib.test_dir!r}), {lib.test_dir!r}, symlinks=True)
''' if restore_tests else ""
    return f'''
import json, os, shutil, subprocess, sys
os.chdir({REPO!r}){restore}
_env = dict(os.environ, PYTHONPATH=os.pathsep.join([{lib.python_path!r}, *{list(lib.test_path)!r}, "/tmp"]), AGENTGYM_RESULTS="/tmp/results.json",
            PYTHONDONTWRITEBYTECODE="1")
if os.path.exists("/tmp/results.json"):
    os.remove("/tmp/results.json")
try:
    _proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "agentgym_results",
                            "--tb=short", "-o", "addopts=", *{list(args)!r}], capture_output=True, text=True,
                           timeout={timeout_s!r}, env=_env)
    _out, _code = _proc.stdout + _proc.stderr, _proc.returncode
except subprocess.TimeoutExpired as _exc:
    _out, _code = "pytest timed out after {timeout_s:g} s", -1
_results = {{}}
if os.path.exists("/tmp/results.json"):
    with open("/tmp/results.json") as _fh:
        _results = json.load(_fh)
if len(_out) > {output_chars}:
    _out = _out[:{output_chars // 3}] + "\\n...[output cut]...\\n" + _out[-{2 * output_chars // 3}:]
print(_out)
print({RESULT_MARK!r} + json.dumps({{"exit_code": _code, "outcomes": _results}}))
'''


def collect_results(stdout: str) -> tuple[str, dict[str, object]]:
    """Split a :func:`run_tests_code` run's stdout into (pytest output, results dict)."""
    head, sep, tail = stdout.rpartition(RESULT_MARK)
    if not sep:
        return stdout, {"exit_code": None, "outcomes": {}}
    try:
        return head.rstrip("\n"), json.loads(tail)
    except json.JSONDecodeError:
        return head, {"exit_code": None, "outcomes": {}}


# ---- submission: the patch, and grading it in a clean sandbox ------------------------------------------

GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CEILING_DIRECTORIES": "/work", "GIT_TERMINAL_PROMPT": "0"}

_PATCH_SOURCE = '''
import base64, json, os, signal, subprocess
_git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]

def _run(*args):
    proc = subprocess.Popen(_git + list(args), cwd=REPO, env=GIT_ENV, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError("git took longer than 60 s")
    if proc.returncode:
        raise RuntimeError(err.decode("utf-8", "replace").strip()[-300:] or "exit code " + str(proc.returncode))
    return out

try:
    _run("add", "-A")
    _patch = _run("diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
                  "--src-prefix=a/", "--dst-prefix=b/", BASE, "--")
    if len(_patch) > MAX_BYTES:
        _reply = {"error": "the patch is " + str(len(_patch)) + " bytes, over the " + str(MAX_BYTES)
                  + "-byte limit (large or generated files in the repository?)"}
    else:
        _reply = {"patch": _patch.decode("utf-8", "replace")}
except (OSError, RuntimeError) as _exc:
    _reply = {"error": "could not compute the patch: " + str(_exc)}
print(MARK + base64.b64encode(json.dumps(_reply).encode()).decode())
'''


def patch_code(base_commit: str, *, max_bytes: int) -> str:
    """Snippet for the agent's sandbox: stage everything (untracked files too) and diff against the baseline.

    Runs in the agent's own sandbox, so whatever the agent did to git there can only change what the patch
    says, and the patch is all that is graded. Prints one JSON reply after :data:`RESULT_MARK`.
    """
    return (f"REPO, BASE, MAX_BYTES, MARK = {REPO!r}, {base_commit!r}, {max_bytes!r}, {RESULT_MARK!r}\n"
            f"GIT_ENV = {GIT_ENV!r}\n" + _PATCH_SOURCE)


# The test process (``python -I -B -c``): see grade_boot.py for what it guarantees and what it cannot.
_BOOT_SOURCE = (Path(__file__).with_name("grade_boot.py")).read_text(encoding="utf-8")

# The grading driver: runs in a fresh sandbox session the agent never had, from the pristine tree.
_GRADE_SOURCE = r'''
import base64, ctypes, filecmp, hashlib, hmac, json, os, secrets, shutil, signal, stat, subprocess, sys, tempfile, time
REPO, PRISTINE = C["repo"], C["pristine"]
BLOCKED = {"conftest.py", "sitecustomize.py", "usercustomize.py"}
PROTECTED = set(C["protected"])


def build_tree(hide):
    """The agent's baseline: pristine files, the buggy files, and (for applying the patch) no hidden tests."""
    if os.path.lexists(REPO):
        shutil.rmtree(REPO)
    shutil.copytree(PRISTINE, REPO, symlinks=True)
    for path, text in C["files"].items():
        with open(os.path.join(REPO, path), "w", encoding="utf-8") as fh:
            fh.write(text)
    for path in (C["hidden"] if hide else ()):
        os.remove(os.path.join(REPO, path))


def allowed(rel):
    """Only source modules of the library's package are graded: nothing that steers pytest or Python startup."""
    parts = rel.split("/")
    tests = C["test_dir"].rstrip("/")
    return (rel.startswith(C["package_dir"].rstrip("/") + "/") and rel.endswith(".py") and parts[-1] not in BLOCKED
            and rel != tests and not rel.startswith(tests + "/") and rel not in PROTECTED
            and not any(p.startswith(".") or p == "__pycache__" for p in parts))


def kind(path):
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return "l" if stat.S_ISLNK(mode) else "d" if stat.S_ISDIR(mode) else "f" if stat.S_ISREG(mode) else "o"


def entries(root):
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(folder, name)
            found[os.path.relpath(full, root)] = kind(full)
    return found


def same(rel, k):
    ours, theirs = os.path.join(PRISTINE, rel), os.path.join(REPO, rel)
    if k == "l":
        return os.readlink(ours) == os.readlink(theirs)
    return k != "f" or filecmp.cmp(ours, theirs, shallow=False)


def remove(path):
    k = kind(path)
    if k == "d":
        shutil.rmtree(path)
    elif k is not None:
        os.unlink(path)


def baseline_bytes(rel):
    if rel in C["files"]:
        return C["files"][rel].encode("utf-8")
    path = os.path.join(PRISTINE, rel)
    if kind(path) != "f":
        return None
    with open(path, "rb") as fh:
        return fh.read()


def unchanged(rel, have):
    """Whether the patched tree still holds the agent's baseline text of ``rel`` (a file the task overlays)."""
    if have != "f" or rel not in C["files"]:
        return False
    with open(os.path.join(REPO, rel), "rb") as fh:
        return fh.read() == baseline_bytes(rel)


def reconcile():
    """Make every path outside the allow-list byte-identical to the pristine tree; report what the patch changed."""
    before, patched, hidden = entries(PRISTINE), entries(REPO), set(C["hidden"])
    ignored, graded = [], []
    for rel in sorted(set(before) | set(patched)):
        want, have = before.get(rel), kind(os.path.join(REPO, rel))
        if allowed(rel) and want in ("f", None) and have in ("f", None):
            if have == "f":
                with open(os.path.join(REPO, rel), "rb") as fh:
                    changed = fh.read() != baseline_bytes(rel)
            else:
                changed = baseline_bytes(rel) is not None
            if changed:
                graded.append(rel)
            continue
        if have == want and same(rel, want):
            continue
        if want is None and have == "d":
            continue  # a new directory: emptied below unless it holds graded modules
        if not (have is None and rel in hidden) and not unchanged(rel, have):  # the baseline, not the agent's doing
            ignored.append(rel)
        remove(os.path.join(REPO, rel))
        source, target = os.path.join(PRISTINE, rel), os.path.join(REPO, rel)
        if want == "d":
            os.makedirs(target, exist_ok=True)
        elif want == "l":
            os.symlink(os.readlink(source), target)
        elif want == "f":
            shutil.copy2(source, target)
    for rel in sorted(set(patched) - set(before), reverse=True):
        path = os.path.join(REPO, rel)
        if kind(path) == "d" and not os.listdir(path):
            os.rmdir(path)
    return ignored, graded


def digests(rels):
    """SHA-256 of each file (None when gone): the tests and settings a run must leave as they were."""
    found = {}
    for rel in rels:
        path = os.path.join(REPO, rel)
        if kind(path) != "f":
            found[rel] = None
            continue
        with open(path, "rb") as fh:
            found[rel] = hashlib.sha256(fh.read()).hexdigest()
    return found


def references(args):
    """Pristine .py files whose code may define the tests named by ``args``: each named file's folder and
    its ancestors up to the repo (test classes inherit methods from helpers there), minus graded modules."""
    folders, found = set(), []
    for arg in args:
        path = os.path.normpath(os.path.join(REPO, arg.split("::")[0]))
        if os.path.isdir(path):
            for folder, _, names in os.walk(path):
                folders.add(folder)
            path = os.path.join(path, "x")
        folder = os.path.dirname(path)
        while folder.startswith(REPO):
            folders.add(folder)
            folder = os.path.dirname(folder)
    for folder in sorted(folders):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            full = os.path.join(folder, name)
            if name.endswith(".py") and kind(full) == "f" and not allowed(os.path.relpath(full, REPO)):
                found.append(full)
    return found


def read_report(data, key):
    """The one line of the test process's report whose HMAC-SHA256 tag verifies under ``key``, decoded."""
    for line in data.splitlines():
        tag, _, payload = line.partition(b" ")
        try:
            payload = bytes.fromhex(payload.decode("ascii"))
        except ValueError:
            continue
        if hmac.compare_digest(hmac.new(key, payload, "sha256").hexdigest().encode(), tag):
            found = {"outcomes": {}, "tampered": [], "exit_code": None, "violation": ""}
            for record in payload.decode("utf-8", "surrogatepass").split("\n"):
                kind_, _, rest = record.partition(" ")
                if kind_ == "exit":
                    found["exit_code"] = int(rest)
                elif kind_ == "violation":
                    found["violation"] = rest
                elif kind_ == "tampered":
                    found["tampered"].append(bytes.fromhex(rest).decode("utf-8", "surrogatepass"))
                elif kind_ == "outcome":
                    hexid, _, outcome = rest.partition(" ")
                    found["outcomes"][bytes.fromhex(hexid).decode("utf-8", "surrogatepass")] = outcome
            return found
    return None


def run_pytest(args):
    """One pytest process; its outcomes count only as an HMAC-tagged report whose key only the test process's
    audit hook holds (see grade_boot.py)."""
    if not args:
        return {"outcomes": {}, "tampered": [], "exit_code": 0, "log": ""}
    tmp = tempfile.mkdtemp(prefix="agentgym-grade-")
    key = secrets.token_bytes(32)
    fd = os.open(os.path.join(tmp, "outcomes"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    log = open(os.path.join(tmp, "log"), "w+b")
    own = [os.path.normpath(os.path.join(REPO, C["python_path"])), *C["test_path"]]  # test_path: test-only deps
    sys_path = list(dict.fromkeys([REPO, *own]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
    env.update(PYTHONPATH=os.pathsep.join(own), PYTHONDONTWRITEBYTECODE="1")  # for subprocesses the tests start
    argv = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", REPO, "--confcutdir", REPO,
            "--tb=short", *args]
    settings = {"key": key.hex(), "fd": fd, "argv": argv, "path": sys_path, "repo": REPO,
                "test_path": list(C["test_path"]), "reference": references(args)}
    proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", C["boot"]], cwd=REPO, env=env, pass_fds=(fd,),
                            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.communicate(json.dumps(settings).encode(), timeout=C["timeout_s"])
        problem = ""
    except subprocess.TimeoutExpired:
        problem = "the tests timed out after " + str(C["timeout_s"]) + " s"
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # nothing the tests started may outlive the run
    except ProcessLookupError:
        pass
    proc.wait()
    os.lseek(fd, 0, 0)
    data = b""
    while len(data) < (8 << 20):
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    log.seek(0, 2)
    log.seek(max(log.tell() - 1500, 0))
    tail = log.read().decode("utf-8", "replace")
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)
    found = read_report(data, key)
    if found is not None and found["violation"]:
        return {"outcomes": {}, "tampered": [], "exit_code": found["exit_code"], "log": tail,
                "problem": "the test process did what graded code may not (" + found["violation"]
                + "); nothing counts"}
    if found is not None:
        return {"outcomes": found["outcomes"], "tampered": found["tampered"], "exit_code": found["exit_code"],
                "log": tail, "problem": problem}
    return {"outcomes": {}, "tampered": [], "exit_code": proc.returncode, "log": tail,
            "problem": problem or "the test process ended without reporting outcomes (exit code "
            + str(proc.returncode) + ")"}


def apply_patch():
    if not C["patch"]:
        return ""
    tmp = tempfile.mkdtemp(prefix="agentgym-patch-")
    path = os.path.join(tmp, "patch.diff")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(C["patch"])
    try:
        done = subprocess.run(["git", "apply", "--whitespace=nowarn", path], cwd=REPO, env=C["git_env"],
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "git apply timed out"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if done.returncode:
        return "the patch does not apply: " + done.stderr.decode("utf-8", "replace").strip()[-300:]
    return ""


def visible_baseline():
    """Visible tests that pass on the unpatched buggy tree (run with the patched tree moved aside)."""
    aside = REPO + ".patched"
    os.rename(REPO, aside)
    try:
        build_tree(hide=False)
        run = run_pytest(C["baseline_args"])
    finally:
        shutil.rmtree(REPO)
        os.rename(aside, REPO)
    if not run["outcomes"] or run.get("problem"):
        return None  # not measured (timed out, crashed): no visible guard this time, and nothing memoized
    return sorted(t for t, o in run["outcomes"].items() if o == "passed")


def grade():
    start = time.monotonic()
    # Not dumpable: the tested code (same uid) cannot read this process's memory (the key, the pristine tree).
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    if C["pristine_tree"]:
        shutil.rmtree(PRISTINE, ignore_errors=True)
        _write_tree(PRISTINE, C["pristine_tree"])
    build_tree(hide=True)
    problem = apply_patch()
    reply = {"applied": not problem, "problem": problem, "ignored": [], "graded": [], "outcomes": {},
             "tampered": [], "baseline": None, "skipped": False}
    if problem:
        return reply
    reply["ignored"], reply["graded"] = reconcile()
    if not reply["graded"]:  # the tree is the buggy baseline again: its outcomes are known from the build
        reply["skipped"] = True
        return reply
    if C["baseline_args"]:
        reply["baseline"] = visible_baseline()
        reply["baseline_s"] = round(time.monotonic() - start, 3)
    if C["pristine_tree"]:  # the tested code must not find the unmutated source on disk either
        shutil.rmtree(PRISTINE)
    guarded = digests(sorted(rel for rel, k in entries(REPO).items() if k == "f" and not allowed(rel)))
    run = run_pytest(C["args"])
    if digests(sorted(guarded)) != guarded:
        run["outcomes"], run["problem"] = {}, "the test run changed test or configuration files; nothing counts"
    reply.update(outcomes=run["outcomes"], tampered=run["tampered"], problem=run.get("problem", ""),
                 log=run["log"] if not run["outcomes"] else "", grade_s=round(time.monotonic() - start, 3))
    return reply


print(C["mark"] + base64.b64encode(json.dumps(grade()).encode()).decode())
'''


def grade_code(lib: Library | RepoLayout, files: Mapping[str, str], hidden_tests: Sequence[str], patch: str,
               test_args: Sequence[str], *, baseline_args: Sequence[str] = (), timeout_s: float,
               pristine_tree: Mapping[str, str] | None = None, protected: Sequence[str] = ()) -> str:
    """Snippet for a *fresh* sandbox session: rebuild the buggy tree, apply ``patch``, run the tests.

    Only source modules inside ``lib.package_dir`` (not conftest/sitecustomize/usercustomize, not the tests)
    are taken from the patch; every other path is put back byte-for-byte from the pristine tree (or deleted)
    and reported as ignored, so conftest files, pytest/tox/setup.cfg/pyproject settings, ``.pth`` files, plugin
    modules and edited or deleted tests cannot change how tests are collected, run or reported. The tests run
    under ``python -I`` with the sandbox's own environment minus ``PYTHON*``/``PYTEST*``, and their outcomes
    count only from an HMAC-tagged report written by the test process's audit hook (``grade_boot.py``): a
    test passes only if pytest says so *and* its genuine body returned; a pytest "passed" without that is
    reported as "tampered", and a run that reaches for the hook reports a problem and counts nothing. A test
    module the hook could not compile (or a test inside a decorator that is neither installed code nor from
    the pristine tests) cannot be credited. ``baseline_args``
    (visible test files) are first run on the unpatched buggy tree, to learn which tests passed before.
    The pristine tree is ``pristine_tree`` (a :func:`tree_payload`, written into the grading sandbox first)
    or else the one mounted at :data:`PRISTINE`. ``protected`` names more paths that are never taken from the
    patch (test modules that live inside the package, e.g. the files a SWE-bench ``test_patch`` touches): the
    pristine tree's copy is what runs. A ``files`` entry the patch leaves alone is not reported as ignored
    (SWE-bench tasks overlay the pre-``test_patch`` text of test files the grader then restores). Prints one JSON
    reply after :data:`RESULT_MARK` (see :func:`parse_json_reply`).
    """
    config = {"repo": REPO, "pristine": PRISTINE if pristine_tree is None else GRADER_PRISTINE,
              "pristine_tree": dict(pristine_tree or {}), "files": dict(files), "hidden": list(hidden_tests),
              "patch": patch, "args": list(test_args), "baseline_args": list(baseline_args),
              "package_dir": lib.package_dir, "test_dir": lib.test_dir, "python_path": lib.python_path,
              "test_path": list(lib.test_path), "protected": sorted(set(protected)),
              "timeout_s": float(timeout_s), "boot": _BOOT_SOURCE, "git_env": GIT_ENV, "mark": RESULT_MARK}
    return f"import json\nC = json.loads({json.dumps(config)!r})\n{_WRITE_TREE}\n" + _GRADE_SOURCE


def parse_json_reply(stdout: str) -> dict[str, object] | None:
    """The JSON object a :func:`patch_code` or :func:`grade_code` snippet printed last, or None.

    The reply is base64 after the mark, so patch text or test output that contains the mark cannot split it.
    """
    _, sep, tail = stdout.rpartition(RESULT_MARK)
    if not sep:
        return None
    try:
        value = json.loads(base64.b64decode(tail.strip(), validate=True))
    except (ValueError, binascii.Error):
        return None
    return value if isinstance(value, dict) else None
