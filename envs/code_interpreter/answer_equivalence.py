"""Mathematical equivalence of two answers (SimpleTIR style), bounded in time and size.

Rewards must not depend on how an answer is written, so answers are compared by mathematical equivalence:
``1/2``, ``0.5`` and ``\\frac{1}{2}`` are the same answer; ``(1, 2)`` and ``(2, 1)`` are not.

Two parsers work together. A local one turns common LaTeX and plain syntax into SymPy (via
``parse_expr`` with a restricted namespace, never ``eval`` of the raw text) and handles numbers, expressions,
equations, tuples, intervals, sets and lists with rules we choose. math-verify is the fallback for the forms
the local parser does not know (matrices, ``\\pm``, inequalities, ...).

Model output is hostile input: ``9^9^9^9`` or ``factorial(10**9)`` would freeze or exhaust a process that
evaluated them. So every expression is first parsed *unevaluated* and its size bounded before SymPy may
evaluate it; math-verify, whose work cannot be bounded that way, only sees text with no operator that grows
numbers. math-verify's own timeouts use ``signal.alarm``, which only works in the main thread, but rollout
engines step envs in worker threads: its timeouts are disabled and the whole check instead runs in a helper
thread that is abandoned (and interrupted) after ``timeout_s``, counting as "not equivalent".
"""

from __future__ import annotations

import cmath
import ctypes
import functools
import keyword
import math
import re
import threading
from collections.abc import Callable
from typing import Any

import sympy
from math_verify import LatexExtractionConfig
from math_verify import parse as mv_parse
from math_verify import verify as mv_verify
from sympy.parsing.sympy_parser import (
    auto_number,
    auto_symbol,
    convert_xor,
    factorial_notation,
    implicit_multiplication,
    parse_expr,
)

from agentgym.envs.code_interpreter.answer_text import MAX_NESTING, normalize_answer, unit_of

__all__ = [
    "answers_equivalent", "is_hedged", "item_count", "MAX_ANSWER_CHARS", "MAX_LOG10", "REL_TOL", "split_top_level"
]

MAX_ANSWER_CHARS = 1000  # longer answers are only compared as text


MAX_LOG10 = 1000  # no number with more digits is built: one C-level step on it must stay short
REL_TOL = 1e-6  # for non-integer numbers; integers compare exactly
_HUGE_FLOAT = re.compile(r"\d\.?[eE][+-]?\d{4}")  # 1e999999999: parsing it alone takes minutes, holding the GIL


# ---------------------------------------------------------------- local parser


class _Unparsable(Exception):
    """The local parser does not know this form; math-verify may."""


class _TooCostly(Exception):
    """Evaluating this would build huge numbers, so the answer is refused rather than compared."""


_FUNCTIONS: dict[str, Any] = {
    **{name: getattr(sympy, name) for name in "sqrt exp log sin cos tan cot sec csc Abs factorial binomial".split()},
    "ln": sympy.log, "abs": sympy.Abs, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
}
_CONSTANTS: dict[str, Any] = {
    "pi": sympy.pi, "e": sympy.E, "E": sympy.E, "i": sympy.I, "I": sympy.I,
    "oo": sympy.oo, "inf": sympy.oo, "infty": sympy.oo, "infinity": sympy.oo,
}
_NAMES = {**_FUNCTIONS, **_CONSTANTS}
# Same names with inert functions, for the unevaluated parse that bounds sizes before anything is computed.
_INERT_NAMES = {**{name: sympy.Function(name) for name in _FUNCTIONS}, **_CONSTANTS}
_GROWING_FUNCTIONS = frozenset({"factorial", "binomial"})
_GLOBALS = {
    "__builtins__": {},
    **{cls.__name__: cls for cls in (sympy.Integer, sympy.Float, sympy.Symbol, sympy.Function, sympy.Add, sympy.Mul,
                                     sympy.Pow)},
}
_TRANSFORMS = (auto_symbol, auto_number, factorial_notation, convert_xor, implicit_multiplication)
_SAFE_TEXT = re.compile(r"[A-Za-z0-9_\s+\-*/().,!^]*")
_ATTRIBUTE = re.compile(r"[A-Za-z_)]\s*\.|\.\s*[A-Za-z_(]")

