"""Task data of the code-interpreter env: reasoning-gym problems and the CHAMP competition set.

Two task sources, both returning :class:`~agentgym.suite.Task` lists for ``TaskSuite.from_yaml``:

* :func:`generate_tasks` draws problems from `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_
  datasets (arithmetic, GSM-symbolic word problems, linear equations, fractions, primes, letter
  counting, base conversion, CodeI/O). Every task carries the reasoning-gym entry (its metadata is
  what the per-kind graders read: the variable, the reduced fraction, the prime factors, the target
  base) and ``reference_code``: a standalone Python program that *computes* the answer from the
  problem's parameters and prints it in the form reasoning-gym states it.
* :func:`champ_tasks` loads the 270 problems of the CHAMP competition-math dataset.

:func:`agentgym.envs.code_interpreter.answers.grade_answer` grades a final answer for either source
(reasoning-gym's own scorers are not used: they reject correct forms and accept hedged answers).

Split hygiene: each split names its own reasoning-gym ``seed`` (reasoning-gym item ``i`` of a dataset
is ``Random(seed + i)``, so seeds of different splits must lie far apart), and ``holdout`` partitions
the question space by a hash of the question text, so a ``holdout: only`` split (test) can never
contain a question of a ``holdout: exclude`` split (train), whatever their seeds.
"""

from __future__ import annotations

import ast
import contextlib
import decimal
import functools
import hashlib
import io
import json
import math
import random
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from agentgym.errors import DependencyNotInstalled, TaskError
from agentgym.suite import Task

__all__ = [
    "CHAMP_SIZE",
    "DATASETS",
    "champ_tasks",
    "codeio_sample_is_safe",
    "generate_tasks",
    "reference_code",
]

#: The reasoning-gym datasets this module knows how to write reference code for.
DATASETS: tuple[str, ...] = (
    "basic_arithmetic",
    "gsm_symbolic",
    "simple_equations",
    "fraction_simplification",
    "count_primes",
    "prime_factorization",
    "letter_counting",
    "base_conversion",
    "codeio",
)
#: Datasets whose reference code only prints the known answer (see :func:`reference_code`).
LITERAL_DATASETS = frozenset({"gsm_symbolic"})
CHAMP_SIZE = 270

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
        if name == "codeio" and not codeio_sample_is_safe(_codeio_sample(dataset, index)):
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
        sample = _codeio_sample(dataset, index) if name == "codeio" else None
        if sample is not None and _codeio_mode(entry) == "output" and not _codeio_reproduces(sample, entry):
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
            metadata["codeio_mode"] = _codeio_mode(entry)
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
        return _codeio_mode(entry) in codeio_modes and meta.get("input_data") not in ({}, None)
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


# ---- CodeI/O ----------------------------------------------------------------------------------
_CODEIO_OUTPUT_MARK = "Given the following input:"
_CODEIO_INPUT_MARK = "Given the following output:"


def _codeio_mode(entry: Mapping[str, Any]) -> str:
    question = entry["question"]
    if _CODEIO_OUTPUT_MARK in question:
        return "output"
    if _CODEIO_INPUT_MARK in question:
        return "input"
    return "unknown"


def _codeio_sample(dataset: Any, index: int) -> Mapping[str, Any]:
    """The CodeI/O record reasoning-gym will use for item ``index`` (it draws ``Random(seed+i).choice``)."""
    data = type(dataset)._jsonl_data
    return random.Random(dataset.seed + index).choice(data)


# Modules a CodeI/O sample may import: pure computation, deterministic, no I/O.
_CODEIO_MODULES = frozenset({
    "abc", "array", "base64", "bisect", "calendar", "cmath", "collections", "copy", "dataclasses", "datetime",
    "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq", "ipaddress", "itertools", "json",
    "math", "numbers", "numpy", "operator", "queue", "random", "re", "statistics", "string", "struct",
    "sympy", "textwrap", "types", "typing",
})
_CODEIO_BAD_NAMES = frozenset({
    "open", "eval", "exec", "input", "__import__", "compile", "globals", "locals", "vars", "hash", "id",
    "breakpoint", "exit", "quit", "getattr", "setattr", "delattr", "memoryview", "set", "frozenset",
})
_CODEIO_BAD_ATTRS = frozenset({
    "now", "today", "utcnow", "time", "perf_counter", "monotonic", "process_time",  # clocks
    "seterr", "set_printoptions", "setrecursionlimit", "setcontext",  # process-wide settings
})


def _is_bad_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in _CODEIO_BAD_NAMES


