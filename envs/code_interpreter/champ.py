"""The CHAMP competition-math dataset as code-interpreter tasks (:func:`champ_tasks`, 270 problems)."""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping
from typing import Any

from agentgym.errors import DependencyNotInstalled, TaskError
from agentgym.suite import Task

from agentgym.envs.code_interpreter.reference_code import python_literal

__all__ = ["CHAMP_SIZE", "champ_tasks"]

CHAMP_SIZE = 270


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
            "reference_code": _CHAMP_LITERAL.format(answer=python_literal(answer)),
            "reference_kind": "literal",
        }
        tasks.append(Task(id=metadata["task_id"], prompt=p["text"], answer=answer, metadata=metadata))
    return tasks
