"""Reference programs of code-interpreter tasks.

Each reasoning-gym task carries a standalone Python program that *computes* its answer from the problem's
parameters and prints it in the form reasoning-gym states it (:func:`reference_code`); :data:`DATASETS` are the
datasets it can write one for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentgym.errors import TaskError

from agentgym.envs.code_interpreter.codeio import codeio_mode

__all__ = ["DATASETS", "LITERAL_DATASETS", "python_literal", "reference_code"]

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


# ---- reference code ---------------------------------------------------------------------------
def python_literal(value: Any) -> str:
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
        return _BASIC_ARITHMETIC.format(expression=python_literal(meta["expression"])), "computed"
    if name == "simple_equations":
        return _SIMPLE_EQUATIONS.format(equation=python_literal(meta["equation"]), variable=python_literal(meta["variable"])), "computed"
    if name == "fraction_simplification":
        return _FRACTION.format(num=int(meta["numerator"]), den=int(meta["denominator"]),
                                style=python_literal(meta["style"])), "computed"
    if name == "count_primes":
        return _COUNT_PRIMES.format(start=int(meta["start"]), end=int(meta["end"])), "computed"
    if name == "prime_factorization":
        return _PRIME_FACTORIZATION.format(number=int(meta["number"])), "computed"
    if name == "letter_counting":
        text = " ".join(meta["span"])
        return _LETTER_COUNTING.format(text=python_literal(text), letter=python_literal(meta["target_letter"])), "computed"
    if name == "base_conversion":
        return _BASE_CONVERSION.format(source=python_literal(meta["source_repr"]), source_base=int(meta["source_base"]),
                                       target_base=int(meta["target_base"])), "computed"
    if name == "codeio" and sample is not None and codeio_mode(entry) == "output":
        inputs = json.dumps(meta["input_data"], sort_keys=False)
        return _CODEIO_OUTPUT.format(code=sample["code_sample"].rstrip(), inputs=python_literal(inputs)), "computed"
    if name == "gsm_symbolic":
        return _GSM_LITERAL.format(answer=python_literal(answer)), "literal"
    if name == "codeio":
        return _CODEIO_INPUT_LITERAL.format(answer=python_literal(answer)), "literal"
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
