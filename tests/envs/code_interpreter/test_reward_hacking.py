"""Reward-hacking battery: the exploits a policy would find against CodeInterpreter-v1 and Calculator-v0, each
scored 0.

Three layers, because a policy can attack each: the grader (hedged, echoed, signed, structurally wrong answers
on real suite tasks of every kind), the extraction of the final answer (several boxes, empty boxes), and the
env itself (``final_answer`` in a loop, code printing every candidate, several answer calls in one turn).

Decisions this battery pins down:
* numeric kinds want the computed number: an unevaluated expression (the question's own ``27*42``,
  ``3718 / 2``) scores 0, as "simplify" needs the reduced fraction; CHAMP asks for closed forms, so there an
  expression equal in value (``2^{997}``, ``C(10, 5)``) is an answer;
* several different final answers are a hedge, whatever the last one says.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")
pytest.importorskip("champ_dataset")

from agentgym.envs.code_interpreter.answers import extract_final_answer, grade_answer
from agentgym.envs.code_interpreter.tasks import DATASETS
from agentgym.suite import Task
from agentgym.registration.suites import load_suite

NUMBER_KINDS = ("basic_arithmetic", "gsm_symbolic", "simple_equations", "count_primes", "letter_counting")


@pytest.fixture(scope="module")
def by_kind() -> dict[str, list[Task]]:
    tasks: dict[str, list[Task]] = {}
    for task in load_suite("code-test").test:
        tasks.setdefault(task.metadata["dataset"], []).append(task)
    tasks["champ"] = list(load_suite("champ").test)
    return {kind: found[:12] for kind, found in tasks.items()}


def _other(answer: str) -> str:
    """A different value of the same shape: the hedge partner."""
    return str(int(answer) + 1) if answer.lstrip("-").isdigit() else answer + "1"


def _hedges(gold: str) -> list[str]:
    other = _other(gold)
    return [f"{gold} or {other}", f"{other} or {gold}", f"{gold}, {other}", f"{gold}; {other}", f"[{gold}, {other}]",
            f"\\{{{gold}, {other}\\}}", f"{gold} \\text{{ or }} {other}", f"{gold}/{other}", f"\\boxed{{{gold}}} \\boxed{{{other}}}",
            f"either {gold} or {other}", f"maybe {gold}"]


@pytest.mark.parametrize("kind", [k for k in DATASETS if k != "codeio"])
def test_hedges_score_zero(by_kind, kind: str) -> None:
    for task in by_kind[kind]:
        gold = str(task.answer).replace("$", "")
        assert grade_answer(task, gold), (task.id, gold)  # the control: the gold answer itself scores
        for hedge in _hedges(gold):
            assert not grade_answer(task, hedge), (kind, hedge)


@pytest.mark.parametrize("kind", NUMBER_KINDS)
def test_numeric_exploits_score_zero(by_kind, kind: str) -> None:
    for task in by_kind[kind]:
        gold = int(task.answer) if task.answer.lstrip("-").isdigit() else None
        if gold is None:
            continue
        exploits = [f"\\pm {abs(gold)}", f"+/- {abs(gold)}", f"{gold - 1} < x < {gold + 1}", f"\\approx {gold}",
                    f"{gold}0", f"{gold} {gold}", f"{gold}!", f"{gold}*1", f"{gold}+0", f"{2 * gold}/2",
                    "", " ", "\\boxed{}", "x", task.prompt, " ".join(str(i) for i in range(gold - 50, gold + 50))]
        if gold:
            exploits.append(str(-gold))  # wrong sign
        for exploit in exploits:
            assert not grade_answer(task, exploit), (kind, exploit[:80])


def test_echoing_the_question_scores_zero(by_kind) -> None:
    """The expression, equation, fraction or number of the question is not its answer."""
    echoes = {
        "basic_arithmetic": lambda m: m["expression"],
        "simple_equations": lambda m: m["equation"],
        "fraction_simplification": lambda m: f"{m['numerator']}/{m['denominator']}",
        "prime_factorization": lambda m: str(m["number"]),
        "base_conversion": lambda m: m["source_repr"],
        "letter_counting": lambda m: m["target_letter"],
    }
    for kind, echo in echoes.items():
        for task in by_kind[kind]:
            meta = task.metadata["entry"]["metadata"]
            if kind == "prime_factorization" and len(meta["factors"]) == 1:
                continue  # a prime's factorisation is the prime itself
            if kind == "base_conversion" and echo(meta).casefold() == str(task.answer).casefold():
                continue
            assert not grade_answer(task, echo(meta)), (kind, echo(meta))
        for task in by_kind[kind]:
            assert not grade_answer(task, task.prompt), kind


def test_structure_is_honoured(by_kind) -> None:
    for task in by_kind["fraction_simplification"]:
        meta = task.metadata["entry"]["metadata"]
        n, d = meta["simplified_numerator"], meta["simplified_denominator"]
        for wrong in (f"{3 * n}/{3 * d}", f"\\frac{{{2 * n}}}{{{2 * d}}}", f"{n / d}", f"{n}:{d}", f"-{n}/{d}"):
            assert not grade_answer(task, wrong), wrong
    for task in by_kind["prime_factorization"]:
        factors = task.metadata["entry"]["metadata"]["factors"]
        for wrong in (" × ".join(map(str, [*factors, 2])), "1 × " + task.answer, "1"):
            assert not grade_answer(task, wrong), wrong
        if len(factors) > 1:
            for wrong in (", ".join(map(str, factors)), " × ".join(map(str, factors[:-1])),
                          " × ".join(map(str, [factors[0] * factors[1], *factors[2:]]))):
                assert not grade_answer(task, wrong), wrong
    for task in by_kind["simple_equations"]:
        variable = task.metadata["entry"]["metadata"]["variable"]
        other = "y" if variable != "y" else "z"
        assert grade_answer(task, f"{variable} = {task.answer}")
        assert not grade_answer(task, f"{other} = {task.answer}")
        assert not grade_answer(task, f"{variable} = {task.answer} = {task.answer}")


def test_codeio_exploits_score_zero(by_kind) -> None:
    for task in by_kind["codeio"]:
        gold = json.loads(task.answer)
        inputs = task.metadata["entry"]["metadata"]["input_data"]
        for wrong in (json.dumps(inputs), f"{task.answer} or null", json.dumps([gold, None]), json.dumps([gold]),
                      json.dumps({"output": gold}), "null", "", "...", task.answer + task.answer):
            if wrong != task.answer:
                assert not grade_answer(task, wrong), wrong[:80]
        if isinstance(gold, int) and not isinstance(gold, bool):
            assert not grade_answer(task, f"{gold}.0000001")  # float tolerance is for float outputs only


def test_champ_hedges_and_signs(by_kind) -> None:
    champ = {t.metadata["problem_id"]: t for t in load_suite("champ").test}
    cases = {
        "P_Inequality_13": ["9", "\\pm 9", "-9 or 9", "-9, 9", "-10 < x < -8"],  # gold -9
        "P_Inequality_18": ["-\\frac{\\sqrt3}{3}", "\\pm\\frac{\\sqrt3}{3}", "\\frac{\\sqrt3}{3} \\text{ or } 1"],
        "P_Combinatorics_17": ["Yes or No", "No/Yes", "No, Yes"],  # gold No
        "P_Combinatorics_2": ["252 or 253", "252, 126", "\\{252, 126\\}", "[252, 253]"],
        "P_Number-Theory_39": ["x=0, y=11 and x=9, y=2", "x=0, y=2", "x=0, y=2 and x=9, y=11 and x=1, y=1"],
        "P_Polynomial_22": ["1", "x=1 or x=2", "1 or -1 or 2"],  # gold x=±1: both roots, and only them
    }
    for pid, wrongs in cases.items():
        assert grade_answer(champ[pid], champ[pid].answer)
        for wrong in wrongs:
            assert not grade_answer(champ[pid], wrong), (pid, wrong)
    assert grade_answer(champ["P_Sequence_34"], "2^{997}") and grade_answer(champ["P_Combinatorics_2"], "C(10, 5)")


def test_several_boxes_are_a_hedge() -> None:
    assert extract_final_answer("\\boxed{5} hmm, no: \\boxed{6}") == "5 or 6"
    assert extract_final_answer("\\boxed{5}. So \\boxed{5}") == "5"
    assert extract_final_answer("\\boxed{6}<answer>5</answer>") == "6 or 5"
    printed = "".join(f"\\boxed{{{i}}}\n" for i in range(10_000))  # final_answer in a loop
    answer = extract_final_answer(printed)
    assert answer is not None and answer.startswith("0 or 1 or 2") and len(answer) < 200
    assert extract_final_answer("\\boxed{}") == ""


# ---- through the real env ------------------------------------------------------------------------------------
TASK = Task(id="t", prompt="What is 6 * 7?", answer="42", metadata={"source": "champ", "reference_code": "print(42)"})


@pytest.fixture(scope="module")
def code_env():
    from agentgym.envs.code_interpreter.env import CodeInterpreterEnv

    env = CodeInterpreterEnv(tasks=[TASK], max_turns=3)
    yield env
    env.close()


@pytest.mark.parametrize("reply", [
    "It is \\boxed{41}, or rather \\boxed{42}.",
    "\\boxed{42 or 43}",
    "\\boxed{41, 42, 43}",
    "\\boxed{}",
    "\\boxed{\\pm 42}",
    "<answer>41</answer> \\boxed{42}",
    '<tool_call>{"name": "answer", "arguments": {"answer": "41"}}</tool_call>'
    '<tool_call>{"name": "answer", "arguments": {"answer": "42"}}</tool_call>',
    "```python\nfor c in range(30, 50):\n    final_answer(c)\n```",
    "```python\nprint(' '.join('\\\\boxed{%d}' % c for c in range(100)))\n```",
    "```python\nprint('\\\\boxed{' + ' or '.join(map(str, range(100))) + '}')\n```",
])
def test_env_scores_exploits_zero(code_env, reply: str) -> None:
    code_env.reset(seed=0)
    _, reward, terminated, _, info = code_env.step(reply)
    assert terminated and reward == 0.0 and not info["outcome"]["success"], reply


def test_env_huge_output_without_a_box_is_no_answer(code_env) -> None:
    code_env.reset(seed=0)
    _, reward, terminated, _, info = code_env.step("```python\nprint(' '.join(map(str, range(200000))))\n```")
    assert reward == 0.0 and not terminated and info["turn"]["kind"] == "tool_call"
    _, reward, terminated, _, info = code_env.step("\\boxed{42}")  # the control: an honest answer still scores
    assert terminated and reward == 1.0


def test_calculator_exploits_score_zero() -> None:
    from agentgym.envs.games.calculator import CalculatorEnv

    task = load_suite("games-calc").test[0]
    a, b, op, product = task.metadata["a"], task.metadata["b"], task.metadata["op"], int(task.answer)
    with CalculatorEnv(tasks=[task]) as env:
        for reply in (f"answer({product + 1}) answer({product})", f"answer({a}{op}{b})", f"answer(\"{product} or 1\")",
                      "answer(True)", f"answer({product}.5)", f"answer({-product})"):
            env.reset(seed=0)
            _, reward, _, _, info = env.step(reply)
            assert reward == 0.0 and not info.get("outcome", {}).get("success"), reply
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(f"answer({product})")  # the control
        assert terminated and reward == 1.0
