"""Helpers shared by the text games: a crash-proof parser wrapper and RNG plumbing.

Kept private to the games package: the real fixes belong in :mod:`agentgym.parsers`, and once they land
the guard below becomes a no-op that only costs one ``try``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser, ParsedAction, ToolCallParser
from agentgym.tasks import Task

__all__ = ["GuardedParser", "games_parser", "python_rng", "sample_one"]


class GuardedParser:
    """Wrap a parser so that model text can never raise out of ``parse``.

    ``HermesParser`` lets ``json.loads`` errors other than ``JSONDecodeError`` escape: a deeply nested
    ``<tool_call>[[[[...`` raises ``RecursionError`` and an integer literal with more than 4300 digits
    raises ``ValueError``. An action is model output, so either would crash ``env.step``; the guard turns
    them into a parse error (an ``invalid`` turn) instead.
    """

    def __init__(self, inner: ToolCallParser, label: str) -> None:
        self.inner = inner
        self.label = label

    def parse(self, text: str) -> ParsedAction:
        try:
            return self.inner.parse(text)
        except (RecursionError, ValueError, MemoryError, OverflowError) as exc:
            return ParsedAction(
                errors=(
                    f"Could not read the {self.label} in your reply ({type(exc).__name__}: it is nested too deeply "
                    "or holds a number that is too long). Write one short, flat tool call.",
                )
            )


def games_parser(tool_names: Sequence[str], raw_argument_tools: dict[str, str] | None = None) -> CompositeParser:
    """Hermes ``<tool_call>`` plus function-call strings (``move("north")``), both crash-proof."""
    return CompositeParser(
        [
            GuardedParser(HermesParser(), "<tool_call> JSON"),
            GuardedParser(FunctionCallParser(tool_names, raw_argument_tools), "function call"),
        ]
    )


def python_rng(np_rng: np.random.Generator) -> random.Random:
    """A ``random.Random`` seeded from the env's numpy generator.

    The task generators take ``random.Random`` (so suites are reproducible without numpy state), while
    envs must only draw from ``self.np_random``; this bridges the two deterministically.
    """
    return random.Random(int(np_rng.integers(0, 2**63 - 1)))


def sample_one(generator: Callable[..., list[Task]], np_rng: np.random.Generator, params: dict[str, Any]) -> Task:
    """Draw a single task from a suite generator with the env's RNG."""
    return generator(python_rng(np_rng), 1, **params)[0]
