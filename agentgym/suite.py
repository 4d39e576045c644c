"""Tasks and task suites.

A :class:`Task` owns a prompt, a reference answer and metadata. A :class:`TaskSuite` is a named,
versioned, seeded set of tasks with train/test splits. Suites are declared in YAML
(``tasks/suites/NAME.yaml``, installed as data of the ``agentgym.tasks`` package) either by a generator function (deterministic given the seed) or by a JSONL
file, and every suite can prove it is solvable with :meth:`TaskSuite.validate`, which runs each env's
reference solver through the real env.

A suite for a user's own env may name the env class with ``entry_point: module:Class``; loading the suite then
registers the id, so ``agentgym eval --suite my.yaml`` and ``agentgym train`` work without a plugin package.
A suite may instead read a task format users bring with ``source:`` (``swebench``: a SWE-bench JSONL plus local
clones; ``harbor``: Harbor task directories; or ``module:function``), see :data:`SOURCES`.
``module`` (like a ``generator``'s) is an importable module or a ``module.py`` file next to the suite file.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentgym.errors import TaskError, did_you_mean
from agentgym.reference import prepare_env_tasks, run_reference_episode

__all__ = ["SPLITS", "Task", "TaskSuite", "ValidationReport", "list_suites", "load_suite"]

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Task:
    """One problem instance.

    Attributes:
        id: Unique within its suite; stable across versions that keep the task.
        prompt: What the agent is asked (the env may render it into its first observation).
        answer: The reference answer (or ``None`` when success is judged by state, e.g. a maze).
        metadata: Env-specific parameters needed to rebuild the episode (JSON-serialisable).
    """

    id: str
    prompt: str
    answer: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TaskError(f"Task.id must be a non-empty string, got {self.id!r}.")
        if not isinstance(self.prompt, str):
            raise TaskError(f"Task {self.id!r}: prompt must be a string, got {type(self.prompt).__name__}.")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        missing = {"id", "prompt"} - set(data)
        if missing:
            raise TaskError(f"A task record lacks {sorted(missing)}; each needs at least 'id' and 'prompt'.")
        return cls(id=str(data["id"]), prompt=data["prompt"], answer=data.get("answer"), metadata=data.get("metadata") or {})


@dataclass(frozen=True)
class ValidationReport:
    """Result of :meth:`TaskSuite.validate`: which tasks the reference solver could not solve and why."""

    suite: str
    checked: int
    failures: tuple[tuple[str, str], ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        if self.ok:
            return f"suite {self.suite}: all {self.checked} tasks solved by the reference solver"
        lines = [f"suite {self.suite}: {len(self.failures)} of {self.checked} tasks NOT solved:"]
        lines += [f"  {tid}: {why}" for tid, why in self.failures[:20]]
        return "\n".join(lines)


@dataclass(frozen=True)
class TaskSuite:
    """A named, versioned, seeded set of tasks with train/test splits, bound to one env id."""

    name: str
    version: int
    env_id: str
    splits: Mapping[str, tuple[Task, ...]]
    seed: int = 0
    description: str = ""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split, tasks in self.splits.items():
            ids = [t.id for t in tasks]
            if len(set(ids)) != len(ids):
                dup = next(i for i in ids if ids.count(i) > 1)
                raise TaskError(f"Suite {self.name!r} split {split!r} has duplicate task id {dup!r}.")

    @property
    def train(self) -> tuple[Task, ...]:
        return tuple(self.splits.get("train", ()))

    @property
    def test(self) -> tuple[Task, ...]:
        return tuple(self.splits.get("test", ()))

    def split(self, name: str) -> tuple[Task, ...]:
        if name not in self.splits:
            raise TaskError(f"Suite {self.name!r} has no split {name!r}; it has {sorted(self.splits)}.")
        return tuple(self.splits[name])

    def __iter__(self) -> Iterator[Task]:
        for tasks in self.splits.values():
            yield from tasks

    def make_env(self, **overrides: Any) -> Any:
        """Create this suite's env with the suite's env kwargs (``gym.make`` + the catalogue)."""
        import gymnasium as gym

        return gym.make(self.env_id, **{**dict(self.env_kwargs), **overrides})

    def validate(self, split: str | None = None, limit: int | None = None) -> ValidationReport:
        """Run the env's reference solver on every task and report each one it cannot solve."""
        tasks: list[Task] = list(self.split(split)) if split else list(self)
        if limit is not None:
            tasks = tasks[:limit]
        failures: list[tuple[str, str]] = []
        env = self.make_env()
        try:
            prepare_env_tasks(env, tasks, label=self.name)  # what the tasks need, built before they are played
            for i, task in enumerate(tasks):
                traj = run_reference_episode(env, task, seed=self.seed + i)
                if not traj.outcome.get("success"):
                    failures.append((task.id, f"end_reason={traj.end_reason}, score={traj.outcome.get('score')}"))
        finally:
            env.close()
        return ValidationReport(self.name, len(tasks), tuple(failures))

    # ---- loading -----------------------------------------------------------------------------
    @classmethod
    def from_jsonl(cls, path: str | Path, *, name: str | None = None, env_id: str, version: int = 1,
                   seed: int = 0, env_kwargs: Mapping[str, Any] | None = None) -> TaskSuite:
        """Load tasks from a JSONL file; each line is a task dict with an optional ``split`` field."""
        path = Path(path)
        if not path.is_file():
            raise TaskError(f"Task file {path} does not exist.")
        splits: dict[str, list[Task]] = {}
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TaskError(f"{path}:{lineno}: not valid JSON ({exc.msg}).") from exc
                splits.setdefault(record.pop("split", "train"), []).append(Task.from_dict(record))
        return cls(name=name or path.stem, version=version, env_id=env_id, seed=seed,
                   splits={k: tuple(v) for k, v in splits.items()}, env_kwargs=dict(env_kwargs or {}))

    @classmethod
    def from_yaml(cls, path: str | Path) -> TaskSuite:
        """Build a suite from its YAML declaration (generator- or file-based)."""
        path = Path(path)
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise TaskError(f"Cannot read suite file {path}: {exc}") from exc
        if not isinstance(spec, dict):
            raise TaskError(f"Suite file {path} must hold a mapping with name, version, env and splits.")
        missing = {"name", "version", "env"} - set(spec)
        if missing:
            raise TaskError(f"Suite file {path} lacks {sorted(missing)}.")
        seed = int(spec.get("seed", 0))
        env_kwargs = spec.get("env_kwargs") or {}
        if "entry_point" in spec:
            _register_entry_point(str(spec["env"]), str(spec["entry_point"]), path)
        if "source" in spec:
            loader = _source_loader(spec["source"], path)
            options = {k: v for k, v in spec.items() if k not in _SUITE_KEYS}
            splits = {name: tuple(tasks) for name, tasks in loader(options, path.parent.resolve()).items()}
            return cls(name=spec["name"], version=int(spec["version"]), env_id=spec["env"], seed=seed,
                       description=spec.get("description", ""), splits=splits, env_kwargs=env_kwargs)
        if "data" in spec:
            data_path = (path.parent / spec["data"]).resolve()
            return cls.from_jsonl(data_path, name=spec["name"], env_id=spec["env"], version=int(spec["version"]),
                                  seed=seed, env_kwargs=env_kwargs)
        if "generator" not in spec or "splits" not in spec:
            raise TaskError(f"Suite file {path} needs 'data: FILE.jsonl', 'generator' + 'splits', or 'source' "
                            f"(one of {sorted(SOURCES)}).")
        generator = _import_callable(spec["generator"], where=str(path), base_dir=path.parent)
        splits: dict[str, tuple[Task, ...]] = {}
        seen_in_train: set[str] = set()
        may_repeat = bool(spec.get("held_out_may_repeat_train", False))
        # train first: every other split leaves out what the agent trains on
        for split, split_spec in sorted(spec["splits"].items(), key=lambda item: (item[0] != "train", item[0])):
            split_spec = dict(split_spec or {})
            count = int(split_spec.pop("count", 0))
            if count <= 0:
                raise TaskError(f"Suite {spec['name']!r} split {split!r} needs count > 0.")
            rng = random.Random(f"{spec['name']}/{spec['version']}/{seed}/{split}")
            excluded = set() if split == "train" or may_repeat else seen_in_train
            tasks = _held_out_draw(generator, rng, count, split_spec, excluded,
                                   where=f"suite {spec['name']!r} split {split!r}")
            if split == "train":
                seen_in_train = {_content_key(t) for t in tasks}
            splits[split] = tuple(
                Task(id=f"{split}-{i:05d}", prompt=t.prompt, answer=t.answer, metadata=t.metadata)
                for i, t in enumerate(tasks)
            )
        return cls(name=spec["name"], version=int(spec["version"]), env_id=spec["env"], seed=seed,
                   description=spec.get("description", ""), splits=splits, env_kwargs=env_kwargs)


