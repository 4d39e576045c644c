"""Code that runs *inside* the sandbox to set up an episode's repository and to run its tests.

The host never executes the library or its tests: it sends these snippets to a sandbox session (bwrap
or Docker), where the pristine library is mounted read-only at :data:`PRISTINE`. Test results come back
per test id through a small pytest plugin, so FAIL_TO_PASS / PASS_TO_PASS checks do not depend on
parsing pytest's human output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from agentgym.tasks.swe.libraries import Library

__all__ = ["PRISTINE", "REPO", "collect_results", "run_tests_code", "setup_code"]

PRISTINE = "/opt/agentgym/repo"
REPO = "/work/repo"
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


def setup_code(lib: Library, files: Mapping[str, str], hidden_tests: Sequence[str]) -> str:
    """Copy the pristine repo into the work dir, write the buggy files, hide tests, commit a git baseline."""
    return f'''
import os, shutil, subprocess
shutil.rmtree({REPO!r}, ignore_errors=True)
shutil.copytree({PRISTINE!r}, {REPO!r}, symlinks=True)
os.chdir({REPO!r})
for _path, _text in {dict(files)!r}.items():
    with open(_path, "w", encoding="utf-8") as _fh:
        _fh.write(_text)
for _path in {list(hidden_tests)!r}:
    os.remove(_path)
with open("/tmp/agentgym_results.py", "w") as _fh:
    _fh.write({PLUGIN_SOURCE!r})
_git = ["git", "-c", "user.name=agentgym", "-c", "user.email=agentgym@localhost", "-c", "init.defaultBranch=main"]
subprocess.run(_git + ["init", "-q"], check=True)
subprocess.run(_git + ["add", "-A"], check=True)
subprocess.run(_git + ["commit", "-q", "-m", "baseline"], check=True)
print("ready")
'''


def run_tests_code(lib: Library, args: Sequence[str], *, timeout_s: float, restore_tests: bool = False,
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
_env = dict(os.environ, PYTHONPATH=os.pathsep.join([{lib.python_path!r}, "/tmp"]), AGENTGYM_RESULTS="/tmp/results.json",
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
