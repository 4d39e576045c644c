"""SWE-bench's reward rule and test-id forms, episode by episode, next to SWE-bench's own rule on the same outcomes.

SWE-bench calls an instance resolved when every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes
(Jimenez et al., 2024); :func:`swebench_resolved` below is that rule, written from the paper and independent of
the env's code. Each episode is graded once; the env's reward under ``reward="resolved"`` must equal it, and under
``reward="partial"`` the env's fractional score is checked against the numbers it should give.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from agentgym.envs.swe.env import SWEEnv
from agentgym.errors import ConfigError, TaskError
from agentgym.tasks.swe.swebench import instance_to_task, load_instances
from agentgym.tasks.swe.test_ids import id_kind, resolve_outcome
from tests.envs.swe.test_swebench_format import GIT, call, data  # noqa: F401  (the module-scoped fixture)

TEST_FILE = "toolz/tests/test_itertoolz.py"
# Added by the test_patch: test_fixed passes once merge_sorted is fixed, test_unfixed fails whatever the fix.
MORE_TESTS = """

class TestMore:
    def test_fixed(self):
        assert list(merge_sorted([1, 3], [2, 4], key=lambda x: x)) == [1, 2, 3, 4]

    def test_unfixed(self):
        assert merge_sorted is None
"""
GUARDED = [f"{TEST_FILE}::test_{name}" for name in ("first", "second", "last", "rest")]
BREAK_SECOND = ("python -c \"import re, pathlib; p = pathlib.Path('toolz/itertoolz.py'); "
                "p.write_text(p.read_text().replace('    next(seq)\\n    return next(seq)', '    return next(seq)', 1))\"")


def swebench_resolved(f2p_passed: int, f2p_total: int, p2p_failed: int) -> float:
    """SWE-bench's rule: resolved (1) only with all FAIL_TO_PASS passing and no PASS_TO_PASS failing."""
    return 1.0 if f2p_passed == f2p_total and p2p_failed == 0 else 0.0


@pytest.fixture(scope="module")
def rules_data(data, tmp_path_factory):  # noqa: F811
    """Two more instances on the same clone: 1 of 2 FAIL_TO_PASS fixable (ids in the bare and Django forms), and
    one whose PASS_TO_PASS is four tests, one of which the submitted patch breaks."""
    repo = data["repos"] / "agentgym__toolz"
    pristine = data["record"]["test_patch"]
    subprocess.run(["git", "apply"], input=pristine, text=True, cwd=repo, check=True)
    with (repo / TEST_FILE).open("a") as fh:
        fh.write(MORE_TESTS)
    test_patch = subprocess.run([*GIT, "diff", "--", TEST_FILE], cwd=repo, check=True, capture_output=True,
                                text=True).stdout
    subprocess.run([*GIT, "checkout", "-q", "--", "."], cwd=repo, check=True)
    base = dict(data["record"], test_patch=test_patch, version="1.2",
                environment_setup_commit=data["base"])
    half = dict(base, instance_id="agentgym__toolz-half",
                FAIL_TO_PASS=["test_merge_sorted", "test_unfixed (toolz.tests.test_itertoolz.TestMore)"],
                PASS_TO_PASS=GUARDED)
    regress = dict(base, instance_id="agentgym__toolz-regress",
                   FAIL_TO_PASS=[f"{TEST_FILE}::TestMore::test_fixed"], PASS_TO_PASS=GUARDED)
    path = tmp_path_factory.mktemp("rules") / "instances.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (half, regress)))
    return {i.instance_id: i for i in load_instances(path, data["repos"])}


def test_id_forms_resolve_to_pytest_node_ids():
    outcomes = {f"{TEST_FILE}::test_merge_sorted": "passed", f"{TEST_FILE}::TestMore::test_fixed": "passed",
                f"{TEST_FILE}::TestMore::test_unfixed": "failed", "tests/test_p.py::test_x[1-a]": "passed",
                "tests/test_p.py::test_x[2-b]": "failed"}
    assert [id_kind(t) for t in ("a.py::b", "test_b (app.tests.TestA)", "test_b", "not a test id!")] == \
        ["node", "django", "bare", None]
    assert resolve_outcome("test_merge_sorted", outcomes) == "passed"
    assert resolve_outcome("test_fixed (toolz.tests.test_itertoolz.TestMore)", outcomes) == "passed"
    assert resolve_outcome("test_fixed (tests.test_itertoolz.TestMore.test_fixed)", outcomes) == "passed"  # Django 5
    assert resolve_outcome("test_unfixed (toolz.tests.test_itertoolz.TestMore)", outcomes) == "failed"
    assert resolve_outcome("test_fixed (other.module.TestMore)", outcomes) is None  # another module: no match
    assert resolve_outcome("tests/test_p.py::test_x[1-a]", outcomes) == "passed"  # a node id with parameters
    assert resolve_outcome("test_x[1-a]", outcomes) == "passed" and resolve_outcome("test_x", outcomes) == "failed"
    assert resolve_outcome("tests/test_p.py::test_x", outcomes) is None  # node ids match exactly