def _content_key(task: Task) -> str:
    """What the agent is given, as one string: two tasks with equal keys are the same task whatever their ids."""
    return json.dumps([task.prompt, task.answer, task.metadata], sort_keys=True, default=str)


def _held_out_draw(generator: Callable[..., Sequence[Task]], rng: random.Random, count: int,
                   options: Mapping[str, Any], excluded: set[str], *, where: str) -> list[Task]:
    """``count`` tasks from ``generator``, none equal to a task in ``excluded`` (the training split's keys, for a
    held-out split; empty for the training split, which is the generator's draw as it is).

    Generators draw each split independently, so a small task space repeats training tasks in a held-out split by
    chance (7 of the 100 negotiation test games were training games); those are drawn again from the same
    ``rng``, so a suite without repeats loads exactly as before. A generator that returns fewer tasks than asked
    has no more (a finite source), and the split keeps what it has, as it always did.
    """
    tasks: list[Task] = []
    for _attempt in range(50):
        wanted = count - len(tasks)
        drawn = list(generator(rng, wanted, **options))
        tasks += [task for task in drawn if not excluded or _content_key(task) not in excluded]
        if len(tasks) >= count or len(drawn) < wanted:
            break
    if excluded and not tasks:
        raise TaskError(f"{where}: every task it draws is also a training task, so it holds nothing out. Draw it "
                        "from tasks the training split cannot contain (a split option of the generator), or set "
                        "'held_out_may_repeat_train: true' in the suite file when the agent cannot tell tasks apart "
                        "anyway (say why in a comment).")
    return tasks[:count]


