"""SWE-bench-format instances from a JSONL plus local clones, graded by SWE-v1's own clean-sandbox grader.

The instances are written here from our own data: a shipped toolz task's bug committed into a fresh git repo
(``base_commit``), the fix as ``patch`` and the removed failing test as ``test_patch``, exactly as SWE-bench
derives them from a pull request.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentgym.envs.swe.env import SWEEnv
from agentgym.errors import TaskError
from agentgym.rollout import run_reference_episode
from agentgym.registration.suites import load_suite
from agentgym.tasks.swe.builder import load_specs
from agentgym.tasks.swe.libraries import fetch_library
from agentgym.tasks.swe.mutations import apply_mutation
from agentgym.tasks.swe.swebench import instance_to_task, load_instances, parse_patch_paths, swebench_suite
from tests.helpers.dockerd import docker_daemon
from tests.envs.swe.test_reward_hacking import FORGE_HOOK

SPEC_ID = "toolz-0194fed924"  # merge_sorted: arguments swapped; one FAIL_TO_PASS test in toolz/tests/test_itertoolz.py
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "init.defaultBranch=main"]


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def git(repo: Path, *args: str) -> str:
    dates = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **dates}).stdout  # the same commit id every run: one cache entry


def without_functions(source: str, names: set[str]) -> str:
    """``source`` with the top-level functions ``names`` cut out (the tests a pull request would add)."""
    lines = source.splitlines(keepends=True)
    for node in sorted(ast.parse(source).body, key=lambda n: -n.lineno):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            del lines[start:node.end_lineno]
    return "".join(lines)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """repos/agentgym__toolz at the buggy commit (failing test removed), and a JSONL with one instance."""
    spec = next(s for s in load_specs() if s.id == SPEC_ID)
    root = tmp_path_factory.mktemp("swebench")
    repo = root / "repos" / "agentgym__toolz"
    shutil.copytree(fetch_library("toolz"), repo, ignore=shutil.ignore_patterns(".agentgym-complete"))
    source, test_file = spec.mutation.file, spec.hidden_tests[0]
    pristine_source, pristine_tests = (repo / source).read_text(), (repo / test_file).read_text()
    f2p_names = {t.split("::")[1] for t in spec.fail_to_pass}
    (repo / source).write_text(apply_mutation(pristine_source, spec.mutation))
    (repo / test_file).write_text(without_functions(pristine_tests, f2p_names))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / source).write_text(pristine_source)
    (repo / test_file).write_text(pristine_tests)
    patch, test_patch = git(repo, "diff", "--", source), git(repo, "diff", "--", test_file)
    git(repo, "checkout", "-q", "--", ".")
    record = {"instance_id": "agentgym__toolz-1", "repo": "agentgym/toolz", "base_commit": base[:10],
              "patch": patch, "test_patch": test_patch,
              "FAIL_TO_PASS": json.dumps(list(spec.fail_to_pass)),  # a JSON string, as in the published dataset
              "PASS_TO_PASS": list(spec.pass_to_pass),
              "problem_statement": spec.statement, "created_at": "2026-01-01", "version": "1.2"}
    path = root / "instances.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return {"root": root, "path": path, "repos": root / "repos", "record": record, "spec": spec, "base": base}


@pytest.fixture(scope="module")
def env():
    e = SWEEnv(backend="bwrap", command_timeout_s=20)
    yield e
    e.close()


def test_instances_load_with_inferred_layout_and_both_id_forms(data):
    (instance,) = load_instances(data["path"], data["repos"])
    spec = data["spec"]
    assert instance.base_commit == data["base"] and instance.fail_to_pass == spec.fail_to_pass
    assert instance.pass_to_pass == spec.pass_to_pass and instance.repo_path.endswith("agentgym__toolz")
    layout = instance.layout
    assert (layout.package_dir, layout.test_dir, layout.python_path) == ("toolz", "toolz/tests", ".")
    assert parse_patch_paths(instance.test_patch) == {"toolz/tests/test_itertoolz.py": "modified"}
    prepared = instance.prepare()
    assert "test_merge_sorted" not in (prepared.base / "toolz/tests/test_itertoolz.py").read_text()
    assert "test_merge_sorted" in (prepared.tested / "toolz/tests/test_itertoolz.py").read_text()
    assert "toolz/tests/test_itertoolz.py" in prepared.protected and "toolz/itertoolz.py" not in prepared.protected
    task = instance_to_task(instance)
    assert task.metadata["swebench"]["base_commit"] == data["base"] and task.prompt == spec.statement


def test_gold_patch_scores_one_and_empty_patch_zero(env, data):
    (task,) = [instance_to_task(i) for i in load_instances(data["path"], data["repos"])]
    traj = run_reference_episode(env, task, seed=0)
    assert traj.outcome["success"] and traj.outcome["score"] == 1.0, traj.outcome
    grading = traj.turns[-1].info["grading"]
    assert grading["graded_paths"] == ["toolz/itertoolz.py"] and not grading["ignored_paths"], grading
    assert grading["f2p_passed"] == 1 and grading["guarded_total"] == len(data["spec"].pass_to_pass)

    obs, _ = env.reset(options={"task": task})
    assert "test_merge_sorted" not in env.step(call("bash", command="cat toolz/tests/test_itertoolz.py"))[0]
    obs, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and reward == 0.0 and info["outcome"]["score"] == 0.0 and not info["outcome"]["success"]


@pytest.mark.parametrize("hack", ["conftest", "test_edit"])
def test_hacks_score_zero(env, data, hack):
    """A conftest that turns failures into passes, or the agent's own version of the hidden test, counts for nothing.

    The patch also touches the package (a comment), so the hidden tests do run: the test_patch's version of the
    test file is the one that runs, and the bug is still there.
    """
    # test_edit: declare a test_dir that misses the package's own tests folder, so only the grader's list of
    # protected test files (the test_patch's, the FAIL_TO_PASS/PASS_TO_PASS files, test-named modules) stands guard.
    layouts = {"agentgym/toolz": {"test_dir": "tests"}} if hack == "test_edit" else None
    (task,) = [instance_to_task(i) for i in load_instances(data["path"], data["repos"], layouts=layouts)]
    test_file = "toolz/tests/test_itertoolz.py"
    env.reset(options={"task": task})
    touch = call("bash", command="echo '# looked at this' >> toolz/itertoolz.py")
    if hack == "conftest":
        actions = [call("create", path="conftest.py", text=FORGE_HOOK),
                   call("create", path="toolz/tests/conftest.py", text=FORGE_HOOK), touch]
    else:
        actions = [call("bash", command=f"printf 'def test_merge_sorted():\\n    pass\\n' >> {test_file}"), touch]
    for action in actions:
        obs, _, terminated, _, info = env.step(action)
        assert not terminated and not info["turn"]["tool_errors"], obs
    obs, reward, terminated, _, info = env.step(call("submit"))
    grading = info["turn"]["grading"]
    assert terminated and reward == 0.0 and not info["outcome"]["success"], (hack, grading)
    assert grading["tests_ran"] and grading["graded_paths"] == ["toolz/itertoolz.py"], grading
    assert grading["f2p_passed"] == 0 and not grading["regressions"] and not grading["tampered"], grading
    assert set(grading["ignored_paths"]) == ({"conftest.py", "toolz/tests/conftest.py"} if hack == "conftest"
                                             else {test_file}), grading


def test_suite_file_with_split_rules(data, tmp_path):
    suite_file = data["root"] / "suite.yaml"
    suite_file.write_text("name: mine\nversion: 1\nenv: agentgym/SWE-v1\nsource: swebench\npath: instances.jsonl\n"
                          "repos: repos\nlayouts:\n  agentgym/toolz: {test_dir: toolz/tests}\n"
                          "splits:\n  test: {repos: [agentgym/toolz]}\n  train: {rest: true}\n")
    suite = load_suite(str(suite_file))
    assert [t.id for t in suite.test] == ["agentgym__toolz-1"] and suite.train == ()
    assert suite.env_id == "agentgym/SWE-v1"
    api = swebench_suite(data["path"], data["repos"], splits={"train": {"ids": ["agentgym__toolz-1"]}})
    assert [t.id for t in api.train] == ["agentgym__toolz-1"]
    with pytest.raises(TaskError, match="Did you mean"):
        swebench_suite(data["path"], data["repos"], splits={"test": {"repos": ["agentgym/toolzz"]}})
    suite_file.write_text("name: mine\nversion: 1\nenv: agentgym/SWE-v1\nsource: swebenc\n")
    with pytest.raises(TaskError, match="swebench"):
        load_suite(str(suite_file))


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("test_patch"), "missing field"),
    (lambda r: r.update(repo="agentgym/nothere"), "no local clone"),
    (lambda r: r.update(base_commit="0123456789abcdef"), "not a commit"),
    (lambda r: r.update(FAIL_TO_PASS="[not json"), "not JSON"),
    (lambda r: r.update(FAIL_TO_PASS=[]), "FAIL_TO_PASS is empty"),
    (lambda r: r.update(PASS_TO_PASS=["merge sorted: two lists"]), "not a test id SWE-bench uses"),
    (lambda r: r.update(patch="just text"), "not a git diff"),
    (lambda r: r.update(package_dir="toolz/tests"), "never takes from a patch"),
])
def test_bad_instances_say_what_to_fix(data, tmp_path, change, message):
    record = json.loads(json.dumps(data["record"]))
    change(record)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + json.dumps(record) + "\n")
    with pytest.raises(TaskError, match=message) as raised:
        load_instances(path, data["repos"])
    assert f"{path}:2" in str(raised.value)


def test_unappliable_test_patch_is_a_clear_error(data, tmp_path):
    record = dict(data["record"], test_patch=data["record"]["test_patch"].replace("def test_merge_sorted", "def x", 1)
                  .replace(" import", " imp0rt"))
    record["test_patch"] = record["test_patch"].replace("\n ", "\n XX", 1)  # a context line that is not in the file
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (instance,) = load_instances(path, data["repos"])
    with pytest.raises(TaskError, match="test_patch does not apply"):
        instance.prepare()


def test_gold_patch_scores_one_on_docker(data):
    """The same instance on the Docker backend (a private dockerd): the gold patch 1.0, nothing submitted 0."""
    from agentgym.tools.sandbox import pool as sandbox_pool

    (task,) = [instance_to_task(i) for i in load_instances(data["path"], data["repos"])]
    with docker_daemon():
        env = SWEEnv(backend="docker", command_timeout_s=20)
        try:
            traj = run_reference_episode(env, task, seed=0)
            assert traj.outcome["success"] and traj.outcome["score"] == 1.0, traj.outcome
            env.reset(options={"task": task})
            assert env.step(call("submit"))[1] == 0.0
        finally:
            env.close()
            for config, pool in list(sandbox_pool._DEFAULT_POOLS.items()):
                if config.backend == "docker":
                    pool.close()
