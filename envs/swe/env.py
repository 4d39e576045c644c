"""SWE-v1: fix a real bug in a real library, inside a sandbox (SWE-Gym / SWE-smith style).

Each episode gets a fresh copy of the buggy repository in its own sandbox (bubblewrap or a Docker
container; no network, resource limits). The tests that reveal the bug are hidden; the agent reads the
statement, explores with ``bash``/``view``, edits with ``str_replace``/``create``, runs the visible tests
with ``run_tests`` and finally calls ``submit``.

Grading measures the fix and nothing else. ``submit`` stages everything (``git add -A``: untracked files too)
and diffs against the baseline commit; that exact text is ``info["turn"]["patch"]`` and is what is graded, in
a *fresh* sandbox session the agent never touched: the pristine buggy tree is rebuilt, the patch applied, and
only changes to source modules under the library's package directory are kept (every other path, e.g.
conftest files, pytest/tox/setup.cfg/pyproject settings, ``sitecustomize``/``usercustomize``, ``.pth`` files,
plugin modules, tests, is put back from the pristine tree and listed as ignored). pytest then runs under
``python -I`` with a grader-chosen environment; per-test outcomes come back in a report authenticated by an
audit hook installed before the library is imported, which credits a test only when it saw the genuine test
body return (a pytest "passed" without that counts as failed and "tampered"; a test with no report counts as
failed). See :func:`agentgym.tasks.swe.workspace.grade_code` and ``tasks/swe/grade_boot.py``, whose docstring
lists what code inside the test process can still do.

Score: with f = passing FAIL_TO_PASS / all FAIL_TO_PASS and G the guarded tests (PASS_TO_PASS plus every
visible test that passes on the buggy tree), success = f == 1 and no regressions; reward = score is 1.0/0.0 on
success under ``reward="resolved"`` (SWE-bench's rule; the default for SWE-bench instances) and
f * (1 - regressions / |G|) under ``reward="partial"`` (the default for the built-in tasks). Reward channels for gated accumulation (G-RA, Sun et al., 2025) are reported in
``info["turn"]["channels"]`` on every step: ``tool_validity`` (+1 per tool call that ran, -1 per malformed or
failing one), ``test_runs``, and on the last step ``outcome`` (the high-priority channel: no submit 0.0, no
graded change 0.1, a graded change that fails 0.5, success 1.0), ``patch_submitted`` and ``f2p_fraction``.
``info["turn"]["grading"]`` holds the details (regressions by id, graded and ignored paths, tampered reports).

Tasks may also be a user's own SWE-bench-format instances (``metadata["swebench"]``, from
:mod:`agentgym.tasks.swe.swebench`): the episode gets the local clone's tree at ``base_commit``, and the same grader
runs with ``base_commit`` + ``test_patch`` as its pristine tree (G is then PASS_TO_PASS alone, as in SWE-bench).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import shlex
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, EnvCrashed, TaskError
from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

from agentgym.envs.swe.scoring import REWARD_RULES, known_visible_pass, remember_visible_pass, score_submission, submission_message
from agentgym.envs.swe.tool_code import CREATE_CODE, REPLACE_CODE, VIEW_CODE, tool_reply

__all__ = ["OUTCOME_REWARDS", "resolve_repo_path", "score_submission", "SWEEnv"]

__all__ = ["OUTCOME_REWARDS", "SWEEnv", "resolve_repo_path", "score_submission"]

OUTCOME_REWARDS = {"no_submit": 0.0, "empty_patch": 0.1, "tests_fail": 0.5, "tests_pass": 1.0}
MAX_EDIT_CHARS = 200_000
MAX_PATCH_BYTES = 1 << 20
MAX_PATH_CHARS = 1024
VIEW_MAX_LINES = 400

logger = logging.getLogger(__name__)


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
    """Fix a bug injected into a pinned real Python library; graded by its hidden tests.

    ## Description

    SWE-Gym / SWE-smith style. Each episode gets a fresh copy of the buggy repository in its own sandbox
    (bubblewrap or a Docker container; no network, resource limits). The tests that reveal the bug are hidden; the
    agent reads the statement, explores with `bash`/`view`, edits with `str_replace`/`create`, runs the visible
    tests with `run_tests` and finally calls `submit`. Tasks come from the `swe-train` suite by default, or from a
    user's own SWE-bench-format instances (`agentgym.tasks.swe.swebench`).

    `submit` stages everything and diffs against the baseline commit; that patch (`info["turn"]["patch"]`) is graded
    in a fresh sandbox the agent never touched: the pristine tree is rebuilt, the patch applied, and only changes
    to source modules under the library's package are kept (tests, conftest files, pytest settings, `.pth` files
    and the like are put back and listed as ignored).

    ## Tools

    - `bash(command)`: run a bash command from the repository root (no network; time-limited).
    - `view(path, start, end)`: show a file with line numbers (up to 400 lines), or list a directory.
    - `str_replace(path, old, new)`: replace the one occurrence of `old` in a file with `new` (exact text).
    - `create(path, text)`: create or overwrite a text file.
    - `run_tests(selector)`: run the repository's visible tests with pytest (the tests that reveal the bug are
      hidden).
    - `submit()`: submit the changes for grading; this ends the episode.

    ## Reward

    With f = passing FAIL_TO_PASS tests / all FAIL_TO_PASS tests and G the guarded tests (PASS_TO_PASS plus every
    visible test that passes on the buggy tree): success is f == 1 with no regressions. The reward, paid on submit
    (component `tests`), follows `reward`: `"resolved"` pays 1.0 on success and 0.0 otherwise (SWE-bench's
    resolved rule, the default for SWE-bench instances, so a suite's mean reward is its resolved rate);
    `"partial"` pays f * (1 - regressions / |G|) (the default for the built-in tasks; not a resolved rate). An episode that never submits scores 0. Reward channels for
    gated accumulation are reported in `info["turn"]["channels"]` on every step (`tool_validity`, `test_runs`, and on
    the last step `outcome`, `patch_submitted`, `f2p_fraction`); `info["turn"]["grading"]` holds the details.

    ## Episode end

    Terminated by `submit`; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: tool-using turns before truncation.
    - `tasks`: tasks to draw from (default: the `suite`).
    - `suite`: suite to sample from when `tasks` is not given (`swe-train`).
    - `backend`: sandbox backend: `auto` (bwrap where it works, else Docker), `bwrap` or `docker`.
    - `command_timeout_s`: wall-clock limit of one `bash` command.
    - `test_timeout_s`: wall-clock limit of one `run_tests` or grading run.
    - `max_output_chars`: tool output beyond this is cut in the middle.
    - `max_action_chars`: see `AgentEnv` (large by default: a reply may carry a whole file).
    - `reward`: `"resolved"` or `"partial"` (see Reward); None picks `"resolved"` for SWE-bench instances and
      `"partial"` for the built-in tasks.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v1: grading changed: a clean sandbox grades the patch, and regressions count.
    - v0: the first version.
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
        reward: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        if reward is not None and reward not in REWARD_RULES:
            raise ConfigError(f"reward must be one of {REWARD_RULES} (or None: 'resolved' for SWE-bench instances, "
                              f"'partial' for the built-in tasks), got {reward!r}.")
        self.reward_rule = reward
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
        self._base_commit = "HEAD"
        self._patch: str | None = None
        self._grading: dict[str, Any] | None = None
        self._spec: Any = None
        self._library: Any = None
        self._prepared: Any = None  # a SWE-bench instance's trees (agentgym.tasks.swe.swebench.PreparedInstance)
        self._edits: list[tuple[str, str, str]] = []  # (tool, path, digest of the change) of each edit that applied
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
                      env=dict(os.environ, PYTHONPATH={":".join([self._library.python_path, *self._library.test_path])!r}, PYTHONDONTWRITEBYTECODE="1"))
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
        code = VIEW_CODE.format(path=rel, start=start, stop=stop)
        return tool_reply(self._cap(self._run(code, 30)))

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
        return self._record_edit("str_replace", rel, old + "\0" + new,
                                 tool_reply(self._run(REPLACE_CODE.format(path=rel, old=old, new=new), 30)))

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
        reply = tool_reply(self._run(CREATE_CODE.format(path=rel, text=text), 30))
        return self._record_edit("create", rel, text, reply)

    def _record_edit(self, name: str, path: str, change: str, result: ToolResult) -> ToolResult:
        if not result.is_error:
            self._edits.append((name, path, hashlib.sha256(change.encode("utf-8", "replace")).hexdigest()[:16]))
        return result

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
        if not self._ensure_repo():
            return ToolResult(self._finish_submission("", None, "the repository was deleted: nothing to grade"))
        patch, problem = self._extract_patch()
        if problem or not patch.strip():
            return ToolResult(self._finish_submission("", None, problem))
        return ToolResult(self._finish_submission(patch, self._grade(patch), ""))

    def _extract_patch(self) -> tuple[str, str]:
        """The agent's whole change (untracked files included) against the baseline commit, or a problem."""
        from agentgym.tasks.swe.workspace import parse_json_reply, patch_code

        reply = parse_json_reply(self._run(patch_code(self._base_commit, max_bytes=MAX_PATCH_BYTES), 90)) or {}
        patch = reply.get("patch")
        if isinstance(patch, str):
            return patch, ""
        return "", str(reply.get("error") or "could not compute the patch")

    def _grade(self, patch: str) -> dict[str, Any]:
        """Apply ``patch`` to the pristine buggy tree in a fresh sandbox session and run the hidden tests there.

        The agent's own sandbox is never used for grading: anything it left there (conftest files, settings,
        ``.pth`` files, processes) cannot touch the run. See :func:`agentgym.tasks.swe.workspace.grade_code`.
        """
        from agentgym.tasks.swe.libraries import fetch_library
        from agentgym.tasks.swe.workspace import grade_code, parse_json_reply, tree_payload
        from agentgym.tools.sandbox import SandboxError

        spec, lib = self._spec, self._library
        visible_pass = known_visible_pass(spec)
        if self._prepared is not None:  # a SWE-bench instance: pristine = base_commit + test_patch
            code = grade_code(lib, self._prepared.baseline_files(), spec.hidden_tests, patch,
                              spec.test_args, timeout_s=self.test_timeout_s,
                              pristine_tree=self._prepared.grading_tree(), protected=self._prepared.protected)
        else:
            files = spec.buggy_files(fetch_library(spec.library))
            guard_files = list(spec.visible_tests) if visible_pass is None or visible_pass else []
            code = grade_code(lib, files, spec.hidden_tests, patch,
                              [*spec.fail_to_pass, *spec.pass_to_pass, *guard_files],
                              baseline_args=list(spec.visible_tests) if visible_pass is None else [],
                              timeout_s=self.test_timeout_s, pristine_tree=tree_payload(fetch_library(spec.library)))
        try:
            with self._session.pool.session() as grader:
                result = grader.run(code, timeout_s=2 * self.test_timeout_s + 60, cpu_s=2 * self.test_timeout_s + 60,
                                    max_output=16 << 20)
        except SandboxError as exc:
            raise EnvCrashed(f"the grading sandbox failed: {exc}") from exc
        reply = parse_json_reply(result.stdout) if result.status == "ok" else None
        if reply is None:
            last = (result.stderr.strip().splitlines() or [result.status])[-1]
            return {"applied": False, "problem": f"grading crashed ({result.status}): {last[-300:]}"}
        if reply.get("baseline") is not None:
            visible_pass = remember_visible_pass(spec, reply["baseline"])
        reply["visible_pass"] = list(visible_pass or ())
        return reply

    def _finish_submission(self, patch: str, graded: dict[str, Any] | None, problem: str) -> str:
        """Score a submission (formula in the module docstring) and end the episode."""
        rule = self.reward_rule or ("resolved" if self._prepared is not None else "partial")
        grading = score_submission(self._spec, graded or {}, problem, rule=rule)
        if self._prepared is not None:  # what a comparison with published SWE-bench numbers needs to state
            grading["swebench"] = {"version": self._spec.version,
                                   "environment_setup_commit": self._spec.environment_setup_commit}
        success = grading["success"]
        tier = "tests_pass" if success else "tests_fail" if grading["graded_paths"] else "empty_patch"
        outcome = OUTCOME_REWARDS[tier]
        self.add_reward("tests", grading["reward"])
        self._channels.update({"outcome": outcome, "patch_submitted": float(bool(grading["graded_paths"])),
                               "f2p_fraction": grading["f2p_passed"] / grading["f2p_total"]})
        self._patch, self._grading = patch, grading
        self.mark_answer()
        self.finish(success=success, score=grading["reward"], reason="solved" if success else "answered")
        return submission_message(grading, self._library.package_dir)

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
        from agentgym.registration.suites import load_suite

        pool = list(load_suite(self._suite_name))
        return pool[int(rng.integers(len(pool)))]

    def _begin_episode(self, task: Task) -> str:
        from agentgym.tasks.swe.builder import SweTaskSpec
        from agentgym.tasks.swe.libraries import fetch_library, get_library
        from agentgym.tasks.swe.workspace import setup_code, tree_payload
        from agentgym.tools.sandbox import default_pool

        spec_data = task.metadata.get("spec")
        self._prepared = None
        if isinstance(task.metadata.get("swebench"), dict):  # a user's SWE-bench instance (local clone)
            from agentgym.tasks.swe.swebench import SweBenchInstance, sandbox_config

            self._spec = SweBenchInstance.from_metadata(task.metadata["swebench"])
            self._prepared = self._spec.prepare()
            self._library = self._spec.layout
            config = sandbox_config(self._spec, self.backend)
        elif not isinstance(spec_data, dict):
            raise TaskError(f"SWE task {task.id!r} needs metadata['spec'] (a task spec from tasks/data/swe_tasks.jsonl) "
                            "or metadata['swebench'] (agentgym.tasks.swe.swebench.instance_to_task).")
        else:
            self._spec = SweTaskSpec.from_dict(spec_data)
            self._library = get_library(self._spec.library)
            if self._spec.version != self._library.version:
                raise TaskError(f"Task {task.id!r} is for {self._spec.library} {self._spec.version}, but "
                                f"{self._library.key} is pinned; rebuild tasks with `agentgym tasks build swe`.")
            config = _prepared_sandbox_config(self._spec.library, self.backend)
        if self._session is not None:
            self._session.close()
        pool = default_pool(config)
        self._session = pool.session()
        self._channels: dict[str, float] = {}
        self._patch: str | None = None
        self._grading: dict[str, Any] | None = None
        self._edits = []
        if self._prepared is not None:
            files, tree = {}, self._prepared.agent_tree()
        else:
            files = self._spec.buggy_files(fetch_library(self._spec.library))
            tree = tree_payload(fetch_library(self._spec.library), files, drop=self._spec.hidden_tests)
        ready = self._run(setup_code(self._library, files, self._spec.hidden_tests, tree=tree), 120).split()
        if len(ready) != 2 or ready[0] != "ready":
            raise EnvCrashed("the repository could not be prepared in the sandbox")
        self._base_commit = ready[1]
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
        if self._grading is not None:
            turn_info["grading"] = dict(self._grading)
        return observation, kind

    def state_key(self) -> str:
        """The edits that applied so far (tool, path and a digest of the change, in order), from memory: reading,
        searching and test runs leave the code as it was, so they keep the key, and the same fix reached after
        different exploration is the same state. Files changed through ``bash`` (``sed -i``) are not seen:
        tracking them would need a sandbox call per step."""
        if self._finished:
            return "submitted"
        return "edits " + json.dumps(self._edits)

    def _task_instructions(self) -> str:
        return (
            "You are fixing a bug in a Python library. The repository is checked out in your working directory. "
            "Explore it with bash and view, edit with str_replace or create, check your change with run_tests "
            "(the tests that reveal the bug are hidden; the others are there), then call submit() once. "
            f"No network access. You have {self.max_turns} turns; call one or a few tools per turn."
        )

    def reference_solver(self) -> ReferenceSolver:
        """Undo the injected mutation with str_replace (unique context), then submit; a SWE-bench instance
        instead applies its gold ``patch`` with ``git apply`` through ``bash``."""
        from agentgym.tasks.swe.libraries import fetch_library

        spec = self._spec
        if self._prepared is not None:
            marker = "AGENTGYM_GOLD_PATCH"
            while marker in spec.patch:
                marker += "_"
            gold = [_hermes("bash", {"command": f"git apply --whitespace=nowarn - <<'{marker}'\n{spec.patch}"
                                               f"{'' if spec.patch.endswith(chr(10)) else chr(10)}{marker}"}),
                    _hermes("submit", {})]

            def apply_gold(observation: str) -> str:
                return gold.pop(0) if len(gold) > 1 else gold[0]

            return apply_gold
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


