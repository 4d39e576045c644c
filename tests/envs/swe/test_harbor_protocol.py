"""Harbor tasks written as Harbor's documentation and its `harbor task init` template write them, run the way Harbor
runs them: each task's own oracle (solution/solve.sh) must score 1 and doing nothing 0.

Harbor's rules exercised here: test.sh runs in the agent's live container (the default "shared" verifier mode), so
a process the solution left running is still there; `environment_mode = "separate"` starts a fresh container of
the task's environment that gets only /logs/artifacts and the declared artifacts; reward.json is read before
reward.txt and may carry any named rewards; `[verifier] env` reaches test.sh; `[agent] user` and `[verifier] user`
set who runs; test.sh's output is kept in /logs/verifier/test-stdout.txt; the Dockerfile builds `FROM ubuntu:24.04`
(a local stand-in here, since nothing can be pulled) with `RUN` lines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentgym.envs.swe.harbor import HarborEnv, build_environment_image, harbor_tasks, load_harbor_task, read_rewards
from agentgym.errors import TaskError
from agentgym.rollout import run_reference_episode
from tests.envs.swe.harbor_standin import load_standin
from tests.helpers.dockerd import docker_host_with_pool_cleanup

# task.toml as Harbor's task-format page shows it (schema, [task], [metadata], [verifier], [agent], [environment]).
TASK_TOML = """schema_version = "1.1"

[task]
name = "agentgym/{name}"
description = "A task for the protocol tests"
authors = [{{ name = "Test Author", email = "test@example.com" }}]
keywords = ["trivial"]

[metadata]
difficulty_explanation = "Trivial task for demonstration"
category = "programming"

[verifier]
timeout_sec = 60.0
{verifier}
[agent]
timeout_sec = 120.0
{agent}
[environment]
build_timeout_sec = 120.0
cpus = 1
memory_mb = 1024
network_mode = "no-network"
{environment}"""
# environment/Dockerfile as the template starts it, plus the RUN lines a task adds.
DOCKERFILE = "FROM ubuntu:24.04\n\nWORKDIR /app\n\n{run}"
# The custom-verifier test.sh of Harbor's docs: compare an output with an expected file shipped in tests/.
DIFF_TEST_SH = """#!/bin/bash
if diff -q /app/output.txt /tests/expected.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def write_task(root: Path, name: str, *, test_sh: str, solve_sh: str, run: str = "", verifier: str = "",
               agent: str = "", environment: str = "", tests: dict[str, str] | None = None) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(TASK_TOML.format(name=name, verifier=verifier, agent=agent,
                                                     environment=environment))
    (task / "instruction.md").write_text(f"# {name}\n\nDo what the tests check.\n")
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE.format(run=run))
    (task / "tests" / "test.sh").write_text(test_sh)
    for file, text in (tests or {}).items():
        (task / "tests" / file).write_text(text)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    return task


def test_reward_files_follow_harbors_rules():
    assert read_rewards('{"reward": 1.0, "style": 0.5}', "0") == (1.0, {"reward": 1.0, "style": 0.5}, "")
    assert read_rewards('{"correctness": 1}', None) == (1.0, {"correctness": 1.0}, "")  # any single name
    reward, rewards, problem = read_rewards('{"a": 1, "b": 0}', None)
    assert reward is None and rewards == {"a": 1.0, "b": 0.0} and "primary_reward" in problem
    assert read_rewards('{"a": 1, "b": 0}', None, primary="b")[0] == 0.0
    assert read_rewards(None, " 0.25\n") == (0.25, {"reward": 0.25}, "")
    assert "not hold a number" in read_rewards(None, "yes")[2] and "not numbers" in read_rewards('{"a": true}', None)[2]
    assert "wrote no" in read_rewards(None, None)[2]


