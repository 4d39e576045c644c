"""Answer grading of the text games that take a number as the answer: Calculator's ``answer`` and
GuessNumber's ``guess``.

One function, :func:`grade_answer`, is both the env's reward check and what the labelled grading set
(``tests/data/grading/games.jsonl``) measures, so the measured false-positive rate is the one training sees.
An answer is one integer in any spelling a JSON tool argument can take (``1134``, ``1134.0``, ``1.134e3``,
``+1134``), with thousands separators (``1,134``) or a currency sign (``$196``); an expression (``27*42``, the question echoed back),
a hedge (``1134 or 1135``), a non-integer or a boolean is never correct. Maze has no free-form answer: its
moves are checked by the maze itself.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from agentgym.envs.games.arithmetic import evaluate, expression_of
from agentgym.errors import TaskError
from agentgym.suite import Task

__all__ = ["expected_answer", "grade_answer", "integer_value"]

MAX_DIGITS = 60  # the calculator's results have at most 60 digits; longer text is not a plausible answer
_JSON_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,2})?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+")
#: One currency sign before the digits ("$196", "-$5", "\u20ac12"); the sign is notation, not a second value.
_CURRENCY = re.compile(r"^([+-]?)\s*(?:\\?\$|\u20ac|\u00a3|\u00a5)\s*(?=\d)")


def integer_value(answer: object) -> int | None:
    """The integer an answer names, or None when it names anything else (never raises).

    ``True`` is not 1 here (a JSON schema ``integer`` refuses booleans too), and ``1134.5`` is no integer.
    """
    if isinstance(answer, bool) or answer is None:
        return None
    text = str(answer).strip()
    if len(text) > MAX_DIGITS + 10:
        return None
    text = _CURRENCY.sub(r"\1", text)  # "$196" (a word problem about money) names 196
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if not _JSON_NUMBER.fullmatch(text):
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return int(value) if value == value.to_integral_value() else None


def expected_answer(task: Task) -> int:
    """The integer a games task wants: its ``answer`` (the product, the secret), else the calculator's value
    of its question (a user's own calculator task may give only ``What is EXPR?``)."""
    known = task.answer if task.answer is not None else (task.metadata or {}).get("secret")
    if known is not None:
        value = integer_value(known)
        if value is None:
            raise TaskError(f"Games task {task.id!r}: answer {known!r} is not an integer; give an integer.")
        return value
    return evaluate(expression_of(task))


def grade_answer(task: Task, answer: object) -> bool:
    """Whether ``answer`` (what the agent passed to ``answer``/``guess``) is exactly the task's integer."""
    value = integer_value(answer)
    return value is not None and value == expected_answer(task)
