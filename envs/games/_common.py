"""Helpers shared by the text games: their parser and RNG plumbing."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser
from agentgym.suite import Task

__all__ = ["games_parser", "python_rng", "sample_one"]


def games_parser(tool_names: Sequence[str], raw_argument_tools: dict[str, str] | None = None) -> CompositeParser:
    """Hermes ``<tool_call>`` plus function-call strings (``move("north")``)."""
    return CompositeParser([HermesParser(), FunctionCallParser(tool_names, raw_argument_tools)])


def python_rng(np_rng: np.random.Generator) -> random.Random:
    """A ``random.Random`` seeded from the env's numpy generator.

    The task generators take ``random.Random`` (so suites are reproducible without numpy state), while
    envs must only draw from ``self.np_random``; this bridges the two deterministically.
    """
    return random.Random(int(np_rng.integers(0, 2**63 - 1)))


def sample_one(generator: Callable[..., list[Task]], np_rng: np.random.Generator, params: dict[str, Any]) -> Task:
    """Draw a single task from a suite generator with the env's RNG."""
    return generator(python_rng(np_rng), 1, **params)[0]
