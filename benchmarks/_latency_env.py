"""A benchmark-only env whose tool calls take heavy-tailed (lognormal) time, like real tools.

Each episode is exactly ``turns`` tool calls long. The latency of a call is drawn from the env's own
seeded generator, so the engine and the baseline loop see identical latencies for identical seeds.
"""

from __future__ import annotations

import time

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.suite import Task
from agentgym.toolset import ToolSet, tool


class LatencyEnv(AgentEnv):
    """``work(n)`` sleeps a lognormal time; the episode ends after ``turns`` successful calls."""

    description = "benchmark env: tool calls with lognormal latency"

    def __init__(self, *, turns: int = 3, median_s: float = 0.2, sigma: float = 1.0, max_s: float = 10.0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.turns = turns
        self.median_s = median_s
        self.sigma = sigma
        self.max_s = max_s
        kwargs.setdefault("max_turns", turns)
        super().__init__(**kwargs)

    @tool
    def work(self, n: int) -> str:
        """Do some slow work.

        Args:
            n: Any integer.
        """
        delay = min(self.max_s, self.median_s * float(np.exp(self.sigma * self.np_random.standard_normal())))
        time.sleep(delay)
        self._calls += 1
        if self._calls >= self.turns:
            self.finish(success=True, reason="solved")
        return f"done {n} in {delay:.3f}s"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.work])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return Task(id=f"latency-{int(rng.integers(1 << 30))}", prompt="Call work three times.")

    def _begin_episode(self, task: Task) -> str:
        self._calls = 0
        return task.prompt

    def _task_instructions(self) -> str:
        return "Call the work tool until the episode ends."

    def reference_solver(self) -> ReferenceSolver:
        return lambda obs: '<tool_call>{"name": "work", "arguments": {"n": 1}}</tool_call>'
