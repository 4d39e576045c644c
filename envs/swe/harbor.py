"""Harbor-format task directories, run in the Docker sandbox backend with images built locally.

A Harbor task (the format of Harbor / Terminal-Bench 2) is a folder::

    my-task/
      task.toml            # [verifier] timeout_sec, [agent] timeout_sec, [environment] cpus / memory_mb / memory ...
      instruction.md       # what the agent is asked to do
      environment/         # build context; environment/Dockerfile is the agent's container
      tests/test.sh        # the verifier: writes the reward to /logs/verifier/reward.txt (or reward.json)
      solution/solve.sh    # optional reference solution (the oracle)

``HarborEnv`` builds ``environment/`` with ``docker build`` (once per content hash; nothing is pulled: every
``FROM`` image must already be in the local image store, else a clear error says so), starts a container of it
through the Docker sandbox backend (no network, capabilities dropped, the image's filesystem writable, a fresh
container per episode) and gives the agent ``bash`` and ``submit``. Grading happens after ``submit``: the
container is snapshotted (``docker commit``) and ``tests/test.sh`` runs in a *fresh* container of that snapshot,
with ``tests/`` mounted read-only at ``/tests`` from the task folder (the agent never saw it and cannot have
changed it) and ``/logs/verifier`` emptied first (a reward file the agent planted does not count). The reward is
the number ``test.sh`` wrote; success is reward >= 1. The oracle (:meth:`HarborEnv.reference_solver`) copies
``solution/`` to ``/solution`` and runs ``solve.sh``, as Harbor does.

The grading container also gets the host's dynamic loader set-up read-only over whatever the snapshot holds
(``/lib``, ``/lib64``, ``/bin``, ``/sbin``, ``/etc/ld.so.cache``, ``/etc/ld.so.conf*``, and an empty
``/etc/ld.so.preload``), as ``/usr`` and Python always are: a root agent that wrote an ``ld.so.preload`` or swapped a
loader cannot run code inside the verifier's own processes (``bash``, the interpreter that reads the reward). When
``test.sh`` returns, every other process in the container is killed before the reward file is read, and the
result line carries a mark drawn afresh for each grading.

Honest limit: the tests check the state the agent left, so they run inside the agent's files as root; anything the
agent wrote that ``test.sh`` executes (its program, a ``conftest.py`` pytest picks up in the agent's working
directory) runs as root too and could write the reward file itself. Task authors should run the agent's program as
an unprivileged user and point pytest at ``/tests`` (``pytest /tests --rootdir /tests -p no:cacheprovider``).

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
import io
import json
import logging
import os
import secrets
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, EnvCrashed, TaskError
from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

from agentgym.envs.swe.harbor_images import base_images, build_environment_image, image_config, run_docker
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
    "harbor_tasks", "HarborEnv", "HarborTask", "load_harbor_task", "MAX_COMMAND_CHARS", "RESULT_MARK",
    "suite_source", "task_to_agentgym", "trusted_runtime_mounts"
]

logger = logging.getLogger(__name__)
RESULT_MARK = "@@agentgym-harbor@@"
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

# Runs in a fresh container of the agent's final state; /tests is the task's own folder, mounted read-only.
_VERIFY_CODE = '''
import base64, json, os, shutil, signal, subprocess
for _path in ("/logs/verifier", "/logs"):
    if os.path.islink(_path):
        os.unlink(_path)
shutil.rmtree("/logs/verifier", ignore_errors=True)  # a reward file the agent planted must not count
os.makedirs("/logs/verifier")
_reply = {{"reward": None, "problem": ""}}
if os.listdir("/logs/verifier"):
    _reply["problem"] = "/logs/verifier could not be emptied"
else:
    _p = subprocess.Popen(["bash", "/tests/test.sh"], cwd={cwd!r}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _out, _ = _p.communicate(timeout={timeout!r})
        _reply["exit_code"] = _p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(_p.pid, signal.SIGKILL)
        _out, _ = _p.communicate()
        _reply["problem"] = "tests/test.sh timed out after {timeout:g} s"
    _reply["log"] = _out.decode("utf-8", "replace")[-3000:]
    # Nothing test.sh left running may write the reward after this point: kill all but this process's ancestry.
    _keep, _pid = set(), os.getpid()
    while _pid > 0 and _pid not in _keep:
        _keep.add(_pid)
        try:
            _pid = int(open("/proc/%d/stat" % _pid).read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for _name in os.listdir("/proc"):
        if _name.isdigit() and int(_name) not in _keep:
            try:
                os.kill(int(_name), signal.SIGKILL)
            except OSError:
                pass
    if os.path.isfile("/logs/verifier/reward.txt"):
        _text = open("/logs/verifier/reward.txt").read().strip()
        try:
            _reply["reward"] = float(_text)
        except ValueError:
            _reply["problem"] = "reward.txt does not hold a number: " + repr(_text[:100])
    elif os.path.isfile("/logs/verifier/reward.json"):
        try:
            _data = json.load(open("/logs/verifier/reward.json"))
            _reply["reward"] = float(_data["reward"] if isinstance(_data, dict) else _data)
            _reply["rewards"] = _data if isinstance(_data, dict) else {{}}
        except (ValueError, KeyError, TypeError) as _exc:
            _reply["problem"] = "reward.json has no numeric 'reward': " + str(_exc)[:100]
    elif not _reply["problem"]:
        _reply["problem"] = "tests/test.sh wrote no /logs/verifier/reward.txt or reward.json"
print({mark!r} + base64.b64encode(json.dumps(_reply).encode()).decode())
'''


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
        render_mode: ``"ansi"`` or ``None``.
    """

    description: ClassVar[str] = "Do a Harbor-format task in its Docker environment (bash, submit)."
    native_format_hint: ClassVar[str] = 'Tools may also be called as functions, e.g. bash("ls") or submit().'

    def __init__(self, *, tasks: Sequence[Task] | None = None, path: str | None = None, max_turns: int = 30,
                 command_timeout_s: float = 120.0, memory_bytes: int = 2048 << 20, max_output_chars: int = 6000,
                 max_action_chars: int = 400_000, render_mode: str | None = None) -> None:
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
    def _config(self, image: str, mounts: tuple[tuple[str, str], ...] = ()) -> Any:
        from agentgym.tools.sandbox import SandboxConfig, SandboxLimits

        task = self._harbor
        assert task is not None
        wall = max(self.command_timeout_s, task.verifier_timeout_s) + 60
        limits = SandboxLimits(wall_timeout_s=wall, cpu_timeout_s=wall, episode_cpu_s=int(4 * wall + 3600),
                               memory_bytes=task.memory_bytes or self.memory_bytes, workdir_bytes=256 << 20,
                               file_size_bytes=1 << 30, pids=256, open_files=1024,
                               address_space_bytes=16 << 30, cpus=task.cpus or 1.0)
        return SandboxConfig(backend="docker", limits=limits, preload=(), max_workers=8, docker_image=image,
                             mounts=mounts, docker_user="0:0", docker_writable_root=True, start_timeout_s=60.0)

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

    def _verify(self) -> dict[str, Any]:
        """Snapshot the container, run tests/test.sh in a fresh container of the snapshot, read the reward."""
        from agentgym.tools.sandbox import SandboxError, SandboxPool

        task = self._harbor
        assert task is not None and self._session is not None
        container = self._session.container
        if container is None:
            raise EnvCrashed("the episode has no container to grade")
        snapshot = f"agentgym-harbor-grade:{secrets.token_hex(8)}"
        mark = f"{RESULT_MARK}{secrets.token_hex(16)}@@"  # unguessable: a forged result line cannot match it
        committed = run_docker("commit", container, snapshot, timeout=300)
        if committed.returncode != 0:
            raise EnvCrashed(f"docker commit failed: {committed.stderr.decode(errors='replace').strip()[-300:]}")
        try:
            mounts = ((str(task.tests), "/tests"), *trusted_runtime_mounts())
            pool = SandboxPool(self._config(snapshot, mounts=mounts))
            try:
                with pool.session() as grader:
                    code = _VERIFY_CODE.format(cwd=self._workdir, timeout=task.verifier_timeout_s, mark=mark)
                    stdout = self._run(code, task.verifier_timeout_s, session=grader)
            finally:
                pool.close()
        except SandboxError as exc:
            raise EnvCrashed(f"the grading container failed: {exc}") from exc
        finally:
            run_docker("rmi", "-f", snapshot, timeout=120)
        _, sep, tail = stdout.rpartition(mark)
        try:
            reply = json.loads(base64.b64decode(tail.strip(), validate=True)) if sep else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            return {"reward": None, "problem": "the verifier printed no result", "log": stdout[-2000:]}
        reward = reply.get("reward")
        return {"reward": float(reward) if isinstance(reward, (int, float)) else None,
                "problem": str(reply.get("problem") or ""), "exit_code": reply.get("exit_code"),
                "rewards": reply.get("rewards") or {}, "log": str(reply.get("log") or "")}

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
        self._harbor = load_harbor_task(data["path"])
        image = build_environment_image(self._harbor)
        self._workdir = image_config(image).get("WorkingDir") or "/"
        if self._session is not None:
            self._session.close()
        self._session = default_pool(self._config(image)).session()
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
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(task.solution, arcname=".")
        payload = base64.b64encode(buffer.getvalue()).decode()
        command = (f"mkdir -p /solution && echo {payload} | base64 -d | tar -xz -C /solution && "
                   "bash /solution/solve.sh")
        steps = [_hermes("bash", {"command": command}), _hermes("submit", {})]

        def solve(observation: str) -> str:
            return steps.pop(0) if len(steps) > 1 else steps[0]

        return solve

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        super().close()
