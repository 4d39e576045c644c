"""Harbor-format task directories, run the way Harbor runs them, in the Docker sandbox backend.

A Harbor task (the format of Harbor / Terminal-Bench 2) is a folder::

    my-task/
      task.toml            # [verifier] timeout_sec / env / user / environment_mode, [agent] user, [environment] ...
      instruction.md       # what the agent is asked to do
      environment/         # build context; environment/Dockerfile is the agent's container
      tests/test.sh        # the verifier: writes /logs/verifier/reward.json (named rewards) or reward.txt
      solution/solve.sh    # optional reference solution (the oracle)

``HarborEnv`` builds ``environment/`` with ``docker build`` once per content hash (or uses ``[environment]
docker_image``); a ``FROM`` image that is not local is pulled, and where that fails the error says how to provide
it (``docker load -i``, ``docker tag``). The agent gets ``bash`` and ``submit`` in a fresh container of the image
per episode, as ``[agent] user`` (default root), in ``[environment] workdir`` or the image's ``WORKDIR``. Containers
run with ``--network none`` unless ``internet_network`` names a Docker network (``"bridge"``: Docker's default, the
host's internet through NAT): then tasks that ask for internet access (``allow_internet = true`` or a
``network_mode`` other than ``"no-network"``), and tasks that leave it unset (Harbor's default allows internet),
get that network for the agent's container and, in ``"separate"`` mode, the verifier's, each as the task's settings
say. Without it a task that asks for internet access is refused at reset with what to change
(``allow_offline=True`` runs it offline anyway), and a daemon without the named network (``dockerd --bridge=none``
has no ``bridge``) gets an error naming the network and how to create one.

Grading after ``submit`` follows ``[verifier] environment_mode``, as in Harbor:

* ``"shared"`` (the default): test.sh runs in the agent's *live* container, so processes the agent (or the
  oracle) started are still running. ``/logs/verifier`` is emptied first (a planted reward file does not count)
  and ``/tests`` is replaced by a copy of the task's ``tests/``;
* ``"separate"``: a fresh container of the task's environment image, which gets only ``/logs/artifacts`` and the
  task's top-level ``artifacts`` paths from the agent's container, and ``tests/`` at ``/tests``.

test.sh runs as ``[verifier] user`` (default root) with ``[verifier] env`` added to its environment, from the working
directory; its output goes to ``/logs/verifier/test-stdout.txt`` (``info["turn"]["grading"]["log"]`` shows its
end). When it returns its process group is killed, so a child it left running cannot hold the verifier until the
timeout, and so is every other process the verifier's user may signal before the reward files are read.
``reward.json`` is read first (any named numeric rewards; the primary one is ``primary_reward``, else ``reward``,
else the only one), then ``reward.txt``; success is primary reward >= 1. The oracle
(:meth:`HarborEnv.reference_solver`) copies ``solution/`` to ``/solution`` and runs ``solve.sh`` with ``[solution]
env``, as Harbor does.

``verifier="snapshot"`` is agentgym's hardened alternative for training against a policy that may attack its
grader: test.sh runs in a fresh container of the ``docker commit``-ed final state, with ``tests/`` mounted read-only
at ``/tests`` and the host's dynamic loader set-up read-only over the snapshot's (``/lib``, ``/lib64``, ``/bin``,
``/sbin``, ``/etc/ld.so.cache``, ``/etc/ld.so.conf*``, and an empty ``/etc/ld.so.preload``), as ``/usr`` and Python
always are, so a root agent that wrote an ``ld.so.preload`` or swapped a loader cannot run code inside the verifier's
own processes. Processes the agent started are gone there, so tasks that need one score lower than under Harbor.

Honest limit: in Harbor's shared mode the agent's processes run next to test.sh and, as root, could write the reward
file themselves while it runs; and in every mode the tests check the state the agent left, so anything of the
agent's that test.sh executes (its program, a ``conftest.py`` pytest picks up in the agent's working directory) runs
with the verifier's rights. Task authors should run the agent's program as an unprivileged user and point pytest at
``/tests`` (``pytest /tests --rootdir /tests -p no:cacheprovider``).

The Docker base image the repository builds, ``agentgym-sandbox:2``, is an empty root onto which the host's
``/usr`` and Python are mounted at run time; a Dockerfile ``FROM`` it can ``COPY``, ``ENV`` and ``WORKDIR`` but
not ``RUN`` (there is no shell in the image at build time). Suite file::

    name: my-harbor
    version: 1
    env: agentgym/Harbor-v0
    entry_point: agentgym.envs.swe.harbor:HarborEnv
    source: harbor
    path: tasks                 # a folder of task folders (or one task folder), relative to the suite file
    splits:                     # optional; default: every task in "test"
      train: {names: [a, b]}
      test: {rest: true}
"""