# Task formats users bring, read by ``source:`` in a suite file (string entry points: the core imports none of them).
SOURCES = {
    "swebench": "agentgym.tasks.swe.swebench:suite_source",
    "harbor": "agentgym.envs.swe.harbor:suite_source",
}
_SUITE_KEYS = {"name", "version", "env", "seed", "description", "env_kwargs", "entry_point", "source",
               "held_out_may_repeat_train"}


def _source_loader(source: Any, path: Path) -> Callable[[dict[str, Any], Path], Mapping[str, Any]]:
    """The loader named by a suite's ``source:`` (a known format, or ``module:function`` of the user's own).

    A loader is called with the suite file's other keys and the suite file's folder (relative paths resolve
    against it) and returns ``{split: [Task, ...]}``.
    """
    if not isinstance(source, str) or (source not in SOURCES and ":" not in source):
        raise TaskError(f"{path}: source must be one of {sorted(SOURCES)} or 'module:function', got {source!r}."
                        f"{did_you_mean(str(source), SOURCES)}")
    return _import_callable(SOURCES.get(source, source), where=str(path), base_dir=path.parent)


def _import_module(module_name: str, base_dir: Path | None) -> Any:
    """Import ``module_name``; failing that, load ``base_dir/module_name.py`` (a module beside a suite file)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        candidate = base_dir / f"{module_name}.py" if base_dir is not None and "." not in module_name else None
        if exc.name != module_name or candidate is None or not candidate.is_file():
            raise
    module_spec = importlib.util.spec_from_file_location(module_name, candidate)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {candidate}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _import_callable(dotted: str, where: str, base_dir: Path | None = None) -> Callable[..., Any]:
    module_name, _, attr = dotted.partition(":")
    try:
        return getattr(_import_module(module_name, base_dir), attr)
    except (ImportError, AttributeError) as exc:
        raise TaskError(f"{where}: cannot import {dotted!r} ({exc}). Use 'package.module:name', where the module "
                        "is installed or is a .py file next to the suite file.") from exc


def _register_entry_point(env_id: str, entry_point: str, path: Path) -> None:
    """Register the suite's own env class under ``env_id`` (nothing to do when the id is registered)."""
    import gymnasium as gym

    if env_id in gym.registry:
        return
    env_class = _import_callable(entry_point, where=str(path), base_dir=path.parent)
    gym.register(id=env_id, entry_point=env_class)


def __getattr__(name: str) -> Any:
    """``load_suite`` and ``list_suites`` moved to :mod:`agentgym.registration.suites` (finding suites by name,
    plugins included, is registration); the old names resolve there for one release."""
    from agentgym.utils.deprecation import moved_name

    return moved_name(__name__, name, "agentgym.registration.suites", ("list_suites", "load_suite"))
