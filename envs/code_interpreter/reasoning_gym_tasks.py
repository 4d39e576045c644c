"""Code-interpreter tasks from reasoning-gym datasets, drawn with split hygiene.

:func:`generate_tasks` draws problems from `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_
datasets (arithmetic, GSM-symbolic word problems, linear equations, fractions, primes, letter counting, base
conversion, CodeI/O). Every task carries the reasoning-gym entry (its metadata is what the per-kind graders read:
the variable, the reduced fraction, the prime factors, the target base) and ``reference_code``
(:mod:`agentgym.envs.code_interpreter.reference_code`).

Split hygiene: each split names its own reasoning-gym ``seed`` (reasoning-gym item ``i`` of a dataset
is ``Random(seed + i)``, so seeds of different splits must lie far apart), and ``holdout`` partitions
the question space by a hash of the question text, so a ``holdout: only`` split (test) can never
contain a question of a ``holdout: exclude`` split (train), whatever their seeds.
"""

from __future__ import annotations

import ast
import contextlib
import decimal
import hashlib
import io
import math
import random
import threading
import warnings
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from agentgym.errors import DependencyNotInstalled, TaskError
from agentgym.suite import Task

from agentgym.envs.code_interpreter.codeio import (
    codeio_mode,
    codeio_reproduces,
    codeio_sample,
    codeio_sample_is_safe,
)
from agentgym.envs.code_interpreter.reference_code import DATASETS, reference_code

__all__ = ["generate_tasks"]

_MAX_DRAWS_PER_TASK = 60  # candidates tried per wanted task before giving up (holdout, dedup, filters)


# ---- reasoning-gym ----------------------------------------------------------------------------
def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise DependencyNotInstalled("reasoning-gym", "code", "the code-interpreter task suites") from exc
    return reasoning_gym


def generate_tasks(
    rng: random.Random,
    count: int,
    *,
    seed: int,
    datasets: Sequence[str] = DATASETS,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    holdout: str | None = None,
    holdout_every: int = 5,
    codeio_modes: Sequence[str] = ("output",),
) -> list[Task]:
    """Draw ``count`` reasoning-gym problems, mixed evenly over ``datasets``.

    The mix is exact (each dataset gets ``count // len(datasets)`` tasks, the first ``count % n``
    datasets in ``rng``'s shuffle one more) and its order is a shuffle by ``rng``. Within a dataset,
    reasoning-gym items ``seed + 0, seed + 1, ...`` are taken in order, skipping repeated questions,
    questions outside the ``holdout`` part, and degenerate items (see :func:`_usable`), so the tasks
    are a pure function of ``(rng state, count, seed, datasets, configs, holdout)``.

    Args:
        rng: Orders the mix (the suite seeds it per split).
        count: How many tasks.
        seed: The reasoning-gym seed of this split; give train and test seeds far apart (item ``i`` is
            generated from ``Random(seed + i)``), e.g. 10_000_000 and 20_000_000.
        datasets: reasoning-gym dataset names, a subset of :data:`DATASETS`.
        configs: Per-dataset reasoning-gym config overrides, e.g. ``{"count_primes": {"max_n": 200}}``.
        holdout: ``None``, ``"exclude"`` (train: drop the held-out questions) or ``"only"`` (test:
            keep only them). The held-out part is one question in ``holdout_every``, by a hash of
            the question text, so an ``exclude`` and an ``only`` split never share a question.
        holdout_every: Size of the held-out part.
        codeio_modes: Which CodeI/O tasks to keep: ``"output"`` (predict the output of a function on
            a given input; the reference runs the function) and/or ``"input"`` (find an input giving
            an output; reasoning-gym only accepts its own input verbatim, so the reference is literal).
    """
    with _GENERATION_LOCK:
        return _generate_tasks(rng, count, seed=seed, datasets=datasets, configs=configs, holdout=holdout,
                               holdout_every=holdout_every, codeio_modes=codeio_modes)


# Generation swaps the process-wide sys.stdout/sys.stderr (reasoning-gym prints while building items) and
# runs CodeI/O samples; two threads doing it at once (envs built in a rollout's worker threads) left sys.stdout
# replaced for good and tripped CPython 3.11's AST constructor. One generation at a time per process.
_GENERATION_LOCK = threading.RLock()


