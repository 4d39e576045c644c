"""Answer checking for the code-interpreter env: extraction, equivalence, hostile input, threads."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.envs.code_interpreter.answers import (
    answers_equivalent,
    extract_final_answer,
    has_final_answer,
    normalize_answer,
)

EQUIVALENT = [
    # equal values in different notations
    ("1/2", "0.5"),
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("2^(n-1)", "2**(n - 1)"),
    ("x=3", "3"),
    # numbers and fractions
    ("\\dfrac12", "1/2"),
    ("\\tfrac{1}{2}", "0.5"),
    ("3.0", "3"),
    ("1,000", "1000"),
    ("$1{,}000$", "1000"),
    ("0.333333", "1/3"),
    ("1e6", "1000000"),
    ("2^{2024}", str(2**2024)),
    ("50", "50\\%"),
    ("0.5", "50%"),
    ("50\\%", "0.5"),
    # expressions
    ("2^{n-1}", "2^(n-1)"),
    ("\\sqrt{2}/2", "1/\\sqrt{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt3/2"),
    ("x^2+2x+1", "(x+1)^2"),
    ("2\\pi", "6.283185307"),
    ("e^{i\\pi}", "-1"),
    ("3+4i", "4i+3"),
    ("\\binom{5}{2}", "10"),
    ("5!", "120"),
    ("\\log_2 8", "3"),  # not known locally: math-verify decides
    ("\\sin^2(x)", "1-\\cos^2(x)"),
    # equations
    ("y = 2x+1", "2x+1"),
    ("x + y = 3", "y + x = 3"),
    ("2x + 2y = 6", "x + y - 3 = 0"),
    # intervals, tuples, sets, lists
    ("[1, 3)", "[1,3)"),
    ("(-\\infty, 2]", "(-oo, 2]"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("{1, 2}", "{2, 1}"),
    ("\\{3, \\frac{1}{2}\\}", "\\{0.5, 3\\}"),
    ("1, 2, 3", "3, 2, 1"),
    ("[1,2) \\cup (3,4]", "(3,4] \\cup [1,2)"),
    # text, booleans, units, wrappers
    ("Yes", "yes"),
    ("True", "yes"),
    ("  The  Answer ", "the answer"),
    ("\\text{(A)}", "A"),
    ("5 cm", "5"),
    ("90^\\circ", "90"),
    ("\\$5.", "5"),
    ("\\boxed{42}", "42"),
]

DIFFERENT = [
    # near misses that must not match
    ("0.51", "1/2"),
    ("2^n", "2^(n-1)"),
    ("[1,3)", "[1,3]"),
    ("4", "x=3"),
    ("", "3"),
    ("3", ""),
    (None, "3"),
    ("(1,2)", "(2,1)"),
    # integers compare exactly, other numbers within 1e-6
    ("3.0000001", "3"),
    ("1000001", "1000000"),
    ("0.3333", "1/3"),
    # percentages only as the gold answer says
    ("50%", "50"),
    ("5", "50%"),
    # shapes must match
    ("1, 2", "(1, 2)"),
    ("{1, 2}", "{1, 2, 3}"),
    ("(1, 2]", "(1, 2)"),
    ("x + y = 3", "x + y"),
    ("oo", "10"),
    # text and booleans
    ("yes", "no"),
    ("True", "1"),
    ("Alice", "Bob"),
    ("x", "X + 1"),
]


@pytest.mark.parametrize(("predicted", "gold"), EQUIVALENT)
def test_equivalent_forms_are_accepted(predicted: str, gold: str) -> None:
    assert answers_equivalent(predicted, gold, timeout_s=30.0)  # semantics, not speed: the suite may load the cores


@pytest.mark.parametrize(("predicted", "gold"), DIFFERENT)
def test_different_answers_are_rejected(predicted: str | None, gold: str) -> None:
    assert not answers_equivalent(predicted, gold)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("first \\boxed{1}, then \\boxed{2}", "1 or 2"),  # two different answers: a hedge, graded wrong
        ("\\boxed{2} so the answer is \\boxed{ 2 }", "2"),
        ("<answer> 42 </answer>", "42"),
        ("no final answer here", None),
        ("\\boxed{1} and \\boxed{\\frac{1}{2}", None),  # the last box is truncated
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed 42$ and more", "42"),
        ("\\boxed{1} <answer>5</answer>", "1 or 5"),
        ("\\boxed{} is empty", ""),
        ("<answer>\\boxed{5}</answer>", "5"),
        ("<answer>5", None),
    ],
)
def test_extract_final_answer(text: str, expected: str | None) -> None:
    assert extract_final_answer(text) == expected


def test_has_final_answer() -> None:
    assert has_final_answer("so \\boxed{3}")
    assert has_final_answer("<answer>3</answer>")
    assert not has_final_answer("the answer is 3")
    assert not has_final_answer("<answer>3")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$\\dfrac{1}{2}$.", "\\frac{1}{2}"),
        ("\\text{Yes}", "Yes"),
        ("\\left[ 1, 2 \\right)", "[ 1, 2 )"),
        ("x = 3", "3"),
        ("x + y = 3", "x + y = 3"),
        ("1,000,000", "1000000"),
        ("(1,2)", "(1,2)"),
        ("12 meters", "12"),
        ("3 apples", "3 apples"),
        ("10\\%", "10%"),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


HOSTILE = [
    ("9^9^9^9", "1"),
    ("10**10**10", "1"),
    ("factorial(10**9)", "1"),
    ("(10^{99})!", "1"),
    ("((9^{99})^{99})^{99}", "1"),
    ("1e999999999", "1"),
    ("x" * 100_000, "1"),
    ("(" * 5000 + "1" + ")" * 5000, "1"),
    ("(" * 100 + "1" + ")" * 100, "1"),
    ("\\boxed{" * 1000, "1"),
    ("\\begin{pmatrix}9^{9^{9}}\\end{pmatrix}", "1"),
]


@pytest.mark.parametrize(("predicted", "gold"), HOSTILE)
def test_hostile_input_returns_false_quickly(predicted: str, gold: str) -> None:
    start = time.monotonic()
    assert not answers_equivalent(predicted, gold)
    assert time.monotonic() - start < 2.0


def test_hostile_text_never_hangs_extraction_or_normalization() -> None:
    start = time.monotonic()
    for text in ("\\boxed{" * 30_000, "1," * 50_000 + "x", "\\text{" * 20_000 + "a" + "}" * 20_000):
        extract_final_answer(text)
        has_final_answer(text)
        normalize_answer(text)
    assert time.monotonic() - start < 2.0


def test_overrunning_check_gives_up_and_is_stopped() -> None:
    """A check SymPy cannot finish in time is False after timeout_s, and its helper thread is stopped."""
    start = time.monotonic()
    assert not answers_equivalent("(x+1)^{2000}", "x^{2000}+1", timeout_s=0.3)
    assert time.monotonic() - start < 1.5
    deadline = time.monotonic() + 10
    while any(t.name == "answer-check" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "answer-check" for t in threading.enumerate())


def test_works_from_a_worker_thread() -> None:
    """Rollout engines step envs in worker threads, where signal-based timeouts (math-verify's) fail."""
    results: dict[str, bool] = {}

    def work() -> None:
        results["local"] = answers_equivalent("\\frac{1}{2}", "0.5")
        results["math_verify"] = answers_equivalent("\\log_2 8", "3")
        results["different"] = answers_equivalent("\\log_2 8", "4")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert results == {"local": True, "math_verify": True, "different": False}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(-10**6, 10**6), st.integers(1, 10**4))