from __future__ import annotations

import base64
import json
import logging
import os
import posixpath
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, EnvCrashed, TaskError
from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

from agentgym.envs.swe.harbor_images import (
    base_images,
    build_environment_image,
    image_config,
    python_reachable_image,
    require_docker_network,
    resolve_user,
    run_docker,
)
from agentgym.envs.swe.harbor_tasks import (
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_VERIFIER_TIMEOUT_S,
    HarborTask,
    harbor_tasks,
    load_harbor_task,
    suite_source,
    task_to_agentgym,
)

__all__ = [
    "base_images", "build_environment_image", "DEFAULT_BUILD_TIMEOUT_S", "DEFAULT_VERIFIER_TIMEOUT_S",
    "harbor_tasks", "HarborEnv", "HarborTask", "load_harbor_task", "MAX_COMMAND_CHARS", "read_rewards", "RESULT_MARK",
    "suite_source", "task_to_agentgym", "trusted_runtime_mounts", "VERIFIER_CHOICES"
]

logger = logging.getLogger(__name__)
RESULT_MARK = "@@agentgym-harbor@@"
VERIFIER_CHOICES = ("task", "snapshot")
MAX_COMMAND_CHARS = 200_000


# ---- the env --------------------------------------------------------------------------------------------------

_BASH_CODE = '''
import os, signal, subprocess
_p = subprocess.Popen(["bash", "-c", {command!r}], cwd={cwd!r}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      stdin=subprocess.DEVNULL, start_new_session=True)
try:
    _out, _ = _p.communicate(timeout={timeout!r})
    _status = "exit code " + str(_p.returncode)
except subprocess.TimeoutExpired:
    os.killpg(_p.pid, signal.SIGKILL)
    _out, _ = _p.communicate()
    _status = "killed after {timeout:g} s (timeout)"
print(_out.decode("utf-8", "replace"), end="")
print("\\n[" + _status + "]")
'''

# Run as root (docker exec -u 0:0) before test.sh: /logs/verifier emptied (a reward file the agent planted must not
# count) and left writable for whichever user the verifier runs as; /tests removed, so the copy of the task's own
# tests/ that follows is all there is; the directories the artifacts go to made.
_PREPARE_CODE = """
import json, os, shutil, sys
C = json.loads(sys.argv[1])
def remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
for path in ("/logs", "/logs/verifier"):
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
        os.unlink(path)
os.makedirs("/logs/verifier", exist_ok=True)
for name in os.listdir("/logs/verifier"):
    remove(os.path.join("/logs/verifier", name))
os.chmod("/logs", 0o755)
os.chmod("/logs/verifier", 0o777)
if C["tests"]:
    remove("/tests")
for folder in C["folders"]:
    os.makedirs(folder, exist_ok=True)
print("left:" + json.dumps(os.listdir("/logs/verifier")))
"""

# Run as the verifier's user after the tests are in place. test.sh's output goes to /logs/verifier/test-stdout.txt (as
# Harbor keeps it), not to a pipe, so a process test.sh leaves running cannot hold the verifier open; once test.sh
# returns, its process group is killed, then every other process this user may signal (nothing may write the reward
# after test.sh is done), and the reward files are read back.
_VERIFY_CODE = """
import base64, json, os, signal, subprocess, sys
C = json.loads(sys.argv[1])
reply = {"problem": ""}
env = dict(os.environ)
env.update(C["env"])
out = open("/logs/verifier/test-stdout.txt", "wb")
cwd = C["cwd"] if os.path.isdir(C["cwd"]) else "/"
proc = subprocess.Popen(["bash", "/tests/test.sh"], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True, env=env)
try:
    reply["exit_code"] = proc.wait(timeout=C["timeout"])
except subprocess.TimeoutExpired:
    reply["problem"] = "tests/test.sh timed out after %g s" % C["timeout"]
try:
    os.killpg(proc.pid, signal.SIGKILL)
except OSError:
    pass
proc.wait()
out.close()
keep, pid = set(), os.getpid()
while pid > 0 and pid not in keep:
    keep.add(pid)
    try:
        pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in keep and int(name) != 1:
        try:
            os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass
def text(name, limit):
    path = os.path.join("/logs/verifier", name)
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    with open(path, "rb") as fh:
        return fh.read(limit).decode("utf-8", "replace")
reply["reward_json"] = text("reward.json", 1 << 16)
reply["reward_txt"] = text("reward.txt", 1 << 12)
reply["log"] = (text("test-stdout.txt", 1 << 22) or "")[-3000:]
print(C["mark"] + base64.b64encode(json.dumps(reply).encode()).decode())
"""