def codeio_sample_is_safe(sample: Mapping[str, Any]) -> bool:
    """Whether a CodeI/O record may be executed and gives the same output in every process.

    Both its ``code_sample`` and its ``input_generator`` must import only pure-computation modules
    (standard library, numpy, sympy), call no I/O or introspection builtins, read no clock, use no
    unseeded ``random``/``numpy.random`` (the input generator gets a seeded ``rng`` argument), and
    build no ``set`` (the iteration order of a set of strings changes between processes).
    """
    for part in (sample.get("code_sample", ""), sample.get("input_generator", "")):
        try:
            tree = ast.parse(part)
        except (SyntaxError, ValueError):
            return False
        random_names, numpy_names = {"random"}, {"np", "numpy"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "random" and alias.asname:
                        random_names.add(alias.asname)
                    if alias.name == "numpy" and alias.asname:
                        numpy_names.add(alias.asname)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                if any(alias.name.split(".")[0] not in _CODEIO_MODULES for alias in node.names):
                    return False
                if any(alias.name == "numpy.random" for alias in node.names):
                    return False
            elif isinstance(node, ast.ImportFrom):
                if node.level or (node.module or "").split(".")[0] not in _CODEIO_MODULES:
                    return False
                if node.module == "random" and any(alias.name != "Random" for alias in node.names):
                    return False
                if (node.module or "").startswith("numpy.random"):
                    return False
            elif isinstance(node, (ast.Set, ast.SetComp)) or _is_bad_name(node):
                return False
            elif isinstance(node, ast.Attribute):
                if node.attr in _CODEIO_BAD_ATTRS or node.attr.startswith("__"):
                    return False
                base = node.value
                if isinstance(base, ast.Name) and base.id in random_names and node.attr != "Random":
                    return False
                if node.attr == "random" and isinstance(base, ast.Name) and base.id in numpy_names:
                    return False
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Random"
                  and not node.args and not node.keywords):
                return False  # Random() seeded from the clock
    return "def main_solution" in sample.get("code_sample", "")


