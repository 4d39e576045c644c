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
import hashlib
import io
import json
import logging
import os
import re
import secrets
import subprocess
import tarfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import yaml

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, EnvCrashed, TaskError, did_you_mean
from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["HarborEnv", "HarborTask", "build_environment_image", "harbor_tasks", "load_harbor_task", "suite_source"]

logger = logging.getLogger(__name__)
RESULT_MARK = "@@agentgym-harbor@@"
MAX_COMMAND_CHARS = 200_000
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class HarborTask:
    """One validated Harbor task folder.

    Attributes:
        name: The task's name (``[task] name`` of task.toml, else the folder name).
        path: Absolute path of the task folder.
        instruction: The text of instruction.md.
        verifier_timeout_s: ``[verifier] timeout_sec`` (how long test.sh may run).
        build_timeout_s: ``[environment] build_timeout_sec``.
        cpus: ``[environment] cpus`` (None: the sandbox default).
        memory_bytes: ``[environment] memory_mb`` or ``memory`` ("4G"), None when not given.
        config: The whole parsed task.toml / task.yaml (metadata included), for reference.
    """

    name: str
    path: str
    instruction: str
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    cpus: float | None = None
    memory_bytes: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def environment(self) -> Path:
        return Path(self.path) / "environment"

    @property
    def tests(self) -> Path:
        return Path(self.path) / "tests"

    @property
    def solution(self) -> Path | None:
        script = Path(self.path) / "solution" / "solve.sh"
        return script.parent if script.is_file() else None


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TaskError(f"{where}: {what} must be a positive number, got {value!r}.")
    return float(value)


def _memory(value: Any, where: str) -> int:
    """``memory = "4G"`` / ``"512M"`` or ``memory_mb = 2048`` as bytes."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", value, re.IGNORECASE)
        if not match:
            raise TaskError(f"{where}: [environment] memory must look like '4G' or '512M', got {value!r}.")
        scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[match.group(2).upper()]
        return int(float(match.group(1)) * scale)
    return int(_number(value, "[environment] memory_mb", where)) << 20


def load_harbor_task(path: Path | str) -> HarborTask:
    """Read and check one Harbor task folder; every problem names the file and the fix."""
    root = Path(path).resolve()
    where = f"Harbor task {root}"
    if not root.is_dir():
        raise TaskError(f"{where}: not a folder.")
    config: dict[str, Any] = {}
    if (root / "task.toml").is_file():
        try:
            config = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise TaskError(f"{where}: task.toml is not valid TOML ({exc}).") from exc
    elif (root / "task.yaml").is_file():
        try:
            config = yaml.safe_load((root / "task.yaml").read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise TaskError(f"{where}: task.yaml is not valid YAML ({exc}).") from exc
        if not isinstance(config, dict):
            raise TaskError(f"{where}: task.yaml must hold a mapping.")
    else:
        raise TaskError(f"{where}: no task.toml (a Harbor task folder holds task.toml, instruction.md, "
                        "environment/Dockerfile and tests/test.sh).")
    if (root / "instruction.md").is_file():
        instruction = (root / "instruction.md").read_text(encoding="utf-8")
    elif isinstance(config.get("instruction"), str):
        instruction = config["instruction"]
    else:
        raise TaskError(f"{where}: no instruction.md (what the agent is asked to do).")
    if not instruction.strip():
        raise TaskError(f"{where}: instruction.md is empty.")
    if not (root / "environment" / "Dockerfile").is_file():
        raise TaskError(f"{where}: no environment/Dockerfile (the agent's container; docker-compose environments "
                        "are not supported).")
    if not (root / "tests" / "test.sh").is_file():
        raise TaskError(f"{where}: no tests/test.sh (the verifier, which writes /logs/verifier/reward.txt).")
    sections = {}
    for section in ("task", "verifier", "agent", "environment"):
        value = config.get(section, {})
        if not isinstance(value, Mapping):
            raise TaskError(f"{where}: [{section}] must be a table.")
        sections[section] = value
    verifier, env = sections["verifier"], sections["environment"]
    memory = env.get("memory_mb", env.get("memory"))
    name = sections["task"].get("name") or root.name
    if not isinstance(name, str) or not name.strip():
        raise TaskError(f"{where}: [task] name must be a non-empty string.")
    return HarborTask(
        name=name.strip(), path=str(root), instruction=instruction,
        verifier_timeout_s=_number(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S),
                                   "[verifier] timeout_sec", where),
        build_timeout_s=_number(env.get("build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S),
                                "[environment] build_timeout_sec", where),
        cpus=_number(env["cpus"], "[environment] cpus", where) if "cpus" in env else None,
        memory_bytes=_memory(memory, where) if memory is not None else None, config=config)


def _task_folders(path: Path) -> list[Path]:
    """One task folder, or every task folder directly inside ``path`` (sorted)."""
    if (path / "task.toml").is_file() or (path / "task.yaml").is_file():
        return [path]
    folders = sorted(p for p in path.iterdir() if p.is_dir() and ((p / "task.toml").is_file()
                                                                  or (p / "task.yaml").is_file()))
    if not folders:
        raise TaskError(f"{path} holds no Harbor task (no task.toml in it or in any folder directly inside it).")
    return folders


def task_to_agentgym(task: HarborTask) -> Task:
    return Task(id=task.name, prompt=task.instruction, answer=None, metadata={"harbor": {"path": task.path}})


def harbor_tasks(path: Path | str) -> list[Task]:
    """Tasks of ``HarborEnv`` from a task folder or a folder of task folders (the Python API)."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise TaskError(f"Harbor task path {path} is not a folder.")
    tasks = [task_to_agentgym(load_harbor_task(p)) for p in _task_folders(path)]
    names = [t.id for t in tasks]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TaskError(f"{path}: task names {duplicates} appear more than once; names must be unique.")
    return tasks