_ARG = r"\s*(?:\{([^{}]*)\}|([A-Za-z0-9]))"  # {group} or a single character, as in \frac12
_LATEX_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\\frac" + _ARG + _ARG), "(({})/({}))"),
    (re.compile(r"\\binom" + _ARG + _ARG), " binomial({},{})"),
    (re.compile(r"\\sqrt\s*\[([^\[\]{}]*)\]" + _ARG), "(({1})**(1/({0})))"),
    (re.compile(r"\\sqrt" + _ARG), " sqrt({})"),
    (re.compile(r"_\s*\{(\w*)\}"), "_{}"),
)
_LATEX_WORDS = {"cdot": "*", "times": "*", "div": "/", "pi": "pi", "infty": "oo", "ln": "log",
                **{name: name for name in ("log", "exp", "sin", "cos", "tan", "cot", "sec", "csc",
                                           "arcsin", "arccos", "arctan")}}


def _to_plain(latex: str) -> str:
    """LaTeX (or plain) math to SymPy syntax; unknown commands (``\\pm``, ``\\log_2``) are _Unparsable."""
    for _ in range(MAX_NESTING):  # innermost first: \frac{\sqrt{2}}{2} needs two passes
        before = latex
        for pattern, template in _LATEX_RULES:
            latex = pattern.sub(lambda m, t=template: t.format(*[g for g in m.groups() if g is not None]), latex)
        if latex == before:
            break
    latex = re.sub(r"\\([A-Za-z]+)(?![A-Za-z_])", lambda m: f" {_LATEX_WORDS.get(m[1], m[0])} ", latex)
    if "\\" in latex:
        raise _Unparsable(latex)
    return latex.replace("{", "(").replace("}", ")")


def _log_size(expr: sympy.Basic) -> float:
    """Upper bound on |log10 |value|| of an *unevaluated* expression (a symbol counts as 10).

    This is what makes evaluation safe: ``9^9^9^9``, ``10**10**10`` and ``factorial(10**9)`` get an infinite
    bound from their shape alone, without computing anything.
    """
    if not isinstance(expr, sympy.Expr):  # a tuple inside an expression: 9^9 * (1, 2) repeats it in Python
        raise _Unparsable(str(expr))
    if expr.is_Rational:
        return math.log10(max(abs(expr.p), expr.q, 1))
    if expr.is_Float:
        magnitude = abs(float(expr))
        return abs(math.log10(magnitude)) if 0 < magnitude < math.inf else (0.0 if magnitude == 0 else math.inf)
    if expr.is_Atom:
        return 1.0
    if expr.is_Pow:
        exponent = _log_size(expr.exp)
        return math.inf if exponent > 6 else _log_size(expr.base) * 10**exponent
    sizes = [_log_size(arg) for arg in expr.args]
    if getattr(expr.func, "__name__", "") in _GROWING_FUNCTIONS:
        n = max(sizes)  # n! has about n * log10(n) digits
        return math.inf if n > 5 else 10**n * (n + 1)
    return sum(sizes) + math.log10(max(len(sizes), 1))


def _parse(plain: str, names: dict[str, Any], evaluate: bool) -> sympy.Expr:
    try:
        value = parse_expr(plain, local_dict=dict(names), global_dict=dict(_GLOBALS),
                           transformations=_TRANSFORMS, evaluate=evaluate)
    except Exception as err:
        raise _Unparsable(plain) from err
    if not isinstance(value, sympy.Expr):  # a tuple, a bare function, a class name
        raise _Unparsable(plain)
    return value


