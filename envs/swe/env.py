"""SWE-v0: fix a real bug in a real library, inside a sandbox (SWE-Gym / SWE-smith style).

Each episode gets a fresh copy of the buggy repository in its own sandbox (bubblewrap or a Docker
container; no network, resource limits). The tests that reveal the bug are hidden; the agent reads the
statement, explores with ``bash``/``view``, edits with ``str_replace``/``create``, runs the visible tests
with ``run_tests`` and finally calls ``submit``. Grading puts every pristine test file back (so editing or
deleting tests cannot help), runs the hidden FAIL_TO_PASS and the PASS_TO_PASS tests, and rewards the
fraction of FAIL_TO_PASS that pass; success needs all of both.

Reward channels for gated accumulation (G-RA, spec section 5) are reported in ``info["turn"]["channels"]``
on every step: ``tool_validity`` (+1 per tool call that ran, -1 per malformed or failing one),
``test_runs``, and on the last step ``outcome`` (the project's r_high table: no submit 0.0, empty patch
0.1, patch failing tests 0.5, all tests pass 1.0), ``patch_submitted`` and ``f2p_fraction``. The final patch
(``git diff`` against the buggy baseline) is stored in ``info["turn"]["patch"]`` of the submit step.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, EnvCrashed, TaskError
from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["OUTCOME_REWARDS", "SWEEnv", "resolve_repo_path"]

OUTCOME_REWARDS = {"no_submit": 0.0, "empty_patch": 0.1, "tests_fail": 0.5, "tests_pass": 1.0}
MAX_EDIT_CHARS = 200_000
MAX_PATH_CHARS = 1024
VIEW_MAX_LINES = 400


def resolve_repo_path(path: str) -> str:
    """A path inside the repository, relative to its root; raises ``ValueError`` with the fix otherwise."""
    from agentgym.tasks.swe.workspace import REPO

    if not isinstance(path, str) or not path.strip():
        raise ValueError("path must be a non-empty string, relative to the repository root (e.g. 'src/pkg/mod.py').")
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise ValueError("path is too long or contains a NUL byte.")
    path = path.strip()
    if path.startswith(REPO + "/") or path == REPO:
        path = path[len(REPO):].lstrip("/") or "."
    if path.startswith("/"):
        raise ValueError(f"{path!r} is outside the repository; use paths relative to its root ({REPO}).")
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../"):
        raise ValueError(f"{path!r} leaves the repository; stay inside it.")
    return normal


class SWEEnv(AgentEnv):
    """Fix a bug injected into a pinned real library; graded by its own hidden tests.

    Args:
        max_turns: Tool-using turns before truncation.
        tasks: Tasks to draw from (default: the ``suite``).
        suite: Suite to sample from when ``tasks`` is not given (``swe-train``).
        backend: Sandbox backend: ``auto`` (bwrap where it works, else Docker), ``bwrap`` or ``docker``.
        command_timeout_s: Wall-clock limit of one ``bash`` command.
        test_timeout_s: Wall-clock limit of one ``run_tests`` or grading run.
        max_output_chars: Tool output beyond this is cut in the middle.
        render_mode: ``"ansi"`` or ``None``.
    """

    description: ClassVar[str] = "Fix a real bug in a real Python library (bash, view, str_replace, run_tests, submit)."
    native_format_hint: ClassVar[str] = 'Tools may also be called as functions, e.g. view("README.md") or submit().'

    def __init__(
        self,
        *,
        max_turns: int = 30,
        tasks: Sequence[Task] | None = None,
        suite: str = "swe-train",
        backend: str = "auto",
        command_timeout_s: float = 60.0,
        test_timeout_s: float = 180.0,
        max_output_chars: int = 6000,
        max_action_chars: int = 400_000,
        render_mode: str | None = None,
    ) -> None:
        if backend not in ("auto", "bwrap", "docker"):
            raise ConfigError(f"backend must be 'auto', 'bwrap' or 'docker', got {backend!r}.")
        for name, value in (("command_timeout_s", command_timeout_s), ("test_timeout_s", test_timeout_s)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}.")
        if not isinstance(max_output_chars, int) or max_output_chars < 200:
            raise ConfigError(f"max_output_chars must be an integer >= 200, got {max_output_chars!r}.")
        self.backend = backend
        self.command_timeout_s, self.test_timeout_s = float(command_timeout_s), float(test_timeout_s)
        self.max_output_chars = max_output_chars
        self._suite_name = suite
        self._session: Any = None
        self._spec: Any = None
        self._library: Any = None
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=4,
                         render_mode=render_mode)

    # ---- sandbox plumbing ----------------------------------------------------------------------------
    def _run(self, code: str, timeout_s: float) -> str:
        """Run a snippet in the episode's sandbox and return its stdout; sandbox failures end the episode."""
        from agentgym.tools.sandbox import SandboxError

        try:
            result = self._session.run(code, timeout_s=timeout_s + 15, cpu_s=timeout_s + 15, max_output=4 << 20)
        except SandboxError as exc:
            raise EnvCrashed(f"the sandbox failed: {exc}") from exc
        if result.state_reset:  # the episode's processes died (e.g. `kill -9 -1`): its repository is gone
            raise EnvCrashed(f"the sandbox lost the episode's state ({result.status}): {result.stderr[-300:]}")
        if result.status != "ok":  # e.g. a file the agent made unreadable: the model's problem, not ours
            last = (result.stderr.strip().splitlines() or [result.status])[-1]
            raise RuntimeError(f"the operation failed in the sandbox: {last}")
        return result.stdout

    def _cap(self, text: str) -> str:
        limit = self.max_output_chars
        if len(text) <= limit:
            return text
        head = limit * 2 // 3
        return f"{text[:head]}\n...[{len(text) - limit} characters cut]...\n{text[-(limit - head):]}"

    def _channel(self, name: str, value: float) -> None:
        self._channels[name] = self._channels.get(name, 0.0) + float(value)

    # ---- tools ---------------------------------------------------------------------------------------
    @tool
    def bash(self, command: str) -> ToolResult:
        """Run a bash command in the repository (no network; time-limited). Use it to explore, grep, run Python.

        Args:
            command: A bash command line, run from the repository root.
        """
        from agentgym.tasks.swe.workspace import REPO

        if not command.strip():
            return ToolResult.error("Error: the command is empty; pass a bash command such as 'ls'.")
        if len(command) > MAX_EDIT_CHARS:
            return ToolResult.error(f"Error: the command is longer than {MAX_EDIT_CHARS} characters.")
        code = f'''
import os, signal, subprocess
_p = subprocess.Popen(["bash", "-c", {command!r}], cwd={REPO!r}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      stdin=subprocess.DEVNULL, start_new_session=True,
                      env=dict(os.environ, PYTHONPATH={self._library.python_path!r}, PYTHONDONTWRITEBYTECODE="1"))
try:
    _out, _ = _p.communicate(timeout={self.command_timeout_s!r})
    _status = "exit code " + str(_p.returncode)
except subprocess.TimeoutExpired:
    os.killpg(_p.pid, signal.SIGKILL)
    _out, _ = _p.communicate()
    _status = "killed after {self.command_timeout_s:g} s (timeout)"
print(_out.decode("utf-8", "replace"), end="")
print("\\n[" + _status + "]")
'''
        if not self._ensure_repo():
            return ToolResult.error("Error: the repository directory is gone (deleted by an earlier command); "
                                    "the episode cannot continue meaningfully. Call submit().")
        return ToolResult(self._cap(self._run(code, self.command_timeout_s)))

    @tool
    def view(self, path: str, start: int = 1, end: int = 0) -> ToolResult:
        """Show a file with line numbers (or list a directory).

        Args:
            path: Path relative to the repository root.
            start: First line to show (1-based).
            end: Last line to show (0 = up to 400 lines from start).
        """
        try:
            rel = resolve_repo_path(path)
        except ValueError as exc:
            return ToolResult.error(f"Error: {exc}")
        if start < 1 or end < 0 or (end and end < start):
            return ToolResult.error("Error: need 1 <= start and (end == 0 or end >= start).")
        stop = end or start + VIEW_MAX_LINES - 1
        stop = min(stop, start + VIEW_MAX_LINES - 1)
        code = _VIEW_CODE.format(path=rel, start=start, stop=stop)
        return _reply(self._cap(self._run(code, 30)))

    @tool
    def str_replace(self, path: str, old: str, new: str) -> ToolResult:
        """Replace the one occurrence of ``old`` in a file with ``new`` (exact text, whitespace included).

        Args:
            path: Path relative to the repository root.
            old: Text that occurs exactly once in the file.
            new: Replacement text.
        """
        try:
            rel = resolve_repo_path(path)
        except ValueError as exc:
            return ToolResult.error(f"Error: {exc}")
        if not old:
            return ToolResult.error("Error: 'old' is empty; give the exact text to replace (copy it from view).")
        if len(old) > MAX_EDIT_CHARS or len(new) > MAX_EDIT_CHARS:
            return ToolResult.error(f"Error: edits are limited to {MAX_EDIT_CHARS} characters; make smaller edits.")
        return _reply(self._run(_REPLACE_CODE.format(path=rel, old=old, new=new), 30))

    @tool
    def create(self, path: str, text: str) -> ToolResult:
        """Create (or overwrite) a text file.

        Args:
            path: Path relative to the repository root.
            text: The whole file content.
        """
        try:
            rel = resolve_repo_path(path)
        except ValueError as exc:
            return ToolResult.error(f"Error: {exc}")
        if len(text) > MAX_EDIT_CHARS:
            return ToolResult.error(f"Error: files are limited to {MAX_EDIT_CHARS} characters.")
        return _reply(self._run(_CREATE_CODE.format(path=rel, text=text), 30))

    @tool
    def run_tests(self, selector: str = "") -> ToolResult:
        """Run the repository's visible tests with pytest (the tests that reveal the bug are hidden).

        Args:
            selector: pytest arguments, e.g. 'tests/test_keys.py' or 'tests/test_keys.py -k hashkey' (default:
                all visible tests).
        """
        from agentgym.tasks.swe.workspace import collect_results, run_tests_code

        try:
            args = shlex.split(selector) if selector.strip() else list(self._spec.visible_tests)
        except ValueError as exc:
            return ToolResult.error(f"Error: could not split the selector ({exc}); quote it like a shell command.")
        self._channel("test_runs", 1.0)
        code = run_tests_code(self._library, args, timeout_s=self.test_timeout_s, output_chars=self.max_output_chars)
        output, _ = collect_results(self._run(code, self.test_timeout_s))
        return ToolResult(self._cap(output))

    @tool
    def submit(self) -> ToolResult:
        """Submit your fix: the hidden tests are run and the episode ends."""
        from agentgym.tasks.swe.workspace import REPO, collect_results, run_tests_code

        if not self._ensure_repo():
            self._finish_submission("", {}, "the repository was deleted")
            return ToolResult("Submitted, but the repository was gone: nothing to grade.")
        patch = self._run(f'''
import subprocess
_d = subprocess.run(["git", "diff", "--no-color", "HEAD"], cwd={REPO!r}, capture_output=True, text=True)
print(_d.stdout, end="")
''', 60)
        ids = [*self._spec.fail_to_pass, *self._spec.pass_to_pass]
        code = run_tests_code(self._library, ids, timeout_s=self.test_timeout_s, restore_tests=True)
        _, results = collect_results(self._run(code, self.test_timeout_s))
        return ToolResult(self._finish_submission(patch, dict(results.get("outcomes") or {}), ""))

    def _finish_submission(self, patch: str, outcomes: dict[str, str], problem: str) -> str:
        spec = self._spec
        f2p = sum(outcomes.get(t) == "passed" for t in spec.fail_to_pass)
        p2p = sum(outcomes.get(t) == "passed" for t in spec.pass_to_pass)
        fraction = f2p / len(spec.fail_to_pass)
        success = f2p == len(spec.fail_to_pass) and p2p == len(spec.pass_to_pass)
        non_empty = bool(patch.strip())
        outcome = OUTCOME_REWARDS["tests_pass" if success else "tests_fail" if non_empty else "empty_patch"]
        self.add_reward("tests", fraction)
        self._channels.update({"outcome": outcome, "patch_submitted": float(non_empty), "f2p_fraction": fraction})
        self._patch = patch
        self.mark_answer()
        self.finish(success=success, score=fraction, reason="solved" if success else "answered")
        return (f"Submitted. Hidden tests: {f2p}/{len(spec.fail_to_pass)} of the failing tests now pass, "
                f"{p2p}/{len(spec.pass_to_pass)} of the other checked tests pass."
                + (f" ({problem})" if problem else ""))

    def _ensure_repo(self) -> bool:
        from agentgym.tasks.swe.workspace import REPO

        return self._run(f"import os\nprint(os.path.isdir({REPO + '/.git'!r}))", 10).strip() == "True"

    # ---- AgentEnv hooks ------------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.bash, self.view, self.str_replace, self.create, self.run_tests, self.submit])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([HermesParser(),
                                FunctionCallParser(["bash", "view", "str_replace", "create", "run_tests", "submit"])])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        from agentgym.suite import load_suite

        pool = list(load_suite(self._suite_name))
        return pool[int(rng.integers(len(pool)))]

    def _begin_episode(self, task: Task) -> str:
        from agentgym.tasks.swe.builder import SweTaskSpec, sandbox_config_for
        from agentgym.tasks.swe.libraries import fetch_library, get_library
        from agentgym.tasks.swe.workspace import setup_code
        from agentgym.tools.sandbox import default_pool

        spec_data = task.metadata.get("spec")
        if not isinstance(spec_data, dict):
            raise TaskError(f"SWE task {task.id!r} needs metadata['spec'] (a task spec from tasks/data/swe_tasks.jsonl).")
        self._spec = SweTaskSpec.from_dict(spec_data)
        self._library = get_library(self._spec.library)
        if self._spec.version != self._library.version:
            raise TaskError(f"Task {task.id!r} is for {self._spec.library} {self._spec.version}, but "
                            f"{self._library.key} is pinned; rebuild tasks with `agentgym tasks build swe`.")
        if self._session is not None:
            self._session.close()
        pool = default_pool(sandbox_config_for(self._spec.library, backend=self.backend))
        self._session = pool.session()
        self._channels: dict[str, float] = {}
        self._patch: str | None = None
        files = self._spec.buggy_files(fetch_library(self._spec.library))
        if self._run(setup_code(self._library, files, self._spec.hidden_tests), 120).strip() != "ready":
            raise EnvCrashed("the repository could not be prepared in the sandbox")
        return (f"{self._spec.statement}\n\nThe repository ({self._library.key}) is at the current directory. "
                f"Visible test files: {', '.join(self._spec.visible_tests[:12])}"
                + (" ..." if len(self._spec.visible_tests) > 12 else ""))

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        self._channels = {}
        observation, kind = super()._run_action(action, turn_info)
        calls, errors = len(turn_info["calls"]), len(turn_info["tool_errors"])
        self._channel("tool_validity", (calls - errors) - errors - (1 if kind == "invalid" and not calls else 0))
        if not self._finished and self._turn >= self.max_turns:
            self._channels.update({"outcome": OUTCOME_REWARDS["no_submit"], "patch_submitted": 0.0})
        turn_info["channels"] = dict(self._channels)
        if self._patch is not None:
            turn_info["patch"] = self._patch
        return observation, kind

    def _task_instructions(self) -> str:
        return (
            "You are fixing a bug in a Python library. The repository is checked out in your working directory. "
            "Explore it with bash and view, edit with str_replace or create, check your change with run_tests "
            "(the tests that reveal the bug are hidden; the others are there), then call submit() once. "
            f"No network access. You have {self.max_turns} turns; call one or a few tools per turn."
        )

    def reference_solver(self) -> ReferenceSolver:
        """Undo the injected mutation with str_replace (unique context), then submit."""
        from agentgym.tasks.swe.libraries import fetch_library

        spec = self._spec
        pristine = fetch_library(spec.library)
        original = (pristine / spec.mutation.file).read_text(encoding="utf-8")
        buggy = spec.buggy_files(pristine)[spec.mutation.file]
        old, new = _unique_context(buggy, original, spec.mutation.line, spec.mutation.end_line)
        steps = [_hermes("str_replace", {"path": spec.mutation.file, "old": old, "new": new}), _hermes("submit", {})]

        def solve(observation: str) -> str:
            return steps.pop(0) if len(steps) > 1 else steps[0]

        return solve

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        super().close()


