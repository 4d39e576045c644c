"""Harbor-format task folders (Harbor / Terminal-Bench 2) read into :class:`HarborTask` records and agentgym tasks.

:func:`load_harbor_task` checks one folder (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``,
optional ``solution/``) and says what is missing; :func:`harbor_tasks` and :func:`suite_source` read a folder of
them for a suite. The env that runs them is :class:`agentgym.envs.swe.harbor.HarborEnv`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentgym.errors import TaskError, did_you_mean
from agentgym.suite import Task

__all__ = [
    "DEFAULT_BUILD_TIMEOUT_S", "DEFAULT_VERIFIER_TIMEOUT_S", "harbor_tasks", "HarborTask", "load_harbor_task",
    "suite_source", "task_to_agentgym"
]

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
        docker_image: ``[environment] docker_image``: a prebuilt image used instead of building ``environment/``.
        workdir: ``[environment] workdir`` (else the image's ``WORKDIR``).
        agent_user / verifier_user: ``[agent] user`` / ``[verifier] user`` (None: the image's default, root).
        verifier_env / solution_env: ``[verifier] env`` / ``[solution] env``: variables test.sh / solve.sh see.
        verifier_mode: ``"shared"`` (test.sh runs in the agent's live container, Harbor's default) or
            ``"separate"`` (``[verifier] environment_mode = "separate"``: a fresh container of the task's
            environment that gets only ``/logs/artifacts`` and the declared ``artifacts`` from the agent's).
        network: ``"none"``, ``"internet"`` (asked for with ``allow_internet = true`` or a ``network_mode`` other
            than ``"no-network"``) or ``"default"`` (not set: Harbor's default allows internet).
        verifier_network: The same for the verifier: ``[verifier] network_mode`` where given, else ``network``.
        artifacts: Absolute paths the separate verifier gets from the agent's container (besides /logs/artifacts).
    """

    name: str
    path: str
    instruction: str
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    cpus: float | None = None
    memory_bytes: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    docker_image: str | None = None
    workdir: str | None = None
    agent_user: str | None = None
    verifier_user: str | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    verifier_mode: str = "shared"
    network: str = "default"
    verifier_network: str = "default"
    artifacts: tuple[str, ...] = ()

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


def _env_table(value: Any, what: str, where: str) -> dict[str, str]:
    """``env = { KEY = "value" }``: names and values as strings (numbers and booleans written as TOML prints them)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TaskError(f"{where}: {what} must be a table of NAME = \"value\", got {value!r:.100}.")
    out = {}
    for key, item in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise TaskError(f"{where}: {what} has the variable name {key!r}; names are letters, digits and _.")
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, (str, int, float)):
            raise TaskError(f"{where}: {what}.{key} must be a string or a number, got {item!r:.100}.")
        out[str(key)] = str(item)
    return out


def _user(value: Any, what: str, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?",
                                                      value):
        raise TaskError(f"{where}: {what} must be a user name or uid (optionally user:group), got {value!r:.100}.")
    return value


def _network(table: Mapping[str, Any], what: str, where: str) -> str | None:
    """``network_mode`` ("no-network" / "public" / ...) or the older ``allow_internet``; None when neither is set."""
    mode = table.get("network_mode")
    if mode is not None:
        if not isinstance(mode, str) or not mode.strip():
            raise TaskError(f"{where}: {what} network_mode must be a string such as \"no-network\" or \"public\".")
        return "none" if mode.strip().lower() in ("no-network", "none") else "internet"
    allow = table.get("allow_internet")
    if allow is not None:
        if not isinstance(allow, bool):
            raise TaskError(f"{where}: {what} allow_internet must be true or false, got {allow!r}.")
        return "internet" if allow else "none"
    return None


def _artifacts(value: Any, where: str) -> tuple[str, ...]:
    """``artifacts = ["/app/out.txt", { source = "/app/report" }]``: absolute paths."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TaskError(f"{where}: artifacts must be a list of absolute paths (or tables with source = path).")
    paths = []
    for item in value:
        path = item.get("source") if isinstance(item, Mapping) else item
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise TaskError(f"{where}: artifact {item!r:.100} is not an absolute path (or a table with source = path).")
        paths.append(path)
    return tuple(paths)


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
    if not (root / "tests" / "test.sh").is_file():
        raise TaskError(f"{where}: no tests/test.sh (the verifier, which writes /logs/verifier/reward.txt).")
    sections = {}
    for section in ("task", "verifier", "agent", "environment", "solution"):
        value = config.get(section, {})
        if not isinstance(value, Mapping):
            raise TaskError(f"{where}: [{section}] must be a table.")
        sections[section] = value
    verifier, env = sections["verifier"], sections["environment"]
    memory = env.get("memory_mb", env.get("memory"))
    name = sections["task"].get("name") or root.name
    if not isinstance(name, str) or not name.strip():
        raise TaskError(f"{where}: [task] name must be a non-empty string.")
    mode = verifier.get("environment_mode")
    if "environment" in verifier:
        # Harbor builds such a verifier from tests/ or a verifier image that already holds /tests; nothing here
        # would run it the way Harbor does, so the task is refused rather than graded some other way.
        raise TaskError(f"{where}: [verifier.environment] (a verifier image of its own) is not supported; use "
                        "environment_mode = \"separate\" without it (the verifier then starts from [environment]) "
                        "or the shared mode.")
    if mode not in (None, "shared", "separate"):
        raise TaskError(f"{where}: [verifier] environment_mode must be \"shared\" or \"separate\", got {mode!r}.")
    docker_image = env.get("docker_image")
    if docker_image is not None and (not isinstance(docker_image, str) or not docker_image.strip()):
        raise TaskError(f"{where}: [environment] docker_image must be an image name such as \"python:3.11-slim\".")
    if docker_image is None and not (root / "environment" / "Dockerfile").is_file():
        raise TaskError(f"{where}: no environment/Dockerfile and no [environment] docker_image (the agent's "
                        "container; docker-compose environments are not supported).")
    workdir = env.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise TaskError(f"{where}: [environment] workdir must be an absolute path, got {workdir!r}.")
    network = _network(env, "[environment]", where) or "default"
    return HarborTask(
        name=name.strip(), path=str(root), instruction=instruction,
        verifier_timeout_s=_number(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S),
                                   "[verifier] timeout_sec", where),
        build_timeout_s=_number(env.get("build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S),
                                "[environment] build_timeout_sec", where),
        cpus=_number(env["cpus"], "[environment] cpus", where) if "cpus" in env else None,
        memory_bytes=_memory(memory, where) if memory is not None else None, config=config,
        docker_image=docker_image.strip() if docker_image else None, workdir=workdir,
        agent_user=_user(sections["agent"].get("user"), "[agent] user", where),
        verifier_user=_user(verifier.get("user"), "[verifier] user", where),
        verifier_env=_env_table(verifier.get("env"), "[verifier] env", where),
        solution_env=_env_table(sections["solution"].get("env"), "[solution] env", where),
        verifier_mode=mode or "shared", network=network,
        verifier_network=_network(verifier, "[verifier]", where) or network,
        artifacts=_artifacts(config.get("artifacts"), where))


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