def _sympify(plain: str) -> sympy.Expr:
    """SymPy value of plain math text: only safe characters and names, size bounded before evaluation."""
    words = re.findall(r"[A-Za-z_]\w*", plain)
    if not _SAFE_TEXT.fullmatch(plain) or "__" in plain or _ATTRIBUTE.search(plain) or any(map(keyword.iskeyword, words)):
        raise _Unparsable(plain)
    if _log_size(_parse(plain, _INERT_NAMES, evaluate=False)) > MAX_LOG10:
        raise _TooCostly(plain)
    return _parse(plain, _NAMES, evaluate=True)


@functools.lru_cache(maxsize=4096)
def _atom(text: str) -> sympy.Basic:
    """One expression, or an equation ``lhs = rhs`` (kept unevaluated)."""
    sides = text.split("=")
    if "!=" in text or len(sides) > 2:
        raise _Unparsable(text)
    exprs = [_sympify(_to_plain(side)) for side in sides]
    return exprs[0] if len(exprs) == 1 else sympy.Eq(*exprs, evaluate=False)


def split_top_level(text: str, sep: str) -> list[str]:
    """Split at ``sep`` outside any brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i].strip())
            start = i = i + len(sep)
            continue
        i += 1
    return [*parts, text[start:].strip()]


def _nesting(text: str) -> int | None:
    """Deepest bracket nesting, or None when brackets close before they open or stay open."""
    depth = deepest = 0
    for char in text:
        depth += (char in "([{") - (char in ")]}")
        deepest = max(deepest, depth)
        if depth < 0:
            return None
    return deepest if depth == 0 else None


def _value(text: str) -> Any:
    """An answer as a SymPy object, or ``(kind, brackets, items)``.

    Kinds: "seq" for tuples and intervals (ordered, the brackets must match: ``[1, 3)`` is not ``[1, 3]``) and
    "set" for ``{...}``, bare lists ``1, 2, 3`` and unions of intervals (unordered).
    """
    parts = split_top_level(text, "\\cup")
    if len(parts) > 1:
        return ("set", "", [_value(part) for part in parts])
    for left, right in (("\\{", "\\}"), ("{", "}")):
        inner = text[len(left) : -len(right)]
        if text.startswith(left) and text.endswith(right) and _nesting(inner) is not None:
            return ("set", "", [_value(item) for item in split_top_level(inner, ",") if item])
    items = split_top_level(text[1:-1], ",")
    if len(text) > 1 and text[0] in "([" and text[-1] in ")]" and _nesting(text[1:-1]) is not None and len(items) > 1:
        return ("seq", text[0] + text[-1], [_value(item) for item in items])
    items = split_top_level(text, ",")
    if len(items) > 1:
        return ("set", "", [_value(item) for item in items])
    return _atom(text)


# ---------------------------------------------------------------- comparison


def _same_expr(a: sympy.Expr, b: sympy.Expr) -> bool:
    if a == b:
        return True
    if a.free_symbols or b.free_symbols or a.is_Integer or b.is_Integer:  # symbolic, or integers: exact
        return bool(sympy.simplify(a - b) == 0)
    x, y = complex(a.evalf()), complex(b.evalf())
    return cmath.isfinite(x) and cmath.isfinite(y) and abs(x - y) <= REL_TOL * max(abs(x), abs(y))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or a[:2] != b[:2] or len(a[2]) != len(b[2]):
            return False
        if a[0] == "seq":
            return all(map(_same, a[2], b[2]))
        unmatched = list(b[2])
        for item in a[2]:
            k = next((k for k, other in enumerate(unmatched) if _same(item, other)), None)
            if k is None:
                return False
            del unmatched[k]
        return True
    if isinstance(a, sympy.Eq) or isinstance(b, sympy.Eq):
        if not (isinstance(a, sympy.Eq) and isinstance(b, sympy.Eq)):
            return False
        ratio = sympy.simplify((a.lhs - a.rhs) / (b.lhs - b.rhs))  # same equation up to a constant factor
        return bool(ratio.is_number and ratio.is_finite and ratio != 0)
    return _same_expr(a, b)


_TINY_POWER = re.compile(r"(?<=[A-Za-z0-9])\^(?:[A-Za-z0-9]|\{-?(?:\d{1,2}|[A-Za-z])\})(?!\s*\^)")
_GROWS = re.compile(r"\^|\*\*|!|binom|choose|factorial|gamma|Gamma")


def _math_verify(pred: str, gold: str) -> bool:
    """math-verify's verdict, for forms the local parser does not know.

    Its work cannot be bounded like ours, so it only sees text where no number can grow: no factorials, and
    powers only of a letter or short number by a letter or a number below 100 (``x^2``, ``e^{x}``). Only its
    LaTeX parser is used: its plain-expression parser evaluates Python, where ``(1,2)*9**9`` repeats a tuple.
    """
    if any(_GROWS.search(_TINY_POWER.sub("", text)) for text in (pred, gold)):
        return False
    parsed_gold, parsed_pred = (
        mv_parse(f"${text}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None) for text in (gold, pred)
    )
    return bool(parsed_gold and parsed_pred and mv_verify(parsed_gold, parsed_pred, timeout_seconds=None))


def _compare(pred: str, gold: str) -> bool:
    """Local verdict when both answers parse, else math-verify's; percentages read as the gold answer says.

    ``50`` and ``0.5`` both match a gold ``50%``; a predicted ``50%`` is 0.5 against a gold without ``%``.
    """
    p, g = pred.removesuffix("%").strip(), gold.removesuffix("%").strip()
    if gold.endswith("%"):
        readings = [(p, g)] if pred.endswith("%") else [(p, g), (p, f"({g})/100")]
    else:
        readings = [(f"({p})/100", g)] if pred.endswith("%") else [(pred, gold)]
    for p, g in readings:
        try:
            verdict = _same(_value(p), _value(g))
        except _Unparsable:
            verdict = _math_verify(p, g)
        if verdict:
            return True
    return False


# ---------------------------------------------------------------- time limit


class _Deadline(BaseException):
    """Raised inside an overrunning check; a BaseException so that SymPy's ``except Exception`` cannot eat it."""


