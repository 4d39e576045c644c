"""Final-answer extraction and equivalence checking for the code-interpreter env (SimpleTIR style).

The model ends its turn with ``\\boxed{...}`` or ``<answer>...</answer>``. Rewards must not depend on how
an answer is written, so answers are compared by mathematical equivalence: ``1/2``, ``0.5`` and
``\\frac{1}{2}`` are the same answer; ``(1, 2)`` and ``(2, 1)`` are not.

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

import ast
import cmath
import ctypes
import functools
import json
import keyword
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from agentgym.suite import Task

__all__ = [
    "answers_equivalent",
    "extract_final_answer",
    "final_answer_candidates",
    "grade_answer",
    "has_final_answer",
    "is_hedged",
    "normalize_answer",
    "number_value",
    "task_kind",
]

MAX_ANSWER_CHARS = 1000  # longer answers are only compared as text
MAX_NESTING = 30  # brackets deeper than this are only compared as text
MAX_LOG10 = 1000  # no number with more digits is built: one C-level step on it must stay short
REL_TOL = 1e-6  # for non-integer numbers; integers compare exactly
_HUGE_FLOAT = re.compile(r"\d\.?[eE][+-]?\d{4}")  # 1e999999999: parsing it alone takes minutes, holding the GIL

# ---------------------------------------------------------------- extraction


_BOX = re.compile(r"\\(?:boxed|fbox)(?:\s*(\{)|[ \t]+([^$\n]*))?")


class _Truncated(Exception):
    """A box whose braces never close: the model was cut off before it finished its answer."""


def _box_at(text: str, start: int) -> tuple[int, str | None]:
    """(end, content) of the ``\\boxed``/``\\fbox`` at ``start``; content None for a bare ``\\boxed``.

    Raises _Truncated when the braces never close.
    """
    match = _BOX.match(text, start)
    if not match[1]:  # "\boxed 42$", or a bare "\boxed" that holds nothing
        return match.end(), (match[2] or "").strip() or None
    depth, i = 1, match.end()
    while i < len(text):
        if text[i] == "\\":
            i += 2  # escaped \{ and \} are content, not delimiters
            continue
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return i + 1, text[match.end() : i].strip()
        i += 1
    raise _Truncated


_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_HEDGE_SHOWN = 10  # distinct answers kept in a hedge's joined text (any two already make it wrong)
HEDGE_JOINER = " or "  # distinct final answers are joined with this, so that graders see (and reject) a hedge


def final_answer_candidates(text: str) -> list[str] | None:
    """Every final answer in ``text`` (boxes, ``\\boxed{}`` included, and ``<answer>`` tags) in order.

    None when a box never closes: a truncated answer means the text has no usable answer at all.
    """
    found: list[tuple[int, str]] = [(m.start(), m[1].strip()) for m in _TAG.finditer(text)]
    position = 0
    while (match := _BOX_START.search(text, position)) is not None:
        try:
            end, content = _box_at(text, match.start())
        except _Truncated:
            return None
        if content is not None:
            found.append((match.start(), content))
        position = max(end, match.end())
    return [content for _, content in sorted(found, key=lambda item: item[0])]


def extract_final_answer(text: str) -> str | None:
    """The answer the model committed to, or None when it gave none.

    That is the content of ``\\boxed{...}`` (also ``\\fbox{...}`` and ``\\boxed 42``), with nested braces
    balanced, or of ``<answer>...</answer>``; stripped. A box whose braces never close is a truncated answer,
    so it gives None rather than an earlier box. Several final answers that differ (``\\boxed{5}``, then
    ``\\boxed{6}``; ``final_answer`` called in a loop) are a hedge, not a commitment: they come back joined
    by " or " so that every grader rejects them, instead of letting the last of many guesses count.
    """
    if not isinstance(text, str):
        return None
    candidates = final_answer_candidates(text)
    if not candidates:
        return None
    distinct: dict[str, str] = {}
    for content in candidates:
        distinct.setdefault("".join(normalize_answer(content).casefold().split()), content)
        if len(distinct) > MAX_HEDGE_SHOWN:  # a hedge already; the rest need no normalizing
            break
    if len(distinct) > 1:
        return HEDGE_JOINER.join(distinct.values())
    return candidates[-1]


def _unwrap_answers(text: str) -> str:
    """``text`` with every box and ``<answer>`` tag replaced by its content (``\\boxed{252} or 126`` keeps
    its ``or 126``: an answer that holds a box is judged whole, never cut down to the box)."""
    text = text.replace("<answer>", " ").replace("</answer>", " ")
    for _ in range(MAX_NESTING):  # nested boxes unwrap one level per pass; hostile depth is left as text
        match = _BOX_START.search(text)
        if match is None:
            break
        try:
            end, content = _box_at(text, match.start())
        except _Truncated:
            break
        text = text[: match.start()] + f" {content or ''} " + text[end:]
    return text.strip()


def has_final_answer(text: str) -> bool:
    """Cheap format check (SimpleTIR's is the substring ``\\boxed{``); a closed ``<answer>`` tag also counts."""
    if not isinstance(text, str):
        return False
    tag_start = text.find("<answer>")
    return "\\boxed{" in text or (tag_start >= 0 and text.find("</answer>", tag_start) >= 0)


# ---------------------------------------------------------------- normalization

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])\.?")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SINGLE_VARIABLE_EQUATION = re.compile(r"(?:[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*=\s*([^=]+)")
_NUMBER_WITH_UNITS = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?)\s*([A-Za-z][A-Za-z ]*?)(?:\^\{?[23]\}?)?")
_UNITS = frozenset("mm cm m km meter meters inch inches ft feet mile miles mph kg g grams lb pounds sec seconds "
                   "minutes hours days weeks years dollars cents degrees units square sq cubic".split())


def normalize_answer(text: str) -> str:
    """Canonical spelling of an answer, so that cosmetic differences never reach the math comparison.

    Unwraps ``\\boxed{}`` and ``<answer>`` tags, drops ``$``, ``\\text{}``-like wrappers, ``\\left``/``\\right``, LaTeX spacing, degree marks and a trailing
    period; spells ``\\dfrac``/``\\tfrac`` as ``\\frac`` and ``\\%`` as ``%``; turns ``1,000`` into ``1000``
    (a whole-string number only, so the tuple ``(1,2)`` is kept); drops unit words after a plain number
    (``5 cm``, known units only: dropping words elsewhere could change the answer); and reduces ``x = 3`` to
    ``3`` when the left side is a single variable (an equation like ``x + y = 3`` is kept).
    """
    if not isinstance(text, str):
        return ""
    s = _unwrap_answers(text.strip())
    s = s.replace("\\$", "").replace("$", "").replace("\\displaystyle", "").replace("\u2212", "-")
    s = re.sub(r"\\[()\[\]]", "", s)
    for _ in range(MAX_NESTING):  # innermost first: \text{\textbf{5}}
        s, count = _TEXT_MACRO.subn(r"\1", s)
        if not count:
            break
    s = _DEGREES.sub("", _LEFT_RIGHT.sub("", s))
    s = re.sub(r"\\[!,]", "", s)
    s = re.sub(r"\\[;: ]|\\q?quad(?![A-Za-z])|~", " ", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s).replace("\\%", "%").replace("{,}", ",")
    s = " ".join(s.split()).removesuffix(".").strip()
    if match := _SINGLE_VARIABLE_EQUATION.fullmatch(s):
        s = match[1].strip()
    match = _NUMBER_WITH_UNITS.fullmatch(s)
    if match and all(word.lower() in _UNITS for word in match[2].split()):
        s = match[1]
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s


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


def _split_top(text: str, sep: str) -> list[str]:
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
    parts = _split_top(text, "\\cup")
    if len(parts) > 1:
        return ("set", "", [_value(part) for part in parts])
    for left, right in (("\\{", "\\}"), ("{", "}")):
        inner = text[len(left) : -len(right)]
        if text.startswith(left) and text.endswith(right) and _nesting(inner) is not None:
            return ("set", "", [_value(item) for item in _split_top(inner, ",") if item])
    items = _split_top(text[1:-1], ",")
    if len(text) > 1 and text[0] in "([" and text[-1] in ")]" and _nesting(text[1:-1]) is not None and len(items) > 1:
        return ("seq", text[0] + text[-1], [_value(item) for item in items])
    items = _split_top(text, ",")
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
    case-insensitively (``Yes``/``True`` are booleans). A hedge (see :func:`is_hedged`) is never equivalent.
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
    re.compile(r"\b(?:either|maybe|perhaps|possibly|approximately)\b", re.IGNORECASE),
)