def _prepared_sandbox_config(library: str, backend: str) -> Any:
    """:func:`_episode_sandbox_config`, announcing the one slow reset: a library's first use on this machine.

    The first reset that needs a library downloads its pinned sdist with pip and unpacks it into the cache
    (seconds to minutes, depending on PyPI); every later reset, in any process, finds it built. A silent wait
    that long looks like a hang, so it is logged (INFO) at start and end, with sizes, and drawn as a bar in a
    terminal (:mod:`agentgym.utils.progress`).
    """
    from agentgym.utils.progress import ProgressBar
    from agentgym.tasks.swe.libraries import cache_root, get_library

    lib = get_library(library)
    tree = cache_root() / "src" / lib.key
    if (tree / ".agentgym-complete").is_file():  # agentgym.utils.cache.build_once's mark of a complete entry
        return _episode_sandbox_config(library, backend)
    logger.info("SWE: first use of %s: downloading its sdist with pip and unpacking it into %s (once per machine)",
                lib.key, tree)
    start = time.perf_counter()
    with ProgressBar(None, f"SWE: preparing {lib.key} (first use)", unit="step"):
        config = _episode_sandbox_config(library, backend)
    files = [f for f in tree.rglob("*") if f.is_file()]
    logger.info("SWE: %s ready in %.1f s (%d files, %.1f MB in %s)", lib.key, time.perf_counter() - start,
                len(files), sum(f.stat().st_size for f in files) / 1e6, tree)
    return config