def _hermes(name: str, arguments: dict[str, Any]) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _unique_context(buggy: str, original: str, line: int, end_line: int) -> tuple[str, str]:
    """The smallest block of whole lines around the bug that occurs once in the buggy file."""
    b_lines, o_lines = buggy.splitlines(keepends=True), original.splitlines(keepends=True)
    delta = len(o_lines) - len(b_lines)
    lo, hi_b = line - 1, line - 1 + (end_line - line) - max(delta, 0) + 1
    hi_b = max(hi_b, lo + 1)
    while True:
        old = "".join(b_lines[lo:hi_b])
        new = "".join(o_lines[lo:hi_b + delta])
        if buggy.count(old) == 1 or (lo == 0 and hi_b >= len(b_lines)):
            return old, new
        lo = max(lo - 1, 0)
        hi_b = min(hi_b + 1, len(b_lines))


def _reply(text: str) -> ToolResult:
    """Helper snippets print 'ERROR: ...' for model mistakes; those become error observations."""
    text = text.rstrip("\n")
    if text.startswith("ERROR: "):
        return ToolResult.error("Error: " + text[len("ERROR: "):])
    return ToolResult(text)


_GUARD = '''
import os
_path = {path!r}
_root = os.path.realpath("/work/repo")
_target = os.path.realpath(os.path.join(_root, {path!r}))
_inside = _target == _root or _target.startswith(_root + os.sep)
'''

