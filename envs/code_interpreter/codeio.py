"""CodeI/O samples: which are safe to run as reference code, and which reproduce their recorded answer."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import random
from collections.abc import Mapping
from typing import Any

__all__ = ["codeio_mode", "codeio_reproduces", "codeio_sample", "codeio_sample_is_safe"]

# ---- CodeI/O ----------------------------------------------------------------------------------
_CODEIO_OUTPUT_MARK = "Given the following input:"
_CODEIO_INPUT_MARK = "Given the following output:"


def codeio_mode(entry: Mapping[str, Any]) -> str:
    """Whether a CodeI/O question asks for the output of given inputs, for inputs that give an output, or neither."""
    question = entry["question"]
    if _CODEIO_OUTPUT_MARK in question:
        return "output"
    if _CODEIO_INPUT_MARK in question:
        return "input"
    return "unknown"


def codeio_sample(dataset: Any, index: int) -> Mapping[str, Any]:
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


def codeio_reproduces(sample: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
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