def _item_count(text: str) -> int:
    """Top-level items of a list answer: ``1, 4 and 9`` has three, ``(1, 2)`` one."""
    return sum(len(_split_top(part, " and ")) for chunk in _split_top(text, ";") for part in _split_top(chunk, ","))


def is_hedged(predicted: str, gold: str) -> bool:
    """Whether ``predicted`` offers several candidates where ``gold`` has one: always a wrong answer.

    A hedge is a word or sign that names alternatives or a range (``or``, ``\\pm``, ``+/-``, ``<``, ``\\le``,
    ``maybe``) that the gold answer does not itself contain, or more top-level list items (``,``, ``;``,
    ``and``) than the gold answer has. Without this rule a policy learns to list every value it considers
    and a lenient parser picks the right one.
    """
    pred, ref = normalize_answer(predicted), normalize_answer(gold)
    if any(mark.search(pred) and not mark.search(ref) for mark in _HEDGE_MARKS):
        return True
    return _item_count(pred) > _item_count(ref)


# ---------------------------------------------------------------- grading by task kind
#
# Every task kind has its own grader: the answer must be the value the task asks for, in the structure it
# asks for, written in any equivalent notation. Dataset scorers are not used: reasoning-gym's rejected
# correct answers ("12271.0", "12,271", "h = 58", "2^2 x 59") and accepted hedged ones.

