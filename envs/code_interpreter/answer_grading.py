"""The code-interpreter env's reward: one grader per task kind (:data:`GRADERS`, :func:`grade_answer`).

Each grader asks for the one value the task wants, in the structure it wants, in any notation that
:mod:`agentgym.envs.code_interpreter.answer_equivalence` accepts as equal.
"""

from __future__ import annotations

import ast
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import sympy

from agentgym.envs.code_interpreter.answer_equivalence import answers_equivalent, item_count, split_top_level
from agentgym.envs.code_interpreter.answer_text import normalize_answer

if TYPE_CHECKING:
    from agentgym.suite import Task

__all__ = [
    "CODEIO_REL_TOL", "grade_answer", "GRADERS", "MAX_CODEIO_CHARS", "MAX_LITERAL_CHARS", "number_value",
    "task_kind"
]

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
#: A number followed by up to three words naming what it counts ("7 apples", "12 red marbles").
_COUNTED = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s+([A-Za-z]+(?:[ '-][A-Za-z]+){0,2})")
#: Words after a number that make it something other than a count of things: an alternative, a range, an
#: operation or an approximation ("7 or so", "7 to 8", "7 plus tax", "7 maybe").
_NOT_A_NOUN = re.compile(r"\b(?:or|and|to|plus|minus|times|over|per|of|maybe|perhaps|approximately|about|around|"
                         r"roughly|so|ish|more|less|percent|than|not)\b", re.IGNORECASE)


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
    only that variable), in ``$...$``/``\\text{}``, after "The answer is", with a known unit word or up
    to three words naming what it counts (``7 apples``), or a mixed number (``1\\frac{1}{2}``). An expression (``27*42``,
    ``28/2``) is not a number: the task asks for the computed value, as "simplify" asks for the reduced
    form, and accepting the question's own expression would reward echoing it.
    """
    if not isinstance(answer, str) or len(answer) > MAX_LITERAL_CHARS:
        return None
    answer = answer.replace("\\$", "").replace("$", "")  # "\boxed{\$12}": the escaped sign goes too
    assignment = _ASSIGNMENT.fullmatch(answer)
    if assignment:  # before normalize_answer, which drops any single-letter "x ="
        if variable is not None and assignment[1] != variable:
            return None
        answer = assignment[2]
    if "=" in answer:  # "x_1 = 5", "a = b = 5": not one value of the unknown asked for
        return None
    text = normalize_answer(answer)
    if (counted := _COUNTED.fullmatch(text)) and not _NOT_A_NOUN.search(counted[2]):
        text = counted[1]  # "7 apples": the number of the things asked about
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
        if len(groups) > 1 and any(item_count(group) > 1 for group in groups):
            readings.append((_JOIN_WORD.split(answer), groups))
            continue
        readings.append(([answer], [gold]))
        listed, answer_listed = _both_signs(gold) or _as_list(gold), _as_list(answer)
        if listed and answer_listed and item_count(listed) > 1:  # several values, however the answer joins them
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
    if len(parts) > 1 and any(item_count(part) > 1 for part in parts):
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
    for item in split_top_level(gold, ","):
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