def test_task_toml_fields_are_read(tmp_path):
    task = load_harbor_task(write_task(
        tmp_path, "fields", test_sh=DIFF_TEST_SH, solve_sh="true\n",
        verifier='env = { API_KEY = "sk-test-123", LEVEL = 3 }\nuser = "root"\nenvironment_mode = "separate"\n',
        agent='user = "agent"\n', environment='workdir = "/srv"\ndocker_image = "some-org/some-name:some-tag"\n'))
    assert task.verifier_env == {"API_KEY": "sk-test-123", "LEVEL": "3"} and task.verifier_user == "root"
    assert (task.agent_user, task.workdir, task.docker_image) == ("agent", "/srv", "some-org/some-name:some-tag")
    assert (task.verifier_mode, task.network, task.verifier_network) == ("separate", "none", "none")
    bad = write_task(tmp_path, "bad", test_sh=DIFF_TEST_SH, solve_sh="true\n",
                     verifier='[verifier.environment]\ndocker_image = "x"\n')
    with pytest.raises(TaskError, match="verifier.environment"):
        load_harbor_task(bad)


@pytest.fixture(scope="module")
def docker_host():
    with docker_host_with_pool_cleanup() as host:
        load_standin()
        yield host


# A background process the task needs at test time: solve.sh starts a heartbeat writer and returns.
# The heartbeat is written to a temporary file and renamed, so test.sh never reads it half-written (empty).
HEARTBEAT_SOLVE = ("nohup bash -c 'while sleep 0.2; do date +%s%N > /app/.beat && mv -f /app/.beat /app/heartbeat; "
                   "done' > /dev/null 2>&1 &\n"
                   'echo "$GREETING" > /app/greeting.txt\n')
HEARTBEAT_TEST = """#!/bin/bash
echo "verifier running as uid $(id -u) in $(pwd)"
a=$(cat /app/heartbeat 2>/dev/null); sleep 2; b=$(cat /app/heartbeat 2>/dev/null)
alive=0; [ -n "$a" ] && [ "$a" != "$b" ] && alive=1
greeting=0; [ "$(cat /app/greeting.txt 2>/dev/null)" = "$EXPECTED_GREETING" ] && greeting=1
owner=$(stat -c %u /app/greeting.txt 2>/dev/null || echo none)
echo "{\\"reward\\": $((alive * greeting)), \\"alive\\": $alive, \\"greeting\\": $greeting, \\"owner\\": ${owner/none/-1}, \\"verifier_uid\\": $(id -u)}" > /logs/verifier/reward.json
echo 0 > /logs/verifier/reward.txt
"""
AGENT_USER = ("RUN echo 'agent:x:1000:1000::/home/agent:/bin/bash' >> /etc/passwd && echo 'agent:x:1000:' >> "
              "/etc/group && mkdir -p /home/agent && chown 1000:1000 /home/agent /app\nENV GREETING=hello\n")


def test_oracles_of_tasks_written_to_harbors_docs_score_one(docker_host, tmp_path):
    diff = write_task(tmp_path, "diff-output", test_sh=DIFF_TEST_SH, tests={"expected.txt": "42\n"},
                      run='RUN mkdir -p /app/data && echo "3 4 5 30" > /app/data/numbers.txt\n',
                      solve_sh="echo $(( $(tr ' ' '+' < /app/data/numbers.txt) )) > /app/output.txt\n")
    heartbeat = write_task(tmp_path, "heartbeat", test_sh=HEARTBEAT_TEST, solve_sh=HEARTBEAT_SOLVE, run=AGENT_USER,
                           verifier='env = { EXPECTED_GREETING = "hello" }\n', agent='user = "agent"\n')
    env = HarborEnv(tasks=harbor_tasks(tmp_path), command_timeout_s=30)
    try:
        (diff_task,) = harbor_tasks(diff)
        traj = run_reference_episode(env, diff_task, seed=0)
        grading = traj.turns[-1].info["grading"]
        assert traj.outcome["success"] and traj.outcome["score"] == 1.0, grading
        assert grading["mode"] == "shared" and grading["rewards"] == {"reward": 1.0}
        env.reset(options={"task": diff_task})
        _, reward, terminated, _, info = env.step(call("submit"))  # no-op agent
        assert terminated and reward == 0.0 and info["turn"]["grading"]["reward"] == 0.0

        (beat_task,) = harbor_tasks(heartbeat)
        traj = run_reference_episode(env, beat_task, seed=0)
        grading = traj.turns[-1].info["grading"]
        # The heartbeat is alive at test time (shared mode), [verifier] env reached test.sh, reward.json won over
        # the reward.txt of 0, the agent ran as "agent" (uid 1000) and the verifier as root, in /app.
        assert traj.outcome["success"] and grading["reward"] == 1.0, grading
        assert grading["rewards"] == {"reward": 1.0, "alive": 1.0, "greeting": 1.0, "owner": 1000.0,
                                      "verifier_uid": 0.0}, grading
        assert "verifier running as uid 0 in /app" in grading["log"], grading  # from /logs/verifier/test-stdout.txt
        obs, _ = env.reset(options={"task": beat_task})
        assert "uid=1000(agent)" in env.step(call("bash", command="id"))[0]
        _, reward, _, _, info = env.step(call("submit"))
        assert reward == 0.0 and info["turn"]["grading"]["rewards"]["alive"] == 0.0
    finally:
        env.close()

    # The same heartbeat task graded the hardened way (a snapshot in a fresh container) loses its process: 0.
    hardened = HarborEnv(command_timeout_s=30, verifier="snapshot")
    try:
        traj = run_reference_episode(hardened, beat_task, seed=0)
        grading = traj.turns[-1].info["grading"]
        assert grading["mode"] == "snapshot" and grading["rewards"]["alive"] == 0.0 and grading["reward"] == 0.0
    finally:
        hardened.close()