MAX_LITERAL_CHARS = 100  # a number, fraction, factorisation or numeral is never longer than this
MAX_CODEIO_CHARS = 100_000  # CodeI/O outputs can be long lists; longer answers are wrong, not parsed
CODEIO_REL_TOL = 1e-9  # CodeI/O floats: the same output up to float rounding (BLAS threads change last digits)

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,2})?")
_FRACTION = re.compile(r"([+-]?)\s*(?:\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|\\frac(\d)(\d)|(\d+)\s*/\s*(\d+))")
_ASSIGNMENT = re.compile(r"\s*([A-Za-z])\s*=\s*(.+)", re.DOTALL)


def _reduced_fraction(text: str) -> tuple[int, int] | None:
    """(numerator, denominator) of ``a/b``, ``\\frac{a}{b}`` or ``-\\frac ab`` as written (not reduced)."""
    match = _FRACTION.fullmatch(text)
    if match is None:
        return None
    num, den = (int(g) for g in [g for g in match.groups()[1:] if g is not None])
    return (-num if match[1] == "-" else num), den


def number_value(answer: str, *, variable: str | None = None) -> Fraction | None:
    """The exact value of an answer that is one number, or None when it is anything else.

    A number is an integer or decimal (``12271``, ``12271.0``, ``1.2271e4``, ``12,271``, ``-3``), or a
    fraction in lowest terms (``7/2``, ``\\frac{7}{2}``), optionally as ``v = 12271`` (with ``variable``,
    only that variable), in ``$...$``/``\\text{}`` and with a known unit word. An expression (``27*42``,
    ``28/2``) is not a number: the task asks for the computed value, as "simplify" asks for the reduced
    form, and accepting the question's own expression would reward echoing it.
    """
    if not isinstance(answer, str) or len(answer) > MAX_LITERAL_CHARS:
        return None
    answer = answer.replace("$", "")
    assignment = _ASSIGNMENT.fullmatch(answer)
    if assignment:  # before normalize_answer, which drops any single-letter "x ="
        if variable is not None and assignment[1] != variable:
            return None
        answer = assignment[2]
    if "=" in answer:  # "x_1 = 5", "a = b = 5": not one value of the unknown asked for
        return None
    text = normalize_answer(answer)
    if _NUMBER.fullmatch(text):
        try:
            return Fraction(Decimal(text))
        except (InvalidOperation, ValueError):
            return None
    fraction = _reduced_fraction(text)
    if fraction is None or fraction[1] < 2 or math.gcd(*fraction) != 1:
        return None
    return Fraction(*fraction)