_VIEW_CODE = _GUARD + '''
if not _inside:
    print("ERROR: that path resolves outside the repository (through a symlink).")
elif os.path.isdir(_target):
    _entries = []
    for _dir, _subdirs, _files in os.walk(_target):
        _subdirs[:] = sorted(d for d in _subdirs if not d.startswith(".") and d != "__pycache__")
        _depth = os.path.relpath(_dir, _target).count(os.sep) + (0 if _dir == _target else 1)
        if _depth >= 2:
            _subdirs[:] = []
        for _name in sorted(_files):
            _entries.append(os.path.relpath(os.path.join(_dir, _name), _root))
    print("\\n".join(_entries[:500]) + ("\\n..." if len(_entries) > 500 else ""))
elif not os.path.isfile(_target):
    print("ERROR: no such file or directory: " + _path)
else:
    with open(_target, "rb") as _fh:
        _data = _fh.read(5_000_000)
    if b"\\x00" in _data[:8192]:
        print("ERROR: " + _path + " is a binary file; view shows text files only.")
    else:
        _lines = _data.decode("utf-8", "replace").splitlines()
        _shown = _lines[{start} - 1:{stop}]
        if not _shown:
            print("ERROR: " + _path + " has " + str(len(_lines)) + " lines; start is past the end.")
        else:
            print("\\n".join(f"{{i:6d}}\\t{{t}}" for i, t in enumerate(_shown, {start})))
            if {stop} < len(_lines):
                print("... (" + str(len(_lines)) + " lines in total; view more with start=" + str({stop} + 1) + ")")
'''

