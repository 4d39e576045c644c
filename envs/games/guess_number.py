"""Guess the number: find a secret integer from "higher" / "lower" feedback.

A multi-turn game whose optimal play (binary search) needs the agent to track an interval across turns;
it is a deliberately harder credit-assignment problem than the calculator for tiny models.
"""

from __future__ import annotations

import math
import numbers
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from agentgym.envs.games._common import games_parser, sample_one

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["GuessNumberEnv", "binary_search_guesses", "generate_tasks"]


def binary_search_guesses(low: int, high: int) -> int:
    """Guesses binary search needs in the worst case to find a number in ``[low, high]``."""
    return max(1, math.ceil(math.log2(high - low + 2)))


def check_range(low: int, high: int) -> None:
    """Fail fast on a range no secret fits in (the env checks it at construction, before any episode)."""
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (low, high)):
        raise TaskError(f"GuessNumber's low and high must be integers, got low={low!r}, high={high!r}.")
    if low > high:
        raise TaskError(f"GuessNumber needs low <= high, got low={low}, high={high}.")


def generate_tasks(rng: random.Random, count: int, *, low: int = 1, high: int = 100) -> list[Task]:
    """Draw ``count`` distinct secrets from ``[low, high]``.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks; at most ``high - low + 1`` (secrets never repeat within a split).
        low: Smallest possible secret (shown to the agent).
        high: Largest possible secret (shown to the agent).
    """
    check_range(low, high)
    size = high - low + 1
    if count > size:
        raise TaskError(f"Asked for {count} distinct secrets but [{low}, {high}] holds only {size}; widen the range.")
    drawn = rng.sample(range(low, high + 1), count)
    return [
        Task(
            id=task_id,
            prompt=f"I am thinking of an integer between {low} and {high} (inclusive). Find it.",
            answer=secret,
            metadata={"low": low, "high": high, "secret": secret},
        )
        for secret, task_id in zip(drawn, _opaque_ids(rng, low, high, count), strict=True)
    ]


def _opaque_ids(rng: random.Random, low: int, high: int, count: int) -> list[str]:
    """Task ids that say nothing about the secrets.

    The id reaches the policy (``info["task_id"]``) and the CLI prints it, so it must not be the secret nor
    any function of it (a hash of a secret from 100 values is brute-forced in microseconds). The ids are
    drawn after the secrets from the same seeded RNG: deterministic per suite, independent of the secrets.
    """
    ids: list[str] = []
    while len(ids) < count:
        task_id = f"guess-{low}-{high}-{rng.getrandbits(48):012x}"
        if task_id not in ids:
            ids.append(task_id)
    return ids


class GuessNumberEnv(AgentEnv):
    """Find a secret integer; every guess is answered "higher", "lower" or "correct".

    ## Description

    A secret integer is drawn from an announced range and each `guess` is answered "higher", "lower" or "correct".
    Optimal play is binary search, which needs the agent to track an interval across turns: a harder
    credit-assignment problem than the calculator for tiny models. Without `tasks`, the secret is drawn from
    `[low, high]` with the reset seed.

    ## Tools

    - `guess(number)`: guess the secret; a guess outside the announced range is an error and changes nothing.

    ## Reward

    1 for the correct guess (component `success`); 0 for an episode that runs out of turns.

    ## Episode end

    Terminated by the correct guess; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation. `None` (default) gives each task what binary search needs plus 2, so a
      bigger range in a test split stays solvable.
    - `tasks`: tasks to draw from; without them a secret is drawn from `[low, high]` with the reset seed.
    - `low`: range of generated secrets (lower end).
    - `high`: range of generated secrets (upper end).
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`. 1 by default: the game is one guess per turn, and a reply holding many
      guesses would otherwise search 4x faster than the turn budget assumes (only the first call runs, the
      observation says the rest were ignored).
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Find a secret integer by guessing; each guess is answered higher, lower or correct."
    cheap_steps = True
    forkable = True
    native_format_hint: ClassVar[str] = "You may also write a guess as a plain function call, e.g. guess(50)."

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        tasks: Sequence[Task] | None = None,
        low: int = 1,
        high: int = 100,
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 1,
        render_mode: str | None = None,
    ) -> None:
        self._task_params: dict[str, Any] = {"low": low, "high": high}
        check_range(low, high)  # fail fast on bad settings
        self._fixed_max_turns = max_turns
        self._low, self._high, self._secret = low, high, low
        self._known = (low, high)  # the interval still consistent with the feedback given so far
        super().__init__(max_turns=binary_search_guesses(low, high) + 2 if max_turns is None else max_turns,
                         tasks=tasks, max_action_chars=max_action_chars,
                         max_calls_per_turn=max_calls_per_turn, render_mode=render_mode)

    @tool
    def guess(self, number: int) -> str | ToolResult:
        """Guess the secret number.

        Args:
            number: An integer inside the announced range.
        """
        if not self._low <= number <= self._high:
            return ToolResult.error(
                f"Error: the guess must lie between {self._low} and {self._high} (inclusive); "
                "guess an integer inside that range."
            )
        number = int(number)
        if number < self._secret:
            self._known = (max(self._known[0], number + 1), self._known[1])
            return f"higher: the number is greater than {number}."
        if number > self._secret:
            self._known = (self._known[0], min(self._known[1], number - 1))
            return f"lower: the number is less than {number}."
        self._known = (number, number)
        self.add_reward("success", 1.0)
        self.finish(success=True, reason="solved")
        return f"correct! The number is {number}."

    def state_key(self) -> str:
        """The interval the feedback so far leaves for the secret: guesses 50 then 25 and 25 then 50 both leave
        the same candidates, so both are the same state (a wasted guess keeps the key unchanged)."""
        low, high = self._known
        return f"solved {low}" if self._finished and self._success else f"secret in [{low}, {high}]"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.guess])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["guess"])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return sample_one(generate_tasks, rng, self._task_params)

    def _begin_episode(self, task: Task) -> str:
        meta = task.metadata
        try:
            low, high = int(meta["low"]), int(meta["high"])
            secret = int(meta["secret"]) if "secret" in meta else int(task.answer)
        except (KeyError, TypeError, ValueError):
            raise TaskError(
                f"GuessNumber task {task.id!r} needs integer metadata low, high and secret (or answer)."
            ) from None
        if not low <= secret <= high:
            raise TaskError(f"GuessNumber task {task.id!r}: secret {secret} lies outside [{low}, {high}].")
        self._low, self._high, self._secret = low, high, secret
        self._known = (low, high)
        if self._fixed_max_turns is None:
            self.max_turns = binary_search_guesses(low, high) + 2
        return task.prompt

    def _task_instructions(self) -> str:
        return (
            f"Find the secret integer between {self._low} and {self._high} (inclusive). Call guess with one "
            "number per turn; the reply is 'higher', 'lower' or 'correct'. "
            f"You have {self.max_turns} turns."
        )

    def reference_solver(self) -> ReferenceSolver:
        """Binary search driven only by the text feedback."""
        lo, hi = self._low, self._high
        last: int | None = None

        def solve(observation: str) -> str:
            nonlocal lo, hi, last
            if last is not None:
                if re.match(r"\s*higher", observation):
                    lo = last + 1
                elif re.match(r"\s*lower", observation):
                    hi = last - 1
            last = (lo + hi) // 2
            return f"guess({last})"

        return solve