def _grade_number(task: Task, answer: str, timeout_s: float) -> bool:
    entry_meta = _entry_metadata(task)
    predicted = number_value(answer, variable=entry_meta.get("variable"))
    return predicted is not None and predicted == Fraction(Decimal(str(task.answer).strip()))


def _grade_fraction(task: Task, answer: str, timeout_s: float) -> bool:
    """The reduced fraction only: ``62/165`` in any notation; ``124/330`` or ``0.3757...`` is not it."""
    meta = _entry_metadata(task)
    gold = (int(meta["simplified_numerator"]), int(meta["simplified_denominator"]))
    text = normalize_answer(answer) if len(answer) <= MAX_LITERAL_CHARS else ""
    if gold[1] == 1 and re.fullmatch(r"[+-]?\d+", text):
        return int(text) == gold[0]
    return _reduced_fraction(text) == gold


_TIMES = re.compile(r"\\times(?![A-Za-z])|\\cdot(?![A-Za-z])|\u00d7|\u00b7|\u22c5|\*|\s+x\s+")
_PRIME_POWER = re.compile(r"(\d{1,18})(?:\s*\^\s*(?:\{\s*(\d{1,2})\s*\}|(\d{1,2})))?")


def _grade_prime_factorization(task: Task, answer: str, timeout_s: float) -> bool:
    """The multiset of primes, in any order and notation: ``2 x 2 x 59``, ``2^2 \\times 59``, ``2**2*59``.

    ``4 x 59`` (4 is not prime), ``236``, a missing or an extra factor, and a list ``2, 2, 59`` are wrong.
    """
    meta = _entry_metadata(task)
    text = normalize_answer(answer).replace("**", "^") if len(answer) <= MAX_LITERAL_CHARS else ""
    text = re.sub(rf"^\s*{int(meta['number'])}\s*=", "", text)  # "236 = 2^2 x 59"
    factors: list[int] = []
    for part in _TIMES.split(text):
        match = _PRIME_POWER.fullmatch(part.strip())
        if match is None:
            return False
        prime, power = int(match[1]), int(match[2] or match[3] or 1)
        if power < 1 or not sympy.isprime(prime):
            return False
        factors += [prime] * power
    return sorted(factors) == sorted(int(f) for f in meta["factors"])


_BASE_PREFIXES = {16: "0x", 8: "0o", 2: "0b"}
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _grade_base_conversion(task: Task, answer: str, timeout_s: float) -> bool:
    """The numeral in the target base, digits in either case; ``0x``/``0o``/``0b`` and a ``_{16}`` subscript
    only when they name the target base (in base 16 ``0b1`` is a hexadecimal numeral, so it keeps its 0b)."""
    base = int(_entry_metadata(task)["target_base"])
    text = "".join(normalize_answer(answer).casefold().split()) if len(answer) <= MAX_LITERAL_CHARS else ""
    subscript = re.fullmatch(r"\(?([0-9a-z]+)\)?_\{?\(?(\d+)\)?\}?", text)
    if subscript:
        if int(subscript[2]) != base:
            return False
        text = subscript[1]
    prefix = _BASE_PREFIXES.get(base)
    if prefix and text.startswith(prefix) and len(text) > len(prefix):
        text = text[len(prefix):]
    if not text or any(char not in _DIGITS[:base] for char in text):
        return False
    return int(text, base) == int(str(task.answer).strip().casefold(), base)


_NO_VALUE = object()