def read_rewards(reward_json: str | None, reward_txt: str | None,
                 primary: str | None = None) -> tuple[float | None, dict[str, float], str]:
    """The reward a verifier wrote: ``(primary reward, all named rewards, problem)``.

    ``/logs/verifier/reward.json`` is read first: an object of named numeric rewards (any names). The primary
    reward, the one the episode is paid, is ``primary`` when given, else the ``reward`` key, else the only key;
    several keys without ``reward`` are a problem that says so (Harbor's own mean metric also refuses a reward
    dictionary with more than one key). Without reward.json, ``reward.txt`` holds one number, named ``reward``.
    """
    if reward_json is not None:
        try:
            data = json.loads(reward_json)
        except ValueError as exc:
            return None, {}, f"reward.json is not JSON ({exc})"
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            data = {"reward": data}
        if not isinstance(data, dict) or not data:
            return None, {}, f"reward.json must be an object of named numeric rewards, got {reward_json[:100]!r}"
        bad = [k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            return None, {}, f"reward.json: {bad[:5]} are not numbers"
        rewards = {str(k): float(v) for k, v in data.items()}
        if primary is not None:
            if primary not in rewards:
                return None, rewards, f"reward.json has no {primary!r} (the primary reward); it names {sorted(rewards)}"
            return rewards[primary], rewards, ""
        if "reward" in rewards:
            return rewards["reward"], rewards, ""
        if len(rewards) == 1:
            return next(iter(rewards.values())), rewards, ""
        return None, rewards, (f"reward.json names {sorted(rewards)} and none is 'reward'; say which is the primary "
                               "reward with HarborEnv(primary_reward=NAME)")
    if reward_txt is not None:
        try:
            value = float(reward_txt.strip())
        except ValueError:
            return None, {}, "reward.txt does not hold a number: " + repr(reward_txt.strip()[:100])
        return value, {"reward": value}, ""
    return None, {}, "tests/test.sh wrote no /logs/verifier/reward.json or reward.txt"


# Paths the dynamic loader reads before any program runs. The host's copies (or an empty preload list) are mounted
# read-only over the snapshot's in the grading container; /usr and the Python installation always are.
_LOADER_PATHS = ("/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
                 "/etc/ld.so.conf.d")


def trusted_runtime_mounts() -> tuple[tuple[str, str], ...]:
    """Read-only (host path, container path) mounts that keep the agent's files out of the grader's own processes.

    A root agent can write ``/etc/ld.so.preload`` or point ``/lib64`` at its own loader in its container; the
    snapshot keeps both, and every dynamically linked program of the grading container (``bash``, Python) would
    load the agent's code and could write any reward. Mounting the host's loader paths over them closes that.
    """
    mounts = [("/dev/null", "/etc/ld.so.preload")]
    for path in _LOADER_PATHS:
        if os.path.exists(path):  # a dangling link is left alone
            mounts.append((os.path.realpath(path), path))
    return tuple(mounts)


def _hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class HarborEnv(AgentEnv):
    """Do a Harbor-format task in a container of its environment; graded by its own tests/test.sh afterwards.

    Not in the built-in catalogue (it needs a Docker daemon): a suite file registers it with
    ``entry_point: agentgym.envs.swe.harbor:HarborEnv`` (see the module docstring), or construct it directly.

    Args:
        tasks: Tasks to draw from (:func:`harbor_tasks`).
        path: A Harbor task folder, or a folder of them, when ``tasks`` is not given. With neither, every reset
            must name its task (``options={"task": ...}``), as a suite's rollouts and ``validate()`` do.
        max_turns: Tool-using turns before truncation (no submit: reward 0, nothing is graded).
        command_timeout_s: Wall-clock limit of one ``bash`` command.
        memory_bytes: Container memory when the task's task.toml names none.
        max_output_chars: Tool output beyond this is cut in the middle.
        verifier: ``"task"``: grade as the task's ``[verifier] environment_mode`` says (Harbor's rules: results
            comparable with Harbor's); ``"snapshot"``: grade a snapshot of the final state in a fresh, hardened
            container (see the module docstring).
        primary_reward: Which of reward.json's named rewards the episode is paid (default: ``reward``, or the
            only one).
        allow_offline: Run tasks that ask for internet access without it (default: refuse them at reset).
        internet_network: The Docker network given to containers whose task allows internet access (``"bridge"``
            for Docker's default network); ``None`` (the default) keeps every container off the network.
        render_mode: ``"ansi"`` or ``None``.
    """

    description: ClassVar[str] = "Do a Harbor-format task in its Docker environment (bash, submit)."
    native_format_hint: ClassVar[str] = 'Tools may also be called as functions, e.g. bash("ls") or submit().'

    def __init__(self, *, tasks: Sequence[Task] | None = None, path: str | None = None, max_turns: int = 30,
                 command_timeout_s: float = 120.0, memory_bytes: int = 2048 << 20, max_output_chars: int = 6000,
                 max_action_chars: int = 400_000, verifier: str = "task", primary_reward: str | None = None,
                 allow_offline: bool = False, internet_network: str | None = None,
                 render_mode: str | None = None) -> None:
        if verifier not in VERIFIER_CHOICES:
            raise ConfigError(f"verifier must be one of {VERIFIER_CHOICES}, got {verifier!r}: 'task' runs each task "
                              "the way Harbor does (its [verifier] environment_mode), 'snapshot' grades a snapshot "
                              "of the agent's final state in a fresh, hardened container.")
        if primary_reward is not None and (not isinstance(primary_reward, str) or not primary_reward):
            raise ConfigError(f"primary_reward must be a reward name from reward.json, got {primary_reward!r}.")
        self.verifier = verifier
        self.primary_reward = primary_reward
        self.allow_offline = bool(allow_offline)
        if internet_network is not None and (not isinstance(internet_network, str) or internet_network == "none"
                                             or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", internet_network)):
            raise ConfigError(f"internet_network must be a Docker network name such as 'bridge' (or None for no "
                              f"network), got {internet_network!r}.")
        if internet_network is not None and allow_offline:
            raise ConfigError("Pass internet_network (give tasks that ask for it the network) or allow_offline (run "
                              "them without), not both.")
        self.internet_network = internet_network
        self._image = ""
        if not isinstance(command_timeout_s, (int, float)) or command_timeout_s <= 0:
            raise ConfigError(f"command_timeout_s must be a positive number of seconds, got {command_timeout_s!r}.")
        if not isinstance(max_output_chars, int) or max_output_chars < 200:
            raise ConfigError(f"max_output_chars must be an integer >= 200, got {max_output_chars!r}.")
        if tasks is None and path is not None:
            tasks = harbor_tasks(str(path))
        self.command_timeout_s = float(command_timeout_s)
        self.memory_bytes = int(memory_bytes)
        self.max_output_chars = max_output_chars
        self._harbor: HarborTask | None = None
        self._session: Any = None
        self._workdir = "/"
        self._grading: dict[str, Any] | None = None
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=4,
                         render_mode=render_mode)

    # ---- sandbox ---------------------------------------------------------------------------------------------
    def _network(self, setting: str) -> str:
        """The Docker network for a container whose task's network setting is ``setting`` (module docstring)."""
        return self.internet_network if self.internet_network is not None and setting != "none" else "none"

    def _config(self, image: str, mounts: tuple[tuple[str, str], ...] = (), user: str = "0:0",
                network: str = "none") -> Any:
        from agentgym.tools.sandbox import SandboxConfig, SandboxLimits

        task = self._harbor
        assert task is not None
        wall = max(self.command_timeout_s, task.verifier_timeout_s) + 60
        limits = SandboxLimits(wall_timeout_s=wall, cpu_timeout_s=wall, episode_cpu_s=int(4 * wall + 3600),
                               memory_bytes=task.memory_bytes or self.memory_bytes, workdir_bytes=256 << 20,
                               file_size_bytes=1 << 30, pids=256, open_files=1024,
                               address_space_bytes=16 << 30, cpus=task.cpus or 1.0)
        return SandboxConfig(backend="docker", limits=limits, preload=(), max_workers=8, docker_image=image,
                             mounts=mounts, docker_user=user, docker_writable_root=True, start_timeout_s=60.0,
                             docker_network=network)

    def _run(self, code: str, timeout_s: float, session: Any = None) -> str:
        from agentgym.tools.sandbox import SandboxError

        session = session or self._session
        try:
            result = session.run(code, timeout_s=timeout_s + 30, cpu_s=timeout_s + 30, max_output=4 << 20)
        except SandboxError as exc:
            raise EnvCrashed(f"the Docker sandbox failed: {exc}") from exc
        if result.state_reset:  # the container's processes died: its state may be gone
            raise EnvCrashed(f"the container lost the episode's state ({result.status}): {result.stderr[-300:]}")
        if result.status != "ok":
            raise EnvCrashed(f"a sandbox call failed ({result.status}): {result.stderr.strip()[-300:]}")
        return result.stdout

    def _cap(self, text: str) -> str:
        limit = self.max_output_chars
        if len(text) <= limit:
            return text
        head = limit * 2 // 3
        return f"{text[:head]}\n...[{len(text) - limit} characters cut]...\n{text[-(limit - head):]}"

    # ---- tools -----------------------------------------------------------------------------------------------
    @tool
    def bash(self, command: str) -> ToolResult:
        """Run a bash command in the task's container (no network; time-limited).

        Args:
            command: A bash command line, run from the container's working directory.
        """
        if not command.strip():
            return ToolResult.error("Error: the command is empty; pass a bash command such as 'ls'.")
        if len(command) > MAX_COMMAND_CHARS:
            return ToolResult.error(f"Error: the command is longer than {MAX_COMMAND_CHARS} characters.")
        code = _BASH_CODE.format(command=command, cwd=self._workdir, timeout=self.command_timeout_s)
        return ToolResult(self._cap(self._run(code, self.command_timeout_s)))

    @tool
    def submit(self) -> ToolResult:
        """Say you are done: the task's tests check the container's state and the episode ends."""
        grading = self._verify()
        self._grading = grading
        reward = grading["reward"] if grading["reward"] is not None else 0.0
        success = grading["reward"] is not None and grading["reward"] >= 1.0 and not grading["problem"]
        self.add_reward("tests", reward)
        self.mark_answer()
        self.finish(success=success, score=reward, reason="solved" if success else "answered")
        message = f"Submitted. The task's tests gave reward {reward:g}."
        if grading["problem"]:
            message += f" Problem: {grading['problem']}."
        return ToolResult(message)

    def _exec(self, container: str, user: str, code: str, config: Mapping[str, Any], timeout_s: float) -> str:
        """Run ``code`` with the host's Python (mounted in every container) in ``container`` as ``user``."""
        import sys

        done = run_docker("exec", "-u", user, "-w", "/", container, sys.executable, "-I", "-c", code,
                          json.dumps(dict(config)), timeout=timeout_s + 60)
        if done.returncode != 0:
            raise EnvCrashed(f"docker exec in the grading container failed: "
                             f"{done.stderr.decode(errors='replace').strip()[-300:]}")
        return done.stdout.decode(errors="replace")

    def _run_tests(self, container: str, user: str, mark: str, *, copy_tests: bool,
                   folders: Sequence[str] = ()) -> str:
        """Prepare ``container`` (as root), put the task's tests/ at /tests, run test.sh as ``user``."""
        task = self._harbor
        assert task is not None
        left = self._exec(container, "0:0", _PREPARE_CODE, {"tests": copy_tests, "folders": list(folders)}, 60)
        if not left.strip().endswith("left:[]"):
            return json.dumps({"problem": "/logs/verifier could not be emptied"})
        if copy_tests:
            copied = run_docker("cp", str(task.tests), f"{container}:/tests", timeout=300)
            if copied.returncode != 0:
                raise EnvCrashed(f"copying tests/ into the container failed: "
                                 f"{copied.stderr.decode(errors='replace').strip()[-300:]}")
        config = {"cwd": self._workdir, "timeout": task.verifier_timeout_s, "env": dict(task.verifier_env),
                  "mark": mark}
        return self._exec(container, user, _VERIFY_CODE, config, task.verifier_timeout_s)

    def _copy_artifacts(self, source: str, target: str) -> list[str]:
        """Harbor's separate verifier gets /logs/artifacts and the task's declared artifacts, nothing else."""
        task = self._harbor
        assert task is not None
        missing = []
        for path in ("/logs/artifacts", *task.artifacts):
            packed = run_docker("cp", f"{source}:{path}", "-", timeout=300)
            if packed.returncode != 0:
                missing.append(path)
                continue
            unpacked = run_docker("cp", "-", f"{target}:{posixpath.dirname(path.rstrip('/')) or '/'}", timeout=300,
                                  stdin=packed.stdout)
            if unpacked.returncode != 0:
                raise EnvCrashed(f"copying artifact {path} to the verifier failed: "
                                 f"{unpacked.stderr.decode(errors='replace').strip()[-300:]}")
        return missing

    def _verify(self) -> dict[str, Any]:
        """Run tests/test.sh the way the task asks (module docstring) and read the reward it wrote."""
        from agentgym.tools.sandbox import SandboxError, SandboxPool

        task = self._harbor
        assert task is not None and self._session is not None
        container = self._session.container
        if container is None:
            raise EnvCrashed("the episode has no container to grade")
        mode = "snapshot" if self.verifier == "snapshot" else task.verifier_mode
        user = resolve_user(self._image, task.verifier_user, task.name)  # the task's image, not the agent's files
        mark = f"{RESULT_MARK}{secrets.token_hex(16)}@@"  # unguessable: a forged result line cannot match it
        missing: list[str] = []
        if mode == "shared":
            stdout = self._run_tests(container, user, mark, copy_tests=True)
        else:
            image, mounts = self._image, ()
            if mode == "snapshot":
                image = f"agentgym-harbor-grade:{secrets.token_hex(8)}"
                committed = run_docker("commit", container, image, timeout=300)
                if committed.returncode != 0:
                    raise EnvCrashed(f"docker commit failed: {committed.stderr.decode(errors='replace').strip()[-300:]}")
                mounts = ((str(task.tests), "/tests"), *trusted_runtime_mounts())
            try:
                network = self._network(task.verifier_network) if mode == "separate" else "none"
                pool = SandboxPool(self._config(image, mounts=mounts, user=user, network=network))
                try:
                    with pool.session() as grader:
                        self._run("print('ready')", 30, session=grader)
                        if grader.container is None:
                            raise EnvCrashed("the verifier's container did not start")
                        folders = ["/logs", *(posixpath.dirname(p.rstrip("/")) or "/" for p in task.artifacts)]
                        if mode == "separate":
                            self._exec(grader.container, "0:0", _PREPARE_CODE, {"tests": False, "folders": folders},
                                       60)
                            missing = self._copy_artifacts(container, grader.container)
                        stdout = self._run_tests(grader.container, user, mark, copy_tests=mode == "separate")
                finally:
                    pool.close()
            except SandboxError as exc:
                raise EnvCrashed(f"the grading container failed: {exc}") from exc
            finally:
                if mode == "snapshot":
                    run_docker("rmi", "-f", image, timeout=120)
        _, sep, tail = stdout.rpartition(mark)
        try:
            reply = json.loads(base64.b64decode(tail.strip(), validate=True)) if sep else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            problem = (json.loads(stdout).get("problem") if stdout.startswith("{") else None) or \
                "the verifier printed no result"
            return {"reward": None, "rewards": {}, "problem": problem, "log": stdout[-2000:], "mode": mode}
        reward, rewards, problem = read_rewards(reply.get("reward_json"), reply.get("reward_txt"), self.primary_reward)
        problem = str(reply.get("problem") or "") or problem
        if reward is None and task.network != "none" and task.verifier_network != "none" and \
                self.internet_network is None:
            problem += (" (the task does not turn the network off, and these containers have none: a test.sh that "
                        "downloads its tools cannot run here; install them in environment/Dockerfile)")
        return {"reward": reward, "rewards": rewards, "problem": problem, "exit_code": reply.get("exit_code"),
                "log": str(reply.get("log") or ""), "mode": mode, "missing_artifacts": missing}

    # ---- AgentEnv hooks --------------------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.bash, self.submit])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([HermesParser(), FunctionCallParser(["bash", "submit"])])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        raise TaskError("HarborEnv was given no tasks: pass tasks= (harbor_tasks(folder)) or path= (a Harbor task "
                        "folder, or a folder of them), or reset(options={'task': task}) with a task of a Harbor suite.")

    def _begin_episode(self, task: Task) -> str:
        from agentgym.tools.sandbox import default_pool

        data = task.metadata.get("harbor")
        if not isinstance(data, Mapping) or not isinstance(data.get("path"), str):
            raise TaskError(f"Harbor task {task.id!r} needs metadata['harbor']['path'] (see harbor_tasks()).")
        self._harbor = task_ = load_harbor_task(data["path"])
        wants = [f"[{w}]" for w, n in (("environment", task_.network), ("verifier", task_.verifier_network))
                 if n == "internet"]
        if wants and self.internet_network is None and not self.allow_offline:
            raise TaskError(f"Harbor task {task_.name!r} asks for internet access ({' and '.join(wants)} "
                            "allow_internet = true or a network_mode other than \"no-network\"), but this env runs "
                            "every container with --network none. Pass HarborEnv(internet_network=\"bridge\") to "
                            "give it Docker's default network, or install what the task downloads in "
                            "environment/Dockerfile and set network_mode = \"no-network\", or pass "
                            "HarborEnv(allow_offline=True) to run it offline anyway.")
        if self.internet_network is not None and (task_.network, task_.verifier_network) != ("none", "none"):
            require_docker_network(self.internet_network)
        image = build_environment_image(task_)
        if task_.agent_user is not None or task_.verifier_user is not None:
            image = python_reachable_image(image)
        self._image = image
        self._workdir = task_.workdir or image_config(image).get("WorkingDir") or "/"
        if self._session is not None:
            self._session.close()
        user = resolve_user(image, task_.agent_user, task_.name)
        self._session = default_pool(self._config(image, user=user, network=self._network(task_.network))).session()
        self._grading = None
        self._run("print('ready')", 30)  # start the container now: a broken image fails at reset, not mid-episode
        return f"{self._harbor.instruction.strip()}\n\nYour working directory in the container is {self._workdir}."

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        observation, kind = super()._run_action(action, turn_info)
        if self._grading is not None:
            turn_info["grading"] = dict(self._grading)
        return observation, kind

    def _task_instructions(self) -> str:
        return ("You are working in a Linux container set up for a task. Run shell commands with bash (one command "
                "line per call; no network access), do what the task asks, then call submit() once: the task's own "
                f"tests then check the container's state. You have {self.max_turns} turns.")

    def reference_solver(self) -> ReferenceSolver:
        """The oracle: copy solution/ to /solution in the container and run solve.sh there, then submit."""
        task = self._harbor
        if task is None or task.solution is None:
            raise TaskError(f"Harbor task {task.name if task else '?'!r} has no solution/solve.sh.")
        container = self._session.container if self._session is not None else None
        if container is None:
            raise EnvCrashed("the episode has no container: call reset() before reference_solver()")
        # Put solution/ at /solution as Harbor's oracle does (owned by root, readable by the agent's user), then
        # run solve.sh with [solution] env. Its output goes to a file: a server it starts in the background keeps
        # running after solve.sh returns, as in Harbor, instead of holding the tool's output pipe open.
        self._exec(container, "0:0", "import shutil; shutil.rmtree('/solution', ignore_errors=True)", {}, 60)
        copied = run_docker("cp", str(task.solution), f"{container}:/solution", timeout=300)
        if copied.returncode != 0:
            raise EnvCrashed(f"copying solution/ into the container failed: "
                             f"{copied.stderr.decode(errors='replace').strip()[-300:]}")
        self._exec(container, "0:0", "import subprocess; subprocess.run(['chmod', '-R', 'a+rX', '/solution'])", {}, 60)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in task.solution_env.items())
        command = (f"out=$(mktemp) && {'env ' + exports + ' ' if exports else ''}bash /solution/solve.sh > \"$out\" "
                   "2>&1; status=$?; cat \"$out\"; exit $status")
        steps = [_hermes("bash", {"command": command}), _hermes("submit", {})]

        def solve(observation: str) -> str:
            return steps.pop(0) if len(steps) > 1 else steps[0]

        return solve

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        super().close()
