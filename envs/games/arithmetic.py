"""Integer arithmetic for the Calculator env and the games' answer grading: a safe evaluator and the question parser.

Both :mod:`agentgym.envs.games.calculator` (the ``calc`` tool) and :mod:`agentgym.envs.games.grading` (the value a
"What is EXPR?" task wants) need them, so they live here, below both.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable

from agentgym.errors import TaskError
from agentgym.suite import Task
from agentgym.utils.untrusted_ast import parse_untrusted

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_LITERAL_DIGITS", "MAX_RESULT_DIGITS", "OPERATORS", "CalcError", "evaluate",
           "expression_of"]

OPERATORS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
}
MAX_EXPRESSION_CHARS = 200
MAX_LITERAL_DIGITS = 30
MAX_RESULT_DIGITS = 60

_HOW = "use integers, + - * // and parentheses, e.g. calc((27+3)*42)"


class CalcError(ValueError):
    """An expression ``calc`` refuses; the message is shown to the model, so it says the fix."""


def _check_size(value: int) -> int:
    if abs(value) >= 10**MAX_RESULT_DIGITS:
        raise CalcError(f"the result has more than {MAX_RESULT_DIGITS} digits; use smaller numbers.")
    return value


def _eval_node(node: ast.AST) -> int:
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) is int:
            if len(str(abs(value))) > MAX_LITERAL_DIGITS:
                raise CalcError(f"numbers may have at most {MAX_LITERAL_DIGITS} digits.")
            return value
        if isinstance(value, float):
            raise CalcError(f"only whole numbers are supported, got {value!r}; {_HOW}.")
        raise CalcError(f"{value!r} is not a number; {_HOW}.")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _eval_node(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Div):
            raise CalcError("'/' is not supported: use // for integer (floor) division.")
        if isinstance(node.op, ast.Pow):
            raise CalcError("exponents (**) are not supported: write the multiplication out, e.g. 3*3*3.")
        symbol = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}.get(type(node.op))
        if symbol is None:
            raise CalcError(f"operator {type(node.op).__name__} is not supported; {_HOW}.")
        left, right = _eval_node(node.left), _eval_node(node.right)
        if symbol == "//" and right == 0:
            raise CalcError("division by zero.")
        return _check_size(OPERATORS[symbol](left, right))
    if isinstance(node, ast.Name):
        raise CalcError(f"unknown name {node.id!r}: calc only takes numbers; {_HOW}.")
    raise CalcError(f"{type(node).__name__} is not supported; {_HOW}.")


def evaluate(expression: str) -> int:
    """Evaluate integer arithmetic safely (an AST walk; nothing is ever ``eval``-ed).

    Args:
        expression: Integers, ``+ - * //``, unary minus and parentheses. A trailing ``=`` is ignored.

    Returns:
        The exact integer value.

    Raises:
        CalcError: Anything else (names, calls, floats, ``/``, ``**``, division by zero, too long or too
            large input), with a message that tells the model how to write the expression instead.
    """
    text = expression.strip()
    if text.endswith("="):
        text = text[:-1].rstrip()
    if not text:
        raise CalcError(f"the expression is empty; {_HOW}.")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"the expression has {len(text)} characters; the limit is {MAX_EXPRESSION_CHARS}.")
    try:
        tree = parse_untrusted(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError(f"cannot read {text!r}; {_HOW}.") from None
    return _eval_node(tree.body)


_QUESTION = re.compile(r"What is (.+?)\?\s*$", re.DOTALL)


def expression_of(task: Task) -> str:
    """The arithmetic a Calculator task asks about: its metadata ``a op b``, else the ``EXPR`` of "What is EXPR?"."""
    meta = task.metadata
    if {"a", "b", "op"} <= set(meta):
        return f"{meta['a']}{meta['op']}{meta['b']}"
    match = _QUESTION.search(task.prompt)
    if match is None:
        raise TaskError(
            f"Calculator task {task.id!r} has neither metadata a/b/op nor a prompt 'What is EXPR?'; add one."
        )
    return match.group(1).strip()