_REPLACE_CODE = _GUARD + '''
if not _inside:
    print("ERROR: that path resolves outside the repository (through a symlink).")
elif not os.path.isfile(_target):
    print("ERROR: no such file: " + _path + " (create it with create).")
else:
    with open(_target, encoding="utf-8", errors="surrogateescape") as _fh:
        _text = _fh.read()
    _count = _text.count({old!r})
    if _count != 1:
        print("ERROR: 'old' occurs " + str(_count) + " times in " + _path + "; it must occur exactly once. "
              + ("Copy it exactly from view (whitespace matters)." if _count == 0 else "Include more surrounding lines."))
    else:
        with open(_target, "w", encoding="utf-8", errors="surrogateescape") as _fh:
            _fh.write(_text.replace({old!r}, {new!r}, 1))
        print("Replaced 1 occurrence in " + _path + ".")
'''

_CREATE_CODE = _GUARD + '''
if not _inside or _target == _root:
    print("ERROR: that path resolves outside the repository or is the repository itself.")
elif os.path.isdir(_target):
    print("ERROR: " + _path + " is a directory.")
else:
    os.makedirs(os.path.dirname(_target), exist_ok=True)
    with open(_target, "w", encoding="utf-8", errors="surrogateescape") as _fh:
        _fh.write({text!r})
    print("Wrote " + _path + " (" + str(len({text!r})) + " characters).")
'''