def _call_with_deadline(fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
    """``fn(*args)`` in a helper thread; None if it raises or is still running after ``timeout_s``.

    Signals only work in the main thread and a thread cannot be killed, so an overrunning check is abandoned
    and sent an asynchronous exception, which stops pure-Python SymPy work at its next bytecode (the size
    bound keeps the C-level big-integer steps short). The lock makes sure it only hits this check's code.
    """
    result: list[Any] = []
    state = ["starting"]
    lock = threading.Lock()

    def run() -> None:
        try:
            with lock:
                if state[0] == "abandoned":
                    return
                state[0] = "running"
            try:
                result.append(fn(*args))
            finally:
                _finish()
        except BaseException:  # noqa: BLE001 - hostile-input errors or _Deadline: no verdict either way
            pass

    def _finish() -> None:
        # A _Deadline sent while fn ran may still be pending: delivered after run() returned it would escape as an
        # unhandled thread exception (pytest reports it in whatever test runs then). Mark the check finished, so no
        # more are sent, and clear any pending one in the same locked step; retry if one lands on the way in.
        while True:
            try:
                with lock:
                    state[0] = "finished"
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
                return
            except _Deadline:
                continue

    worker = threading.Thread(target=run, name="answer-check", daemon=True)
    worker.start()
    worker.join(min(max(timeout_s, 0.0), threading.TIMEOUT_MAX))
    for _ in range(10):  # resent: one raised inside a weakref callback or __del__ is printed and swallowed
        with lock:
            if state[0] == "starting":
                state[0] = "abandoned"
            if state[0] != "running":
                break
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_Deadline))
        worker.join(0.01)
    return result[0] if result else None


# ---------------------------------------------------------------- entry point

_BOOLEANS = {"true": True, "yes": True, "false": False, "no": False}


