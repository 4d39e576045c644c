"""SWE-v1: real bugs in real libraries, graded by hidden tests, on the bwrap and Docker backends."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from agentgym.envs.swe.env import OUTCOME_REWARDS, SWEEnv, resolve_repo_path
from agentgym.errors import ConfigError
from agentgym.rollout import run_reference_episode
from agentgym.registration.suites import load_suite
from agentgym.tasks.swe.builder import load_specs
from agentgym.tasks.swe.libraries import LIBRARIES, fetch_library
from agentgym.tasks.swe.mutations import apply_mutation, candidate_mutations
from tests.helpers.dockerd import docker_host_with_pool_cleanup
from tests.envs.swe.test_reward_hacking import FORGE_HOOK


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def smoke():
    return load_suite("swe-smoke")


@pytest.fixture(scope="module")
def env():
    e = SWEEnv(backend="bwrap", command_timeout_s=5)
    yield e
    e.close()


def test_shipped_tasks_cover_five_libraries_with_disjoint_splits():
    specs = load_specs()
    assert len(specs) >= 200
    assert {s.library for s in specs} == set(LIBRARIES)
    functions = {split: {(s.library, s.mutation.file, s.mutation.function) for s in specs if s.split == split}
                 for split in ("train", "test")}
    assert functions["train"] and functions["test"] and not functions["train"] & functions["test"]
    for spec in specs:
        assert spec.fail_to_pass and set(spec.fail_to_pass).isdisjoint(spec.pass_to_pass)
        # Written from test output, not from the diff: no patch and no buggy source line in it.
        assert "diff --git" not in spec.statement and "@@ " not in spec.statement
        if len(spec.mutation.replacement) > 25:
            assert spec.mutation.replacement not in spec.statement, spec.id
        assert all(t.split("::")[0] in spec.hidden_tests for t in spec.fail_to_pass)
    assert len(load_suite("swe-smoke").test) == 10


def test_mutations_are_minimal_text_edits():
    source = "def f(a, b):\n    # keep me\n    if a < b:\n        return a + 1\n    return b\n"
    mutants = candidate_mutations(source, "m.py")
    kinds = {m.kind for m in mutants}
    assert {"compare_flip", "operator_flip", "off_by_one", "invert_condition", "remove_statement"} <= kinds
    for m in mutants:
        buggy = apply_mutation(source, m)
        assert buggy != source and "# keep me" in buggy
        assert sum(a != b for a, b in zip(buggy.splitlines(), source.splitlines())) <= 1


def test_smoke_suite_validates_on_bwrap(smoke):
    env = smoke.make_env(backend="bwrap")
    try:
        for i, task in enumerate(smoke.test):
            traj = run_reference_episode(env, task, seed=i)
            assert traj.outcome["success"] and traj.turns[-1].reward == 1.0, (task.id, traj.outcome)
            assert traj.turns[-1].info["patch"].startswith("diff --git")
            assert traj.turns[-1].info["channels"]["outcome"] == OUTCOME_REWARDS["tests_pass"]
            grading = traj.turns[-1].info["grading"]
            assert grading["regressions"] == [] and grading["ignored_paths"] == []
            assert grading["graded_paths"] == [task.metadata["spec"]["mutation"]["file"]]
            env.reset(options={"task": task})
            _, reward, terminated, _, info = env.step("submit()")
            assert terminated and reward == 0.0 and not info["outcome"]["success"], task.id
            assert info["turn"]["channels"]["outcome"] == OUTCOME_REWARDS["empty_patch"]
    finally:
        env.close()


def test_tools_explore_edit_and_test(env, smoke):
    task = smoke.test[0]
    obs, info = env.reset(options={"task": task})
    assert "fails" in obs and {t["function"]["name"] for t in info["tools"]} == {
        "bash", "view", "str_replace", "create", "run_tests", "submit"}
    listing = env.step('view(".")')[0]
    assert "pyproject.toml" in listing or "setup.cfg" in listing
    assert "42" in env.step(call("bash", command="python -c 'print(6*7)'"))[0]
    assert "killed after 5 s" in env.step('bash("sleep 60")')[0]
    created = env.step('create("notes/new.txt", "hello")')
    assert "Wrote" in created[0]
    assert "hello" in env.step('view("notes/new.txt")')[0]
    assert "occurs 0 times" in env.step('str_replace("notes/new.txt", "absent", "x")')[0]
    spec = load_specs()[0]
    visible = spec.visible_tests[0] if spec.library == task.metadata["library"] else ""
    out = env.step(f'run_tests("{visible}")')[0] if visible else env.step("run_tests()")[0]
    assert "passed" in out or "failed" in out
    for hidden in json.loads(json.dumps(task.metadata["spec"]["hidden_tests"])):
        assert "no such file" in env.step(f'view("{hidden}")')[0]


def test_fuzzed_arguments_stay_inside_the_episode(env, smoke, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("untouched")
    pristine = fetch_library(smoke.test[0].metadata["library"])
    before = tree_digest(pristine)
    env.reset(options={"task": smoke.test[0]})
    for action in (
        f'view("{canary}")', 'view("../../../../etc/shadow")', 'create("../escape.txt", "x")',
        f'create("{tmp_path}/evil.txt", "x")', 'str_replace("/etc/passwd", "root", "evil")',
        'view("a\\x00b")', 'create("bin.dat", "\\x00\\x01\\x02" * 1000)', 'view("bin.dat")',
        'create("big.py", "x" * 300000)', 'str_replace("setup.cfg", "", "x")', 'view("nope.py", 5, 2)',
        'bash("")', 'run_tests("\'unterminated")', 'bash("ln -s / rootlink")', 'view("rootlink/etc/passwd")',
        f'bash("echo pwned > {canary}; touch /opt/agentgym/repo/x; rm -rf --no-preserve-root / 2>/dev/null; echo done")',
    ):
        obs, _, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and not (terminated and info["outcome"]["end_reason"] == "error"), (action, obs)
        if terminated or truncated:
            env.reset(options={"task": smoke.test[0]})
    assert canary.read_text() == "untouched"
    assert not (tmp_path / "evil.txt").exists()
    assert tree_digest(pristine) == before


def test_paths_are_resolved_inside_the_repo():
    assert resolve_repo_path("/work/repo/src/a.py") == "src/a.py"
    assert resolve_repo_path("src/../a.py") == "a.py"
    for bad in ("", "/etc", "../x", "a/../../x", "x" * 5000):
        with pytest.raises(ValueError):
            resolve_repo_path(bad)


def test_truncation_reports_no_submit_outcome(smoke):
    env = SWEEnv(backend="bwrap", max_turns=2)
    try:
        env.reset(options={"task": smoke.test[0]})
        env.step('view(".")')
        _, _, terminated, truncated, info = env.step("garbage without a tool call")
        assert truncated and info["turn"]["channels"]["outcome"] == OUTCOME_REWARDS["no_submit"]
        assert info["turn"]["channels"]["tool_validity"] <= 0
    finally:
        env.close()


def test_bad_settings_say_how_to_fix():
    with pytest.raises(ConfigError, match="backend"):
        SWEEnv(backend="podman")
    with pytest.raises(ConfigError, match="command_timeout_s"):
        SWEEnv(command_timeout_s=0)


@pytest.fixture(scope="module")
def docker_host():
    with docker_host_with_pool_cleanup() as host:
        yield host


def test_smoke_suite_validates_on_docker(smoke, docker_host):
    env = smoke.make_env(backend="docker")
    try:
        # Two tasks: the whole suite is validated on bwrap above; here the container backend proves the same path.
        for i, task in enumerate(smoke.test[:2]):
            traj = run_reference_episode(env, task, seed=i)
            assert traj.outcome["success"], (task.id, traj.outcome)
            env.reset(options={"task": task})
            _, reward, _, _, info = env.step("submit()")
            assert reward == 0.0 and not info["outcome"]["success"]
        env.reset(options={"task": smoke.test[0]})  # grading in a clean container ignores a forging conftest
        env.step(call("create", path="conftest.py", text=FORGE_HOOK))
        _, reward, _, _, info = env.step("submit()")
        assert reward == 0.0 and info["turn"]["grading"]["ignored_paths"] == ["conftest.py"]
        env.reset(options={"task": smoke.test[0]})
        probe = "import socket\nsocket.getaddrinfo('pypi.org', 443)"
        assert "gaierror" in env.step(call("bash", command=f"python -c {shlex.quote(probe)}"))[0]
    finally:
        env.close()
