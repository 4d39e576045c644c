"""Calculator: the quickstart env, small enough for a tiny model to learn on a CPU.

The agent gets an arithmetic question ("What is 27*42?"), may compute with ``calc(expression)`` and must
submit the exact integer with ``answer(value)``. The interesting decision is local (call the tool, copy
its result, stop), which is exactly what RL on a tiny warm-started model can fix in minutes.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from agentgym.envs.games._common import check_settings, games_parser, sample_one
from agentgym.envs.games.arithmetic import (  # noqa: F401 - the limits and OPERATORS stay importable from here
    MAX_EXPRESSION_CHARS,
    MAX_LITERAL_DIGITS,
    MAX_RESULT_DIGITS,
    OPERATORS,
    CalcError,
    evaluate,
    expression_of,
)
from agentgym.envs.games.grading import expected_answer, grade_answer

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["CalcError", "CalculatorEnv", "evaluate", "generate_tasks"]


# ---- tasks ---------------------------------------------------------------------------------------
def generate_tasks(
    rng: random.Random,
    count: int,
    *,
    min_operand: int = 2,
    max_operand: int = 99,
    min_second: int | None = None,
    max_second: int | None = None,
    ops: Sequence[str] = ("*",),
    holdout: str | None = None,
    holdout_every: int = 5,
) -> list[Task]:
    """Draw ``count`` distinct questions ``a OP b`` (no repeats, so a split never double-counts one).

    ``holdout`` splits the question space deterministically (by a hash of the question) so that a test
    split can share the train split's ranges yet never contain a train question: ``"exclude"`` keeps
    questions outside the held-out part, ``"only"`` keeps the held-out part (1 in ``holdout_every``).

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks; must not exceed the number of distinct questions.
        min_operand: Smallest first operand (>= 0).
        max_operand: Largest first operand.
        min_second: Smallest second operand (defaults to ``min_operand``); lets a split be e.g.
            2-digit x 1-digit.
        max_second: Largest second operand (defaults to ``max_operand``).
        ops: Operators to draw from, a subset of ``+ - * //``.
        holdout: ``None``, ``"exclude"`` or ``"only"`` (see above).
        holdout_every: Size of the held-out part: one question in this many.
    """
    lo_b = min_operand if min_second is None else min_second
    hi_b = max_operand if max_second is None else max_second
    ops = tuple(ops)
    if not ops or any(op not in OPERATORS for op in ops):
        raise TaskError(f"ops must be a non-empty subset of {list(OPERATORS)}, got {list(ops)}.")
    if not (0 <= min_operand <= max_operand and 0 <= lo_b <= hi_b):
        raise TaskError(
            "Operand ranges must satisfy 0 <= min <= max; got "
            f"first [{min_operand}, {max_operand}], second [{lo_b}, {hi_b}]."
        )
    if "//" in ops and lo_b < 1:
        raise TaskError("With '//' in ops the second operand must be >= 1 (set min_second: 1).")
    if holdout not in (None, "exclude", "only"):
        raise TaskError(f"holdout must be null, 'exclude' or 'only', got {holdout!r}.")
    if holdout_every < 2:
        raise TaskError(f"holdout_every must be >= 2, got {holdout_every}.")
    n_a, n_b = max_operand - min_operand + 1, hi_b - lo_b + 1
    space = n_a * n_b * len(ops)
    candidates: Sequence[int] = range(space)
    if holdout is not None:
        if space > 1_000_000:
            raise TaskError(f"holdout needs at most 1,000,000 possible questions, these ranges give {space}; narrow them.")

        def held_out(index: int) -> bool:
            op_index, rest = divmod(index, n_a * n_b)
            a_index, b_index = divmod(rest, n_b)
            key = f"{min_operand + a_index}{ops[op_index]}{lo_b + b_index}".encode()
            return int(hashlib.sha256(key).hexdigest(), 16) % holdout_every == 0

        candidates = [i for i in range(space) if held_out(i) == (holdout == "only")]
    if count > len(candidates):
        raise TaskError(
            f"Asked for {count} distinct tasks but these ranges, ops and holdout give only {len(candidates)}; widen them."
        )
    tasks = []
    for index in rng.sample(candidates, count):
        op_index, rest = divmod(index, n_a * n_b)
        a_index, b_index = divmod(rest, n_b)
        a, b, op = min_operand + a_index, lo_b + b_index, ops[op_index]
        tasks.append(
            Task(id=f"{a}{op}{b}", prompt=f"What is {a}{op}{b}?", answer=OPERATORS[op](a, b),
                 metadata={"a": a, "b": b, "op": op})
        )
    return tasks




class CalculatorEnv(AgentEnv):
    """Answer an arithmetic question exactly, with a calculator tool.

    ## Description

    The agent is asked a question such as "What is 27*42?", may compute with `calc` and must submit the exact
    integer with `answer`. The interesting decision is local (call the tool, copy its result, stop), so RL on a tiny
    warm-started model can learn it on a CPU in minutes: this is the quickstart env. Without `tasks`, a question is
    generated from the reset seed (two operands in `[min_operand, max_operand]`, one of `ops`).

    ## Tools

    - `calc(expression)`: evaluate integer arithmetic (`+ - * //` and parentheses) and show the exact value.
    - `answer(value)`: submit the final integer; this ends the episode.

    ## Reward

    1 when the answer equals the question's value (component `success`), else 0. The return is 0 for an episode
    that never answers.

    ## Episode end

    Terminated by `answer` (right or wrong); truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation; 4 leaves room for one mistake around calc + answer.
    - `tasks`: tasks to draw from; without them a question is generated from the reset seed with the operand
      settings below.
    - `min_operand`: smallest operand of generated questions.
    - `max_operand`: largest operand of generated questions.
    - `ops`: operators of generated questions.
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Arithmetic question: compute with calc(expression), then answer(value) exactly."
    cheap_steps = True
    forkable = True
    native_format_hint: ClassVar[str] = (
        "You may also write a call as a plain function call: calc(27*42) computes, answer(1134) submits."
    )

    def __init__(
        self,
        *,
        max_turns: int = 4,
        tasks: Sequence[Task] | None = None,
        min_operand: int = 2,
        max_operand: int = 99,
        ops: Sequence[str] = ("*",),
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
    ) -> None:
        self._task_params: dict[str, Any] = {"min_operand": min_operand, "max_operand": max_operand, "ops": tuple(ops)}
        check_settings(generate_tasks, self._task_params)  # fail fast on bad settings
        self._expected = 0
        self._question = ""
        self._computed: set[int] = set()  # values calc has shown this episode (what the agent can know)
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars,
                         max_calls_per_turn=max_calls_per_turn, render_mode=render_mode)

    # ---- tools ---------------------------------------------------------------------------------
    @tool
    def calc(self, expression: str) -> str | ToolResult:
        """Evaluate integer arithmetic and return its exact value.

        Args:
            expression: Integers with + - * // and parentheses, e.g. "27*42".
        """
        try:
            value = evaluate(expression)
        except CalcError as exc:
            return ToolResult.error(f"Error: {exc}")
        self._computed.add(value)
        shown = " ".join(expression.split()).rstrip("=").strip()
        return f"{shown} = {value}"

    @tool
    def answer(self, value: int | str) -> str:
        """Submit your final answer; this ends the episode.

        Args:
            value: The exact integer answer; a money answer may keep its sign ("$1134", "$1,134").
        """
        self.mark_answer()
        correct = self.task is not None and grade_answer(self.task, value)  # what games.jsonl measures
        self.add_reward("success", 1.0 if correct else 0.0)
        self.finish(success=correct, reason="answered")
        if correct:
            return f"Correct! {self._question} = {self._expected}."
        return f"Wrong. {self._question} = {self._expected}."

    def state_key(self) -> str:
        """The question plus the set of values calc has shown: ``calc(27*42)`` and ``calc(42*27)`` reach the same
        state, and a malformed call (which shows nothing) leaves it unchanged."""
        if self._finished:
            return f"{self._question} answered"
        return f"{self._question} computed {sorted(self._computed)}"

    # ---- hooks ---------------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.calc, self.answer])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["calc", "answer"], {"calc": "expression"})

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return sample_one(generate_tasks, rng, self._task_params)

    def _begin_episode(self, task: Task) -> str:
        self._question = expression_of(task)
        self._computed = set()
        try:
            self._expected = expected_answer(task)
        except CalcError as exc:
            raise TaskError(f"Calculator task {task.id!r} has no answer and {exc}") from None
        return task.prompt

    def _task_instructions(self) -> str:
        return (
            "Answer the arithmetic question with its exact integer value. Compute it with the calc tool, then "
            f"submit it with the answer tool; answering ends the episode. You have {self.max_turns} turns."
        )

    def shortcut_solver(self) -> ReferenceSolver:
        """Answer at once, without calc, with a near miss (wrong by 1-9): a tool-skipping demonstration."""
        expression = expression_of(self.task) if self.task is not None else "0"
        exact = evaluate(expression) if self.task is not None else 0
        miss = 1 + int(hashlib.sha256(expression.encode()).hexdigest(), 16) % 9
        return lambda observation: f"answer({exact + miss})"

    def reference_solver(self) -> ReferenceSolver:
        """``calc(EXPR)``, then ``answer(N)`` with N read from the calc observation."""
        expression = expression_of(self.task) if self.task is not None else ""
        sent_calc = False

        def solve(observation: str) -> str:
            nonlocal sent_calc
            if not sent_calc:
                sent_calc = True
                return f"calc({expression})"
            match = re.search(r"=\s*(-?\d+)\s*$", observation)
            return f"answer({match.group(1) if match else 0})"

        return solve