def answers_equivalent(predicted: str | None, gold: str, *, timeout_s: float = 2.0) -> bool:
    """Whether ``predicted`` is mathematically the same answer as ``gold`` (never raises).

    Accepts any spelling of the same value: numbers (integers exactly, others within a relative 1e-6),
    fractions, LaTeX, expressions (``simplify(a - b) == 0``), equations, tuples and intervals (ordered),
    sets and comma lists (unordered), percentages when the gold answer has ``%``, and text answers
    case-insensitively (``Yes``/``True`` are booleans). Two answers with different units (``5 m``, ``5 cm``)
    differ whatever their numbers; a unit on one side only is notation. A hedge (see :func:`is_hedged`) is never equivalent.
    Anything undecided within ``timeout_s`` seconds, too large to evaluate safely, longer than
    MAX_ANSWER_CHARS or nested deeper than MAX_NESTING is False: a reward must never hang a rollout worker.
    Safe to call from any thread.
    """
    try:
        if not isinstance(predicted, str) or not isinstance(gold, str):
            return False
        pred, ref = normalize_answer(predicted), normalize_answer(gold)
        if not pred or not ref:
            return False
        units = unit_of(predicted), unit_of(gold)
        if None not in units and units[0] != units[1]:  # "5 m" is no "5 cm", though both normalise to "5"
            return False
        if pred.casefold() == ref.casefold():
            return True
        if pred.casefold() in _BOOLEANS or ref.casefold() in _BOOLEANS:
            return _BOOLEANS.get(pred.casefold()) == _BOOLEANS.get(ref.casefold())
        for text in (pred, ref):
            depth = _nesting(text)
            if len(text) > MAX_ANSWER_CHARS or depth is None or depth > MAX_NESTING or _HUGE_FLOAT.search(text):
                return False
        if is_hedged(pred, ref):
            return False
        return _call_with_deadline(_compare, (pred, ref), timeout_s) is True
    except Exception:  # noqa: BLE001 - a reward check must never crash a rollout
        return False


# ---------------------------------------------------------------- hedges

_HEDGE_MARKS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bor\b|\\lor(?![A-Za-z])|\u2228|\|\|", re.IGNORECASE),  # "a or b"
    re.compile(r"\u00b1|\u2213|\\pm(?![A-Za-z])|\\mp(?![A-Za-z])|\+\s*/\s*-"),  # "\pm 3", "+/- 3"
    re.compile(r"[<>\u2264\u2265\u2260]|\\(?:le|ge|leq|geq|lt|gt|neq|ne)(?![A-Za-z])"),  # a bound, not a value
    re.compile(r"\b(?:either|maybe|perhaps|possibly|approximately|about|around|roughly)\b", re.IGNORECASE),
    re.compile(r"\u2248|\\approx(?![A-Za-z])|\\sim(?![A-Za-z])"),  # "~12" (kept as \u2248), "\approx 12": not exact
)


def item_count(text: str) -> int:
    """Top-level items of a list answer: ``1, 4 and 9`` has three, ``(1, 2)`` one."""
    return sum(len(split_top_level(part, " and ")) for chunk in split_top_level(text, ";") for part in split_top_level(chunk, ","))


def is_hedged(predicted: str, gold: str) -> bool:
    """Whether ``predicted`` offers several candidates where ``gold`` has one: always a wrong answer.

    A hedge is a word or sign that names alternatives, a range or an approximation (``or``, ``\\pm``, ``+/-``,
    ``<``, ``\\le``, ``maybe``, ``~12``, ``\\approx``) that the gold answer does not itself contain, or more top-level list items (``,``, ``;``,
    ``and``) than the gold answer has. Without this rule a policy learns to list every value it considers
    and a lenient parser picks the right one.
    """
    pred, ref = normalize_answer(predicted), normalize_answer(gold)
    if any(mark.search(pred) and not mark.search(ref) for mark in _HEDGE_MARKS):
        return True
    return item_count(pred) > item_count(ref)