def _episode_sandbox_config(library: str, backend: str) -> Any:
    """The library's sandbox settings without the pristine tree: episodes are sent their files instead.

    A mounted (or baked-in) pristine tree would let the agent read the unmutated source and the hidden tests;
    grading sessions come from the same pool and are sent the pristine tree they need.
    """
    import dataclasses

    from agentgym.tasks.swe.builder import sandbox_config_for
    from agentgym.tasks.swe.images import BASE_IMAGE

    from agentgym.tasks.swe.libraries import DEPS_MOUNT

    config = sandbox_config_for(library, backend=backend)  # only the test-only dependencies stay mounted
    return dataclasses.replace(config, mounts=tuple(m for m in config.mounts if m[1] == DEPS_MOUNT), docker_image=BASE_IMAGE,
                               hidden_paths=installed_copies(library))


def installed_copies(library: str) -> tuple[str, ...]:
    """Where the host's Python has its own copy of ``library`` installed (found without importing it).

    The host's site-packages are mounted read-only into every sandbox, so an installed copy (tabulate comes
    with reasoning-gym) would hand the agent the upstream source of the very code it is asked to fix; the
    sandbox shows these paths empty instead.
    """
    import os

    from agentgym.tasks.swe.libraries import get_library
    from agentgym.tasks.swe.swebench import installed_module_copies

    return installed_module_copies(os.path.basename(get_library(library).package_dir.rstrip("/")))


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