def test_separate_verifier_gets_only_artifacts(docker_host, tmp_path):
    test_sh = """#!/bin/bash
out=0; [ "$(cat /app/out.txt 2>/dev/null)" = "result" ] && out=1
logs=0; [ -f /logs/artifacts/run.log ] && logs=1
other=0; [ -e /app/scratch.txt ] && other=1
echo "{\\"reward\\": $((out * logs * (1 - other))), \\"out\\": $out, \\"logs\\": $logs, \\"saw_scratch\\": $other}" > /logs/verifier/reward.json
"""
    solve = "echo result > /app/out.txt\necho scratch > /app/scratch.txt\nmkdir -p /logs/artifacts && echo done > /logs/artifacts/run.log\n"
    task_dir = write_task(tmp_path, "separate", test_sh=test_sh, solve_sh=solve,
                          verifier='environment_mode = "separate"\n')
    (task_dir / "task.toml").write_text('artifacts = ["/app/out.txt"]\n' + (task_dir / "task.toml").read_text())
    (task,) = harbor_tasks(task_dir)
    env = HarborEnv(tasks=[task], command_timeout_s=30)
    try:
        traj = run_reference_episode(env, task, seed=0)
        grading = traj.turns[-1].info["grading"]
        assert grading["mode"] == "separate" and traj.outcome["success"], grading
        assert grading["rewards"] == {"reward": 1.0, "out": 1.0, "logs": 1.0, "saw_scratch": 0.0}, grading
    finally:
        env.close()


def test_a_child_left_running_does_not_hold_the_verifier(docker_host, tmp_path):
    test_sh = "#!/bin/bash\nsleep 300 &\necho 1 > /logs/verifier/reward.txt\n"
    (task,) = harbor_tasks(write_task(tmp_path, "child", test_sh=test_sh, solve_sh="true\n"))
    env = HarborEnv(tasks=[task], command_timeout_s=30)
    try:
        env.reset(options={"task": task})
        start = time.monotonic()
        _, reward, _, _, info = env.step(call("submit"))
        elapsed = time.monotonic() - start
        assert reward == 1.0 and info["outcome"]["success"] and not info["turn"]["grading"]["problem"], info
        assert elapsed < 40, elapsed  # [verifier] timeout_sec is 60: it returned when test.sh did
    finally:
        env.close()