def test_fraction_matches_its_decimal_and_latex(p: int, q: int) -> None:
    value = Fraction(p, q)
    assert answers_equivalent(repr(p / q), f"{p}/{q}")
    assert answers_equivalent(f"\\frac{{{value.numerator}}}{{{value.denominator}}}", f"{p}/{q}")
    assert answers_equivalent(f"\\frac{{{p}}}{{{q}}}", repr(p / q))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60), st.text(max_size=60))
def test_random_text_never_raises(predicted: str, gold: str) -> None:
    assert isinstance(answers_equivalent(predicted, gold, timeout_s=0.5), bool)
    assert answers_equivalent(gold, gold) or not normalize_answer(gold)
    extract_final_answer(predicted)
    normalize_answer(predicted)


# ---- notation once misjudged (the tilde, units, mixed numbers, stock phrases, an escaped dollar sign) ----
@pytest.mark.parametrize(("predicted", "gold", "verdict"), [
    ("~12", "12", False),  # "about 12": the tilde before a number is no LaTeX space
    ("$~12$", "12", False),
    ("\\approx 12", "12", False),
    ("5~cm", "5 cm", True),  # between a number and its unit the tilde is LaTeX's non-breaking space
    ("5 m", "5 cm", False),  # the unit words were dropped from both sides, leaving 5 = 5
    ("5 meters", "5 m", True),
    ("5", "5 cm", True),  # a unit on one side only is notation
    ("1\\frac{1}{2}", "3/2", True),  # a mixed number, not 1 * 1/2
    ("-2\\frac{1}{3}", "-7/3", True),
    ("1\\frac{1}{3}", "3/2", False),
    ("The answer is 7", "7", True),
])
def test_tilde_units_and_mixed_numbers(predicted: str, gold: str, verdict: bool) -> None:
    assert answers_equivalent(predicted, gold) is verdict


@pytest.mark.parametrize(("answer", "value"), [
    ("The answer is 7", Fraction(7)), ("Final answer: 7", Fraction(7)), ("7 apples", Fraction(7)),
    ("12 red marbles", Fraction(12)), ("\\boxed{\\$12}", Fraction(12)), ("$12", Fraction(12)),
    ("12 dollars", Fraction(12)), ("1\\frac{1}{2}", Fraction(3, 2)),
    ("~12", None), ("7 or so", None), ("7 to 8", None), ("7 or 8", None), ("about 7", None), ("7 apples 8", None),
])
def test_number_value_of_numeric_kinds(answer: str, value: Fraction | None) -> None:
    from agentgym.envs.code_interpreter.answers import grade_answer, number_value
    from agentgym.suite import Task

    assert number_value(answer) == value
    task = Task("g", "How many?", str(value if value is not None else 12),
                {"source": "reasoning_gym", "dataset": "gsm_symbolic", "entry": {"metadata": {}}})
    if value is not None and value.denominator == 1:
        assert grade_answer(task, answer) is True
    if answer == "~12":
        assert grade_answer(task, answer) is False