def _codeio_reproduces(sample: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Whether running the sample on the *stated* input (after a JSON round trip) gives the stated output.

    Catches items whose stated input is not what the function saw (reasoning-gym formats the input
    after ``main_solution`` ran, so a function that mutates its arguments shows a mutated input),
    inputs that do not survive JSON (tuples, integer keys) and nondeterministic functions.
    """
    scope: dict[str, Any] = {"__name__": "codeio_reference"}
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            # vetted by codeio_sample_is_safe; reasoning-gym already ran this very code to make the item
            exec(compile(sample["code_sample"], "<codeio>", "exec"), scope)  # noqa: S102
            inputs = json.loads(json.dumps(entry["metadata"]["input_data"]))
            return json.dumps(scope["main_solution"](**inputs)) == entry["answer"]
    except Exception:  # noqa: BLE001 - any failure means the item is not reproducible
        return False


# ---- reference code ---------------------------------------------------------------------------
def _lit(value: Any) -> str:
    """A Python literal for ``value`` in pure ASCII (safe to pass through ``python -c``)."""
    return ascii(value)


def reference_code(name: str, entry: Mapping[str, Any], *, sample: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """A standalone program printing the answer of a reasoning-gym ``entry``, and its kind.

    Returns ``(code, kind)``: ``kind`` is ``"computed"`` when the program derives the answer from the
    problem's parameters, ``"literal"`` when it prints the known answer because the entry does not
    carry enough to recompute it (gsm_symbolic; CodeI/O input prediction). The code uses only the
    standard library (plus the CodeI/O sample's own imports: standard library and numpy/sympy).
    """
    meta = entry["metadata"]
    answer = entry["answer"]
    if name == "basic_arithmetic":
        return _BASIC_ARITHMETIC.format(expression=_lit(meta["expression"])), "computed"
    if name == "simple_equations":
        return _SIMPLE_EQUATIONS.format(equation=_lit(meta["equation"]), variable=_lit(meta["variable"])), "computed"
    if name == "fraction_simplification":
        return _FRACTION.format(num=int(meta["numerator"]), den=int(meta["denominator"]),
                                style=_lit(meta["style"])), "computed"
    if name == "count_primes":
        return _COUNT_PRIMES.format(start=int(meta["start"]), end=int(meta["end"])), "computed"
    if name == "prime_factorization":
        return _PRIME_FACTORIZATION.format(number=int(meta["number"])), "computed"
    if name == "letter_counting":
        text = " ".join(meta["span"])
        return _LETTER_COUNTING.format(text=_lit(text), letter=_lit(meta["target_letter"])), "computed"
    if name == "base_conversion":
        return _BASE_CONVERSION.format(source=_lit(meta["source_repr"]), source_base=int(meta["source_base"]),
                                       target_base=int(meta["target_base"])), "computed"
    if name == "codeio" and sample is not None and _codeio_mode(entry) == "output":
        inputs = json.dumps(meta["input_data"], sort_keys=False)
        return _CODEIO_OUTPUT.format(code=sample["code_sample"].rstrip(), inputs=_lit(inputs)), "computed"
    if name == "gsm_symbolic":
        return _GSM_LITERAL.format(answer=_lit(answer)), "literal"
    if name == "codeio":
        return _CODEIO_INPUT_LITERAL.format(answer=_lit(answer)), "literal"
    raise TaskError(f"No reference code for reasoning-gym dataset {name!r}; known: {list(DATASETS)}.")


_BASIC_ARITHMETIC = '''\
# basic_arithmetic: evaluate the expression exactly (fractions), then print the integer value.
import ast
import operator
from fractions import Fraction

expression = {expression}
OPS = {{ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}}


def value(node):
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
    return OPS[type(node.op)](value(node.left), value(node.right))


result = value(ast.parse(expression, mode="eval").body)
print(result.numerator if result.denominator == 1 else result)
'''

_SIMPLE_EQUATIONS = '''\
# simple_equations: the unknown occurs once, scaled by constants, so lhs - rhs is linear in it:
# f(v) = f(0) + v * (f(1) - f(0)); solve f(v) = 0 exactly with fractions.
from fractions import Fraction

equation = {equation}
variable = {variable}
lhs, rhs = equation.split("=")


def f(v):
    scope = {{variable: Fraction(v)}}
    return eval(lhs, {{"__builtins__": {{}}}}, scope) - eval(rhs, {{"__builtins__": {{}}}}, scope)


solution = -f(0) / (f(1) - f(0))
print(solution.numerator if solution.denominator == 1 else solution)
'''

_FRACTION = '''\
# fraction_simplification: divide by the gcd; print in the notation the question used.
from math import gcd

numerator, denominator, style = {num}, {den}, {style}
g = gcd(numerator, denominator)
n, d = numerator // g, denominator // g
formats = {{
    "plain": "{{n}}/{{d}}",
    "latex_inline": "${{n}}/{{d}}$",
    "latex_frac": "$\\\\frac{{{{{{n}}}}}}{{{{{{d}}}}}}$",
    "latex_dfrac": "$\\\\dfrac{{{{{{n}}}}}}{{{{{{d}}}}}}$",
}}
print(formats[style].format(n=n, d=d))
'''

_COUNT_PRIMES = '''\
# count_primes: sieve of Eratosthenes up to the end of the range, count the primes in [start, end].
start, end = {start}, {end}
is_prime = bytearray([1]) * (end + 1)
is_prime[:2] = bytes(min(2, end + 1))
for p in range(2, int(end ** 0.5) + 1):
    if is_prime[p]:
        is_prime[p * p :: p] = bytes(len(range(p * p, end + 1, p)))
print(sum(is_prime[start : end + 1]))
'''

_PRIME_FACTORIZATION = '''\
# prime_factorization: trial division; factors in increasing order joined by " \\u00d7 ".
n = {number}
factors = []
d = 2
while d * d <= n:
    while n % d == 0:
        factors.append(d)
        n //= d
    d += 1
if n > 1:
    factors.append(n)
print(" \\u00d7 ".join(map(str, factors)))
'''

_LETTER_COUNTING = '''\
# letter_counting: count the letter in the text, ignoring case.
text = {text}
letter = {letter}
print(text.lower().count(letter.lower()))
'''

_BASE_CONVERSION = '''\
# base_conversion: parse in the source base, write in the target base (digits above 9 as a-z).
source, source_base, target_base = {source}, {source_base}, {target_base}
value = int(source, source_base)
digits = "0123456789abcdefghijklmnopqrstuvwxyz"
out = ""
while value:
    value, r = divmod(value, target_base)
    out = digits[r] + out
print(out or "0")
'''

_CODEIO_OUTPUT = '''\
# codeio (output prediction): run the task's reference function on the given input and print its
# return value as JSON.
{code}


import contextlib as _contextlib
import io as _io
import json as _json

_inputs = _json.loads({inputs})
with _contextlib.redirect_stdout(_io.StringIO()):
    _result = main_solution(**_inputs)
print(_json.dumps(_result))
'''

_GSM_LITERAL = '''\
# gsm_symbolic: LITERAL reference. reasoning-gym's metadata holds the template's variable values but
# not the formula linking them (each of its ~100 word-problem templates has its own), so the answer
# cannot be recomputed generically; this program prints the known answer.
print({answer})
'''

_CODEIO_INPUT_LITERAL = '''\
# codeio (input prediction): LITERAL reference. Many inputs may give the stated output, but
# reasoning-gym only gives full score to the one its input generator drew, which the task does
# not determine; this program prints that input.
print({answer})
'''


# ---- CHAMP ------------------------------------------------------------------------------------
_CHAMP_PREFIXES = (
    r"the limit exists and is equal to\s+",
    r"the only possible value for the limit is\s+",
)
_CHAMP_EQUIV = re.compile(r"^(?P<main>.+?),\s+or (?:equivalently|an equivalent form such as)\s+(?P<alt>.+)$")
_CHAMP_APPROX = re.compile(r"^(?P<main>.+?),\s+or approximately\s+.+$")
_CHAMP_ONLY_VALUE = re.compile(r"^(?P<main>-?\d+) is the only possible value$")
_CHAMP_AT_MOST = re.compile(r"^at most (?P<main>\d+)\b", flags=re.IGNORECASE)
_CHAMP_COUNT_UNIT = re.compile(r"^(?P<main>\d+)\s+(?:values|inequalities|pairs|roots)$")
_CHAMP_REMARK = re.compile(r"\s+\((?:i\.e\.|no |none )")  # "100 (i.e., all values)", "0 (no such ...)"


def _champ_short_answers(raw_answer: str) -> list[str]:
    """The short form(s) of a CHAMP answer, the one to show first.

    CHAMP has one ``answer`` field, sometimes a sentence (``"The limit exists and is equal to
    @@2/3@@"``, ``"@@C(10, 5)@@, or equivalently @@252@@"``, ``"100 (i.e., all values)"``); ``@@``
    marks its math spans. These rules peel the sentence down to the value; answers they do not
    match (``"No integer solutions"``, ``"x=2, y=1"``) stay whole. Of two equivalent forms the
    plain number or the closed form (not ``C(n, k)`` or ``sum_(...)``) comes first.
    """
    text = raw_answer.replace("@@", "").strip()
    remark = _CHAMP_REMARK.search(text)
    if remark and text.endswith(")"):
        text = text[: remark.start()].strip()
    for prefix in _CHAMP_PREFIXES:
        m = re.match(prefix, text, flags=re.IGNORECASE)
        if m:
            return [text[m.end():].strip()]
    m = _CHAMP_EQUIV.match(text)
    if m:
        main, alt = m["main"].strip(), m["alt"].strip()
        if re.fullmatch(r"-?\d+", alt) or "C(" in main or "sum_" in main:
            return [alt, main]
        return [main, alt]
    for pattern in (_CHAMP_APPROX, _CHAMP_ONLY_VALUE, _CHAMP_AT_MOST, _CHAMP_COUNT_UNIT):
        m = pattern.match(text)
        if m:
            return [m["main"].strip()]
    return [text]


_CHAMP_LITERAL = """\
# CHAMP: LITERAL reference. A competition problem (often proof-based) whose answer no short program
# derives generically; this program prints the dataset's answer.
print({answer})
"""


@functools.lru_cache(maxsize=2)
def _champ_problems(version: str) -> tuple[Mapping[str, Any], ...]:
    try:
        import champ_dataset
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise DependencyNotInstalled("champ-dataset", "code", "the champ task suite") from exc
    dataset = champ_dataset.load(version)
    problems = []
    for pid, problem in dataset.problems.items():
        steps = problem.solution.steps if problem.solution and problem.solution.steps else []
        problems.append({
            "problem_id": pid,
            "category": problem.category,
            "text": problem.text,
            "answer": problem.answer,
            "raw_answer": problem.raw_answer,
            "solution": "\n".join(step.text for step in steps),
        })
    return tuple(problems)


def champ_tasks(rng: random.Random, count: int = CHAMP_SIZE, *, version: str = "v0") -> list[Task]:
    """The CHAMP competition problems (270 in ``v0``), in dataset order.

    ``count`` below the dataset size takes a sample drawn by ``rng`` (kept in dataset order).
    Each task's ``answer`` is the short form of CHAMP's answer (see :func:`_champ_short_answers`);
    the dataset's own sentence is ``metadata["full_answer"]`` and all accepted forms are
    ``metadata["answer_alternatives"]``. The reference code prints the answer literally: CHAMP
    problems are competition/proof problems whose answer no short program derives generically.
    """
    problems = _champ_problems(version)
    if count > len(problems):
        raise TaskError(f"CHAMP {version} has {len(problems)} problems; cannot take {count}.")
    chosen = range(len(problems)) if count == len(problems) else sorted(rng.sample(range(len(problems)), count))
    tasks = []
    for i in chosen:
        p = problems[i]
        forms = _champ_short_answers(p["raw_answer"])
        answer = forms[0]
        metadata = {
            "source": "champ",
            "problem_id": p["problem_id"],
            "task_id": f"champ/{version}/{p['problem_id']}",
            "category": p["category"],
            "full_answer": p["answer"],
            "answer_alternatives": forms,
            "solution": p["solution"],
            "reference_code": _CHAMP_LITERAL.format(answer=_lit(answer)),
            "reference_kind": "literal",
        }
        tasks.append(Task(id=metadata["task_id"], prompt=p["text"], answer=answer, metadata=metadata))
    return tasks