def test_images_network_and_users_say_what_to_do(docker_host, tmp_path):
    missing = load_harbor_task(write_task(tmp_path, "old-base", test_sh=DIFF_TEST_SH, solve_sh="true\n"))
    (Path(missing.path) / "environment" / "Dockerfile").write_text("FROM ubuntu:22.04\nWORKDIR /app\n")
    with pytest.raises(TaskError, match=r"ubuntu:22.04 \(FROM in environment/Dockerfile\) is not in the local.*could not be pulled.*docker load -i.*"
                                        r"docker tag LOCAL_IMAGE ubuntu:22.04"):
        build_environment_image(load_harbor_task(missing.path))
    online = write_task(tmp_path, "online", test_sh=DIFF_TEST_SH, solve_sh="true\n")
    (online / "task.toml").write_text((online / "task.toml").read_text().replace('"no-network"', '"public"'))
    (task,) = harbor_tasks(online)
    env = HarborEnv(tasks=[task], command_timeout_s=30)
    try:
        with pytest.raises(TaskError, match="asks for internet access.*internet_network=.*allow_offline=True"):
            env.reset(options={"task": task})
    finally:
        env.close()
    nobody = write_task(tmp_path, "no-such-user", test_sh=DIFF_TEST_SH, solve_sh="true\n", agent='user = "ghost"\n')
    (task,) = harbor_tasks(nobody)
    env = HarborEnv(tasks=[task], command_timeout_s=30)
    try:
        with pytest.raises(TaskError, match="user 'ghost' is not in"):
            env.reset(options={"task": task})
    finally:
        env.close()


# Whether the container has a network interface besides loopback, as the agent's solve.sh and the verifier see it.
NETWORK_SOLVE = "n=0; [ -e /sys/class/net/eth0 ] && n=1; echo $n > /app/agent_net.txt\n"
NETWORK_TEST = """#!/bin/bash
v=0; [ -e /sys/class/net/eth0 ] && v=1
a=$(cat /app/agent_net.txt 2>/dev/null || echo 0)
echo "{\\"reward\\": $a, \\"agent_net\\": $a, \\"verifier_net\\": $v}" > /logs/verifier/reward.json
"""


def test_tasks_that_ask_for_the_internet_get_the_named_network_and_the_others_none(docker_host, tmp_path):
    """``internet_network`` gives a task's containers a network exactly where its task.toml allows one."""
    import subprocess

    # An internal network: containers get an interface, the host's routes and firewall stay as they are.
    subprocess.run(["docker", "network", "create", "--internal", "agentgym-test-net"], check=True, capture_output=True)
    online = write_task(tmp_path, "online", test_sh=NETWORK_TEST, solve_sh=NETWORK_SOLVE)
    (online / "task.toml").write_text((online / "task.toml").read_text().replace('"no-network"', '"public"'))
    separate = write_task(tmp_path, "online-separate", test_sh=NETWORK_TEST, solve_sh=NETWORK_SOLVE,
                          verifier='environment_mode = "separate"\n')
    (separate / "task.toml").write_text('artifacts = ["/app/agent_net.txt"]\n' + (separate / "task.toml").read_text()
                                        .replace('"no-network"', '"public"'))
    offline = write_task(tmp_path, "offline", test_sh=NETWORK_TEST, solve_sh=NETWORK_SOLVE)
    env = HarborEnv(command_timeout_s=30, internet_network="agentgym-test-net")
    try:
        rewards = {}
        for folder in (online, separate, offline):
            (task,) = harbor_tasks(folder)
            grading = run_reference_episode(env, task, seed=0).turns[-1].info["grading"]
            rewards[folder.name] = grading["rewards"]
    finally:
        env.close()
    assert rewards == {"online": {"reward": 1.0, "agent_net": 1.0, "verifier_net": 1.0},
                       "online-separate": {"reward": 1.0, "agent_net": 1.0, "verifier_net": 1.0},
                       "offline": {"reward": 0.0, "agent_net": 0.0, "verifier_net": 0.0}}, rewards

    (task,) = harbor_tasks(online)
    missing = HarborEnv(tasks=[task], command_timeout_s=30, internet_network="bridge")  # --bridge=none: no 'bridge'
    try:
        with pytest.raises(TaskError, match="has no network 'bridge'.*docker network create bridge"):
            missing.reset(options={"task": task})
    finally:
        missing.close()
    from agentgym.errors import ConfigError

    with pytest.raises(ConfigError, match="not both"):
        HarborEnv(tasks=[task], internet_network="bridge", allow_offline=True)
    with pytest.raises(ConfigError, match="Docker network name"):
        HarborEnv(tasks=[task], internet_network="none")