def suite_source(spec: Mapping[str, Any], base_dir: Path) -> dict[str, tuple[Task, ...]]:
    """The ``source: harbor`` loader of suite files: ``path`` and optional ``splits`` (names / rest)."""
    unknown = set(spec) - {"path", "splits"}
    if unknown:
        raise TaskError(f"A 'source: harbor' suite takes path and splits; unknown: {sorted(unknown)}.")
    if not isinstance(spec.get("path"), str):
        raise TaskError("A 'source: harbor' suite needs 'path:' (a task folder or a folder of them, relative to the "
                        "suite file).")
    tasks = harbor_tasks(base_dir / spec["path"])
    rules = spec.get("splits")
    if not rules:
        return {"test": tuple(tasks)}
    if not isinstance(rules, Mapping):
        raise TaskError("splits must map a split name to {names: [...]} or {rest: true}.")
    by_name = {t.id: t for t in tasks}
    chosen: dict[str, tuple[Task, ...]] = {}
    taken: set[str] = set()
    rest = None
    for split, rule in rules.items():
        if not isinstance(rule, Mapping) or len(rule) != 1 or next(iter(rule)) not in ("names", "rest"):
            raise TaskError(f"split {split!r} needs exactly one rule: names: [...] or rest: true; got {rule!r}.")
        if "rest" in rule:
            rest = split
            continue
        names = rule["names"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TaskError(f"split {split!r}: names must be a list of task names.")
        for name in names:
            if name not in by_name:
                raise TaskError(f"split {split!r} names task {name!r}, which is not there."
                                f"{did_you_mean(name, by_name)}")
            if name in taken:
                raise TaskError(f"task {name!r} is in two splits.")
            taken.add(name)
        chosen[split] = tuple(by_name[n] for n in names)
    if rest is not None:
        chosen[rest] = tuple(t for t in tasks if t.id not in taken)
    return chosen


# ---- images ---------------------------------------------------------------------------------------------------

def _docker(*args: str, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    from agentgym.tools.sandbox.backends import DOCKER_ENV, minimal_env

    try:
        return subprocess.run(["docker", *args], capture_output=True, input=stdin, timeout=timeout, check=False,
                              env={**minimal_env(*DOCKER_ENV), "DOCKER_BUILDKIT": "0"})
    except FileNotFoundError as exc:
        raise EnvCrashed("the docker CLI is not installed (apt-get install docker.io)") from exc
    except subprocess.TimeoutExpired as exc:
        raise EnvCrashed(f"docker {args[0]} took longer than {timeout:g} s") from exc


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds ``FROM`` (stage names and ``scratch`` left out)."""
    stages: set[str] = set()
    found: list[str] = []
    text = re.sub(r"\\\n", " ", dockerfile)
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        words = [w for w in words[1:] if not w.startswith("--")]
        if not words:
            continue
        image = words[0]
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if image.lower() not in stages and image != "scratch" and image not in found:
            found.append(image)
    return found


def _context_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            digest.update(f"F {rel} {oct(path.stat().st_mode & 0o777)}\n".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def build_environment_image(task: HarborTask) -> str:
    """``docker build`` the task's ``environment/`` once per content (tagged by its hash); returns the image.

    Nothing is pulled: each ``FROM`` image must be local. The repository's own base, ``agentgym-sandbox:2``, is
    created on demand (:func:`agentgym.tools.sandbox.ensure_docker_image`).
    """
    from agentgym.tasks.swe.images import BASE_IMAGE
    from agentgym.tools.sandbox import ensure_docker_image

    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    image = f"agentgym-harbor-{slug[:60]}:{_context_digest(task.environment)}"
    if _docker("image", "inspect", image, timeout=60).returncode == 0:
        return image
    for base in base_images((task.environment / "Dockerfile").read_text(encoding="utf-8")):
        if base == BASE_IMAGE:
            ensure_docker_image(BASE_IMAGE)
        elif "$" not in base and _docker("image", "inspect", base, timeout=60).returncode != 0:
            raise TaskError(
                f"Harbor task {task.name!r}: environment/Dockerfile builds FROM {base}, which is not in the local "
                f"Docker image store, and images cannot be pulled here (no network). Load it first (docker load -i "
                f"image.tar, or build it locally), or start the Dockerfile FROM {BASE_IMAGE}, which agentgym builds "
                "itself (the host's /usr and Python are mounted at run time, so use COPY/ENV/WORKDIR, not RUN).")
    logger.info("Harbor: building %s from %s", image, task.environment)
    result = _docker("build", "-q", "-t", image, str(task.environment), timeout=task.build_timeout_s)
    if result.returncode != 0:
        raise TaskError(f"Harbor task {task.name!r}: docker build of environment/ failed: "
                        f"{result.stderr.decode(errors='replace').strip()[-800:]}")
    return image


def _image_config(image: str) -> dict[str, Any]:
    result = _docker("image", "inspect", "--format", "{{json .Config}}", image, timeout=60)
    if result.returncode != 0:
        raise EnvCrashed(f"cannot inspect {image}: {result.stderr.decode(errors='replace').strip()[-300:]}")
    return json.loads(result.stdout) or {}


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
        committed = _docker("commit", container, snapshot, timeout=300)
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
            _docker("rmi", "-f", snapshot, timeout=120)
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
        self._workdir = _image_config(image).get("WorkingDir") or "/"
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