def _generate_tasks(rng: random.Random, count: int, *, seed: int, datasets: Sequence[str],
                    configs: Mapping[str, Mapping[str, Any]] | None, holdout: str | None, holdout_every: int,
                    codeio_modes: Sequence[str]) -> list[Task]:
    datasets = list(datasets)
    unknown = [d for d in datasets if d not in DATASETS]
    if not datasets or unknown:
        raise TaskError(f"datasets must be a non-empty subset of {list(DATASETS)}; unknown: {unknown}.")
    if len(set(datasets)) != len(datasets):
        raise TaskError(f"datasets lists a dataset twice: {datasets}.")
    if holdout not in (None, "exclude", "only"):
        raise TaskError(f"holdout must be null, 'exclude' or 'only', got {holdout!r}.")
    if holdout_every < 2:
        raise TaskError(f"holdout_every must be >= 2, got {holdout_every}.")
    bad_modes = set(codeio_modes) - {"input", "output"}
    if not codeio_modes or bad_modes:
        raise TaskError(f"codeio_modes must be a non-empty subset of ['input', 'output'], got {list(codeio_modes)}.")
    configs = dict(configs or {})
    if set(configs) - set(datasets):
        raise TaskError(f"configs names datasets not in datasets: {sorted(set(configs) - set(datasets))}.")

    order = list(datasets)
    rng.shuffle(order)
    per_dataset = {name: count // len(order) + (1 if i < count % len(order) else 0) for i, name in enumerate(order)}
    drawn = {
        name: _draw(name, per_dataset[name], seed=int(seed), config=dict(configs.get(name) or {}),
                    holdout=holdout, holdout_every=holdout_every, codeio_modes=tuple(codeio_modes))
        for name in datasets
        if per_dataset[name]
    }
    mix = [name for name in order for _ in range(per_dataset[name])]
    rng.shuffle(mix)
    cursor = dict.fromkeys(drawn, 0)
    tasks = []
    for name in mix:
        tasks.append(drawn[name][cursor[name]])
        cursor[name] += 1
    return tasks


def _in_holdout(question: str, every: int) -> bool:
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % every == 0


def _draw(name: str, count: int, *, seed: int, config: dict[str, Any], holdout: str | None, holdout_every: int,
          codeio_modes: tuple[str, ...]) -> list[Task]:
    rg = _rg()
    budget = _MAX_DRAWS_PER_TASK * count + 200
    if name == "codeio":
        # Ask for output prediction with probability 1 when only that mode is wanted. (reasoning-gym
        # 0.1.x uses the *output* template when random() < input_prediction_probability; the mode is
        # read back from the question below, so this only affects how many items get skipped.)
        config.setdefault("input_prediction_probability", 1.0 if codeio_modes == ("output",) else 0.5)
    try:
        dataset = rg.create_dataset(name, seed=seed, size=budget, **config)
    except (TypeError, AssertionError, ValueError) as exc:
        raise TaskError(f"reasoning-gym dataset {name!r} rejects config {config}: {exc}") from exc
    # CodeI/O samples are third-party code: their warnings are noise here, and some set the decimal
    # context (precision), which must not leak into the caller's thread.
    with warnings.catch_warnings(), decimal.localcontext():
        warnings.simplefilter("ignore")
        tasks = _draw_items(name, dataset, count, budget, seed=seed, holdout=holdout, holdout_every=holdout_every,
                            codeio_modes=codeio_modes)
    if len(tasks) < count:
        raise TaskError(
            f"reasoning-gym dataset {name!r} gave only {len(tasks)} of {count} usable distinct questions in "
            f"{budget} draws (config {config}, holdout {holdout!r}); widen its config or ask for fewer tasks."
        )
    return tasks


def _draw_items(name: str, dataset: Any, count: int, budget: int, *, seed: int, holdout: str | None,
                holdout_every: int, codeio_modes: tuple[str, ...]) -> list[Task]:
    seen: set[str] = set()
    tasks: list[Task] = []
    for index in range(budget):
        if len(tasks) == count:
            break
        if name == "codeio" and not codeio_sample_is_safe(codeio_sample(dataset, index)):
            continue  # never execute a sample that touches files, clocks, unseeded randomness, ...
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                raw = dataset[index]
        except Exception:  # noqa: BLE001, S112 - a broken item (e.g. CodeI/O output not JSON) is skipped
            continue
        question = raw["question"]
        if question in seen:
            continue
        if holdout is not None and _in_holdout(question, holdout_every) != (holdout == "only"):
            continue
        entry = _json_safe({"question": question, "answer": raw["answer"], "metadata": raw["metadata"]})
        if not _usable(name, entry, codeio_modes):
            continue
        sample = codeio_sample(dataset, index) if name == "codeio" else None
        if sample is not None and codeio_mode(entry) == "output" and not codeio_reproduces(sample, entry):
            continue
        seen.add(question)
        code, kind = reference_code(name, entry, sample=sample)
        metadata: dict[str, Any] = {
            "source": "reasoning_gym",
            "dataset": name,
            "seed": seed,
            "index": index,
            "task_id": f"rg/{name}/{seed}/{index}",
            "entry": entry,
            "reference_code": code,
            "reference_kind": kind,
        }
        if name == "codeio":
            metadata["codeio_mode"] = codeio_mode(entry)
        tasks.append(Task(id=metadata["task_id"], prompt=question, answer=entry["answer"], metadata=metadata))
    return tasks


def _usable(name: str, entry: Mapping[str, Any], codeio_modes: tuple[str, ...]) -> bool:
    """Whether a reasoning-gym item is a well-posed task whose reference code reproduces its answer."""
    answer, meta = entry["answer"], entry["metadata"]
    if not isinstance(answer, str) or not answer.strip():
        return False  # e.g. base_conversion of 0 into base 3 gives "" in reasoning-gym 0.1.x
    if name == "basic_arithmetic":
        # reasoning-gym evaluates '/' as floor division; ~1% of its expressions divide inexactly,
        # so their stated answer is not the value of the expression. Keep exact ones only.
        try:
            return str(_exact_value(meta["expression"])) == answer
        except (ValueError, ZeroDivisionError, SyntaxError, KeyError):
            return False
    if name == "base_conversion":
        return bool(meta.get("source_repr"))
    if name == "codeio":
        return codeio_mode(entry) in codeio_modes and meta.get("input_data") not in ({}, None)
    return True


def _exact_value(expression: str) -> Fraction:
    ops = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__,
           ast.Div: Fraction.__truediv__}

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported expression node {type(node).__name__}")

    return ev(ast.parse(expression, mode="eval").body)


def _json_safe(obj: Any) -> Any:
    """Convert a reasoning-gym entry to plain JSON types (tuples become lists, sets sorted lists)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((_json_safe(v) for v in obj), key=repr)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        try:
            return _json_safe(obj.item())
        except (TypeError, ValueError):
            pass
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays
        return _json_safe(obj.tolist())
    return str(obj)