def _parse_output(text: str) -> Any:
    """A JSON value, else a Python literal (``'a'``, ``True``, ``(1, 2)``, ``None``), else _NO_VALUE."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO_VALUE


def _same_output(a: Any, b: Any) -> bool:
    """Structural equality of two parsed outputs: two floats within CODEIO_REL_TOL, an integer exactly, tuples
    read as JSON lists, booleans never numbers."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) or isinstance(b, int):  # an integer output is exact: 2 is 2.0, never 2.0000000001
            return a == b
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=CODEIO_REL_TOL, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_output, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        a, b = ({_json_key(k): v for k, v in d.items()} for d in (a, b))
        return len(a) == len(b) and a.keys() == b.keys() and all(_same_output(a[k], b[k]) for k in a)
    return type(a) is type(b) and isinstance(a, str) and a == b


def _json_key(key: Any) -> Any:
    """A Python dict key as JSON writes it (``{1: x}`` prints as ``{"1": x}``)."""
    return str(key) if isinstance(key, int) and not isinstance(key, bool) else key


def _grade_codeio(task: Task, answer: str, timeout_s: float) -> bool:
    """The output as a parsed value: JSON or a Python literal, same structure and types, floats to 1e-9.

    A bare string counts for a string output (``NO`` for ``"NO"``) when it parses as nothing else.
    """
    if len(answer) > MAX_CODEIO_CHARS:
        return False
    text = answer.strip().strip("`").strip()
    gold = _parse_output(str(task.answer))
    predicted = _parse_output(text)
    if predicted is _NO_VALUE:
        return isinstance(gold, str) and text == gold
    return gold is not _NO_VALUE and _same_output(predicted, gold)


def _grade_champ(task: Task, answer: str, timeout_s: float) -> bool:
    """Symbolic equivalence with one of the task's accepted forms (``252`` or ``C(10, 5)``); hedges fail.

    Expressions are answers here (``2^{997}``, ``\\frac{\\sqrt 3}{3}``): CHAMP asks for closed forms.
    A gold answer that names several values (``376 and 625``, ``x=\u00b11``) is their list, so ``625, 376``
    and ``x = 1 or x = -1`` match it; where the gold names one value, ``or`` and lists stay hedges. Groups
    (``x=0, y=2 and x=9, y=11``) are matched group by group, so values cannot swap between them.
    """
    forms = list(dict.fromkeys(task.metadata.get("answer_alternatives") or [str(task.answer)]))
    answer = _interval_of_inequality(answer) or answer
    if any(normalize_answer(answer).casefold() == normalize_answer(gold).casefold() for gold in forms):
        return True  # a form spelled out: no parser (and no cold math-verify start) needed
    readings: list[tuple[list[str], list[str]]] = []
    for gold in forms:
        groups = _JOIN_WORD.split(gold)
        if len(groups) > 1 and any(_item_count(group) > 1 for group in groups):
            readings.append((_JOIN_WORD.split(answer), groups))
            continue
        readings.append(([answer], [gold]))
        listed, answer_listed = _both_signs(gold) or _as_list(gold), _as_list(answer)
        if listed and answer_listed and _item_count(listed) > 1:  # several values, however the answer joins them
            readings.append(([answer_listed], [listed]))
    deadline = time.monotonic() + timeout_s  # one budget for all readings: the per-answer guard stays timeout_s
    return any(_groups_match(predicted, gold, deadline) for predicted, gold in readings)


def _groups_match(predicted: list[str], gold: list[str], deadline: float) -> bool:
    """Each predicted group equivalent to a different gold group (unordered), within the deadline."""
    if len(predicted) != len(gold):
        return False
    unmatched = list(gold)
    for part in predicted:
        for k, other in enumerate(unmatched):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if answers_equivalent(part, other, timeout_s=left):
                del unmatched[k]
                break
        else:
            return False
    return True


_LESS = r"(<=|\\leq?(?![A-Za-z])|\\lt(?![A-Za-z])|\u2264|<)"
_CHAIN = re.compile(rf"(.+?){_LESS}\s*[A-Za-z]\s*{_LESS}(.+)")