def test_instances_keep_version_setup_commit_and_every_id_form(rules_data, data):
    half = rules_data["agentgym__toolz-half"]
    assert half.version == "1.2" and half.environment_setup_commit == data["base"]
    # Bare and Django ids name no file: the test_patch's test module runs them.
    assert half.test_args == (*GUARDED, TEST_FILE)
    metadata = instance_to_task(half).metadata["swebench"]
    assert metadata["version"] == "1.2" and metadata["environment_setup_commit"] == data["base"]
    assert "test_merge_sorted" in metadata["FAIL_TO_PASS"]


def test_unknown_setup_commit_and_bad_reward_rule_are_refused(data, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(dict(data["record"], environment_setup_commit="0123456789abcdef")) + "\n")
    with pytest.raises(TaskError, match="environment_setup_commit"):
        load_instances(path, data["repos"])
    path.write_text(json.dumps(dict(data["record"], FAIL_TO_PASS=["not a test id!"])) + "\n")
    with pytest.raises(TaskError, match="not a test id SWE-bench uses"):
        load_instances(path, data["repos"])
    with pytest.raises(ConfigError, match="reward must be one of"):
        SWEEnv(reward="mean")


def _episode(env: SWEEnv, instance, actions: list[str]) -> dict:
    env.reset(options={"task": instance_to_task(instance)})
    for action in actions:
        obs, _, terminated, _, info = env.step(action)
        assert not terminated and not info["turn"]["tool_errors"], obs
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated
    return dict(info["turn"]["grading"], step_reward=reward)


def _gold(instance) -> list[str]:
    return [call("create", path="gold.patch", text=instance.patch),
            call("bash", command="git apply gold.patch && rm gold.patch")]


@pytest.mark.parametrize("rule", ["resolved", "partial", None])
def test_each_rule_against_swebench_on_the_same_outcomes(rules_data, rule):
    env = SWEEnv(backend="bwrap", command_timeout_s=20, reward=rule)
    try:
        half, regress = rules_data["agentgym__toolz-half"], rules_data["agentgym__toolz-regress"]
        # 1 of 2 FAIL_TO_PASS fixed (bare + Django ids): SWE-bench says unresolved.
        g = _episode(env, half, _gold(half))
        assert (g["f2p_passed"], g["f2p_total"], g["regressions"]) == (1, 2, []), g
        reference = swebench_resolved(g["f2p_passed"], g["f2p_total"], len(g["regressions"]))
        assert reference == 0.0 and g["partial_reward"] == 0.5
        assert g["step_reward"] == (0.5 if rule == "partial" else reference), (rule, g)
        assert g["swebench"] == {"version": "1.2", "environment_setup_commit": half.environment_setup_commit}
        # The fix, plus a break of second(): one of four PASS_TO_PASS fails. SWE-bench says unresolved.
        g = _episode(env, regress, [*_gold(regress), call("bash", command=BREAK_SECOND)])
        assert (g["f2p_passed"], g["regressions"]) == (1, [f"{TEST_FILE}::test_second"]), g
        reference = swebench_resolved(g["f2p_passed"], g["f2p_total"], len(g["regressions"]))
        assert reference == 0.0 and g["partial_reward"] == 0.75
        assert g["step_reward"] == (0.75 if rule == "partial" else reference), (rule, g)
        # The gold fix alone: resolved under every rule.
        g = _episode(env, regress, _gold(regress))
        assert swebench_resolved(g["f2p_passed"], g["f2p_total"], len(g["regressions"])) == 1.0
        assert g["step_reward"] == 1.0 and g["resolved"], g
    finally:
        env.close()
