"""Harbor-format task folders: parsing and validation (fast), and a task written for the test run end to end in
the Docker backend with a private dockerd: image built locally, oracle 1, no-op 0, a planted reward file 0, a
loader preload planted to forge the reward 0 under verifier="snapshot", and a reward.json read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.envs.swe.harbor import HarborEnv, base_images, build_environment_image, harbor_tasks, load_harbor_task
from agentgym.errors import ConfigError, TaskError
from agentgym.rollout import run_reference_episode
from agentgym.registration.suites import load_suite
from tests.helpers.dockerd import docker_host_with_pool_cleanup

TEST_SH = """#!/bin/bash
# The verifier: reward 1 when /app/answer.txt holds the sum of the numbers in /app/data.txt; no answer file ends
# the script before it writes any reward (set -e), so a reward file left from before would be all there is.
set -e
answer=$(cat /app/answer.txt)
if [ "$answer" = "$(( $(tr ' ' '+' < /app/data.txt) ))" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
# test.sh variant that reports through reward.json (with extra named rewards), as Harbor allows.
TEST_SH_JSON = TEST_SH.replace("echo 1 > /logs/verifier/reward.txt",
                               """echo '{"reward": 1.0, "checks_passed": 2}' > /logs/verifier/reward.json""").replace(
                               "echo 0 > /logs/verifier/reward.txt", """echo '{"reward": 0.0}' > /logs/verifier/reward.json""")
# A root agent compiles a library whose destructor writes reward 1 and lists it in /etc/ld.so.preload: in a grading
# container made from its snapshot, every program (bash running test.sh, cat, the verifier's interpreter) would
# load it, and the reward file would say 1 whatever test.sh wrote.
FORGE_PRELOAD = r"""cat > /tmp/forge.c <<'CEOF'
#include <stdio.h>
#include <unistd.h>
__attribute__((destructor)) static void forge(void) {
  if (access("/logs/verifier", W_OK) == 0) {
    FILE *f = fopen("/logs/verifier/reward.txt", "w");
    if (f) { fputs("1\n", f); fclose(f); }
  }
}
CEOF
gcc -shared -fPIC -o /forge.so /tmp/forge.c && echo /forge.so > /etc/ld.so.preload && echo planted-preload"""
SOLVE_SH = 'echo $(( $(tr " " "+" < data.txt) )) > /app/answer.txt\necho "$GREETING" > /app/greeting.txt\n'


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def write_task(root: Path, name: str = "sum-numbers", base: str = "agentgym-sandbox:2", solution: bool = True,
               test_sh: str = TEST_SH) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n\n[metadata]\ndifficulty = "easy"\n\n[verifier]\n'
                                    'timeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n\n[environment]\n'
                                    'build_timeout_sec = 120.0\ncpus = 1\nmemory_mb = 1024\n')
    (task / "instruction.md").write_text("Write the sum of the numbers in /app/data.txt to /app/answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {base}\nWORKDIR /app\nCOPY data.txt /app/data.txt\nENV GREETING=hello-from-the-image\n")
    (task / "environment" / "data.txt").write_text("3 4 5 30\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    if solution:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(SOLVE_SH)
    return task


def test_task_folder_is_parsed(tmp_path):
    task = load_harbor_task(write_task(tmp_path))
    assert task.name == "sum-numbers" and task.instruction.startswith("Write the sum")
    assert (task.verifier_timeout_s, task.build_timeout_s, task.cpus, task.memory_bytes) == (60.0, 120.0, 1.0, 1 << 30)
    assert task.solution is not None and task.config["metadata"]["difficulty"] == "easy"
    (tasks_folder := tmp_path / "more").mkdir()
    write_task(tasks_folder, "b-task", solution=False)
    write_task(tasks_folder, "a-task")
    assert [t.id for t in harbor_tasks(tasks_folder)] == ["a-task", "b-task"]
    assert harbor_tasks(tasks_folder)[0].metadata["harbor"]["path"] == str((tasks_folder / "a-task").resolve())
    older = write_task(tmp_path / "older", "yaml-task")  # task.yaml with the instruction inside (Terminal-Bench 1)
    (older / "task.toml").unlink()
    (older / "instruction.md").unlink()
    (older / "task.yaml").write_text("instruction: |\n  Sum the numbers.\nverifier:\n  timeout_sec: 30\n")
    assert (load_harbor_task(older).instruction, load_harbor_task(older).verifier_timeout_s) == ("Sum the numbers.\n", 30.0)


@pytest.mark.parametrize("breakage, message", [
    (lambda t: (t / "task.toml").unlink(), "no task.toml"),
    (lambda t: (t / "task.toml").write_text("[verifier\n"), "not valid TOML"),
    (lambda t: (t / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n"), "timeout_sec must be a positive"),
    (lambda t: (t / "task.toml").write_text('[environment]\nmemory = "lots"\n'), "memory must look like"),
    (lambda t: (t / "instruction.md").unlink(), "no instruction.md"),
    (lambda t: (t / "environment" / "Dockerfile").unlink(), "no environment/Dockerfile"),
    (lambda t: (t / "tests" / "test.sh").unlink(), "no tests/test.sh"),
])
def test_broken_task_folders_say_what_to_fix(tmp_path, breakage, message):
    task = write_task(tmp_path)
    breakage(task)
    with pytest.raises(TaskError, match=message):
        load_harbor_task(task)


def test_dockerfile_bases_and_suite_file(tmp_path):
    dockerfile = ("FROM --platform=linux/amd64 python:3.11-slim AS build\nRUN true\n"
                  "FROM build\nFROM \\\n  agentgym-sandbox:2\nFROM scratch\n")
    assert base_images(dockerfile) == ["python:3.11-slim", "agentgym-sandbox:2"]
    write_task(tmp_path / "tasks", "one")
    write_task(tmp_path / "tasks", "two")
    suite_file = tmp_path / "harbor.yaml"
    suite_file.write_text("name: mine\nversion: 1\nenv: agentgym/Harbor-v0\n"
                          "entry_point: agentgym.envs.swe.harbor:HarborEnv\nsource: harbor\npath: tasks\n"
                          "splits:\n  train: {names: [one]}\n  test: {rest: true}\n")
    suite = load_suite(str(suite_file))
    assert [t.id for t in suite.train] == ["one"] and [t.id for t in suite.test] == ["two"]
    suite_file.write_text(suite_file.read_text().replace("[one]", "[onw]"))
    with pytest.raises(TaskError, match="Did you mean 'one'"):
        load_suite(str(suite_file))
    with pytest.raises(TaskError, match="no tasks: pass tasks="):
        HarborEnv().reset(seed=0)
    with pytest.raises(ConfigError, match="command_timeout_s"):
        HarborEnv(command_timeout_s=0)


@pytest.fixture(scope="module")
def docker_host():
    with docker_host_with_pool_cleanup() as host:
        yield host


def test_harbor_task_runs_in_docker(docker_host, tmp_path):
    """Oracle 1; no-op 0; a reward file planted by the agent 0; each episode starts from a fresh container."""
    write_task(tmp_path / "tasks")
    suite_file = tmp_path / "harbor.yaml"
    suite_file.write_text("name: mine\nversion: 1\nenv: agentgym/Harbor-v0\n"
                          "entry_point: agentgym.envs.swe.harbor:HarborEnv\n"
                          "source: harbor\npath: tasks\nenv_kwargs: {command_timeout_s: 30}\n")
    suite = load_suite(str(suite_file))
    (task,) = suite.test
    env = suite.make_env()
    try:
        traj = run_reference_episode(env, task, seed=0)
        assert traj.outcome["success"] and traj.outcome["score"] == 1.0, (traj.outcome, traj.turns[-1].info)
        assert traj.turns[-1].info["grading"]["reward"] == 1.0

        obs, _ = env.reset(options={"task": task})
        assert "/app" in obs
        listing = env.step(call("bash", command="pwd; ls; cat answer.txt; echo $GREETING; ls /tests /solution"))[0]
        assert "/app" in listing and "data.txt" in listing and "hello-from-the-image" in listing
        obs, _, terminated, _, info = env.step("no tool call here")  # a model mistake is an observation
        assert not terminated and info["turn"]["kind"] in ("void", "invalid") and "bash" in obs, obs
        assert "answer.txt: No such file" in listing and "cannot access '/tests'" in listing, listing
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0 and not info["outcome"]["success"], info["turn"]["grading"]
        assert "wrote no /logs/verifier/reward.json or reward.txt" in info["turn"]["grading"]["problem"]

        # The agent is root in its container: it plants a reward and its own /tests/test.sh. Grading empties
        # /logs/verifier and mounts the task's tests over /tests, so neither counts.
        env.reset(options={"task": task})
        plant = ("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
                 "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && cat /tests/test.sh")
        assert "echo 1 >" in env.step(call("bash", command=plant))[0]
        _, reward, _, _, info = env.step(call("submit"))
        grading = info["turn"]["grading"]
        assert reward == 0.0 and grading["reward"] is None and "wrote no" in grading["problem"], grading

    finally:
        env.close()
    # A preloaded library planted to run inside the grader's own programs. Harbor's shared mode runs test.sh in
    # the agent's own container, where it is live; verifier="snapshot" grades a fresh container of the final state
    # with the host's loader set-up (an empty ld.so.preload) mounted read-only, so it never loads.
    env = HarborEnv(tasks=[task], command_timeout_s=30, verifier="snapshot")
    try:
        env.reset(options={"task": task})
        planted = env.step(call("bash", command=FORGE_PRELOAD))[0]
        assert "planted-preload" in planted, planted
        live = env.step(call("bash", command="mkdir -p /logs/verifier && true && cat /logs/verifier/reward.txt"))[0]
        assert live.startswith("1"), live  # in the agent's own container the library is live
        env.step(call("bash", command="rm -rf /logs"))
        _, reward, _, _, info = env.step(call("submit"))
        grading = info["turn"]["grading"]
        assert reward == 0.0 and grading["reward"] is None and "wrote no" in grading["problem"], grading
    finally:
        env.close()


def test_reward_json_is_read_with_its_named_rewards(docker_host, tmp_path):
    (task,) = harbor_tasks(write_task(tmp_path, "json-reward", test_sh=TEST_SH_JSON))
    env = HarborEnv(tasks=[task], command_timeout_s=30)
    try:
        traj = run_reference_episode(env, task, seed=0)
        grading = traj.turns[-1].info["grading"]
        assert traj.outcome["success"] and grading["reward"] == 1.0 and grading["rewards"]["checks_passed"] == 2
        env.reset(options={"task": task})
        env.step(call("bash", command="echo 41 > /app/answer.txt"))
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0 and info["turn"]["grading"]["reward"] == 0.0
        assert not info["outcome"]["success"] and info["turn"]["grading"]["problem"] == ""
    finally:
        env.close()


def test_missing_base_image_is_a_clear_error(docker_host, tmp_path):
    task = load_harbor_task(write_task(tmp_path, base="python:3.11-slim"))
    with pytest.raises(TaskError, match=r"python:3.11-slim \(FROM in environment/Dockerfile\) is not in the local "
                                        r"Docker image store and could not be pulled.*docker load -i"):
        build_environment_image(task)