def _interval_of_inequality(answer: str) -> str | None:
    """``-1 \\le x \\le 1`` as the interval ``[-1, 1]`` (a chain ``a < x <= b`` names one interval)."""
    match = _CHAIN.fullmatch(normalize_answer(answer))
    if match is None:
        return None
    low, low_op, high_op, high = match[1].strip(), match[2], match[3], match[4].strip()
    strict = ("<", "\\lt")
    return f"{'(' if low_op in strict else '['}{low}, {high}{')' if high_op in strict else ']'}"


_JOIN_WORD = re.compile(r"\s+(?:and|or)\s+")


def _as_list(text: str) -> str | None:
    """``a and b`` / ``a or b`` as ``a, b``: only used where the gold answer itself names several values.

    None when a joined part is itself a list (``x=0, y=2 and x=9, y=11``): flattening would lose which values
    go together, and ``x=0, y=11 and x=9, y=2`` would match.
    """
    parts = _JOIN_WORD.split(text)
    if len(parts) > 1 and any(_item_count(part) > 1 for part in parts):
        return None
    return ", ".join(parts)


_PLUS_MINUS = re.compile(r"\u00b1|\\pm(?![A-Za-z])")


def _both_signs(gold: str) -> str | None:
    """A gold answer with ``\u00b1`` as the list of what it names: ``x=\u00b11`` is ``x=1, x=-1``; None without one.

    Each comma-separated item is expanded on its own (``x=\u00b11, \u00b12`` names four values), at most
    three signs per item.
    """
    if not _PLUS_MINUS.search(gold):
        return None
    items: list[str] = []
    for item in _split_top(gold, ","):
        signs = len(_PLUS_MINUS.findall(item))
        if signs > 3:
            return None
        parts = _PLUS_MINUS.split(item)
        for choice in range(2**signs):
            chosen = [("-" if choice >> k & 1 else "+") for k in range(signs)]
            text = parts[0] + "".join(sign + part for sign, part in zip(chosen, parts[1:]))
            items.append(re.sub(r"(^|[=(,])\s*\+", r"\1", text))  # "x=+1" is "x=1"
    return ", ".join(items)


def _grade_generic(task: Task, answer: str, timeout_s: float) -> bool:
    return task.answer is not None and answers_equivalent(answer, str(task.answer), timeout_s=timeout_s)


def _entry_metadata(task: Task) -> Mapping[str, Any]:
    return (task.metadata.get("entry") or {}).get("metadata") or {}


_Grader = Callable[["Task", str, float], bool]
#: The grader of each task kind (a reasoning-gym dataset name, "champ", or "generic" for a user's own task).
GRADERS: dict[str, _Grader] = {
    "basic_arithmetic": _grade_number,
    "gsm_symbolic": _grade_number,
    "simple_equations": _grade_number,
    "count_primes": _grade_number,
    "letter_counting": _grade_number,
    "fraction_simplification": _grade_fraction,
    "prime_factorization": _grade_prime_factorization,
    "base_conversion": _grade_base_conversion,
    "codeio": _grade_codeio,
    "champ": _grade_champ,
    "generic": _grade_generic,
}


def task_kind(task: Task) -> str:
    """The key of ``task``'s grader in GRADERS: its reasoning-gym dataset, "champ" or "generic"."""
    meta = task.metadata or {}
    if meta.get("source") == "reasoning_gym":
        return str(meta.get("dataset"))
    return "champ" if meta.get("source") == "champ" else "generic"


def grade_answer(task: Task, answer: str | None, *, timeout_s: float = 2.0) -> bool:
    """Whether ``answer`` (the final answer: the content of ``\\boxed{}`` or the answer tool) solves ``task``.

    This is the code-interpreter env's reward, exactly, so the labelled grading set measures what training
    optimises. Each task kind has its own grader (see GRADERS): the answer must be the one value asked for,
    in the structure asked for, in any equivalent notation; hedges (several candidates) are always wrong.
    Never raises: a missing answer, an unknown task kind or any error is False.
    """
    try:
        if not isinstance(answer, str) or not answer.strip():
            return False
        grader = GRADERS.get(task_kind(task))
        return grader is not None and bool(grader(task, answer.strip(), timeout_s))
    except Exception:  # noqa: BLE001 - a grader must never crash an episode
        return False
