"""Small envs used only by tests of the engine: one that crashes or hangs on command, one that echoes."""

from __future__ import annotations

import threading
import time

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import EnvCrashed
from agentgym.suite import Task
from agentgym.toolset import ToolSet, tool


class EchoEnv(AgentEnv):
    """Echo tool: returns its text; ``stop`` ends the episode successfully. ``made_on`` names the thread that built
    the instance (a test tells the engine's inline construction from a worker-thread one)."""

    description = "test env: echo"

    def __init__(self, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("max_turns", 3)
        super().__init__(**kwargs)
        self.made_on = threading.current_thread().name

    @tool
    def echo(self, text: str) -> str:
        """Echo the text back.

        Args:
            text: Anything.
        """
        return f"echo: {text}"

    @tool
    def stop(self) -> str:
        """End the episode."""
        self.mark_answer()
        self.finish(success=True)
        return "stopped"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.echo, self.stop])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        n = int(rng.integers(1000))
        return Task(id=f"echo-{n}", prompt=f"Say {n}.")

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Echo things, then stop."

    def reference_solver(self) -> ReferenceSolver:
        return lambda obs: '<tool_call>{"name": "stop", "arguments": {}}</tool_call>'


class FlakyEnv(EchoEnv):
    """Like EchoEnv, but the action 'crash' raises in step, 'hang' sleeps for a long time, 'die' is EnvCrashed."""

    def step(self, action):  # type: ignore[no-untyped-def]
        if action == "crash":
            raise RuntimeError("simulated env bug")
        if action == "hang":
            time.sleep(5)
        if action == "die":
            raise EnvCrashed("simulated sandbox death")
        return super().step(action)


class UnseededEnv(EchoEnv):
    """Like EchoEnv, but each reset shows a fresh nonce: not reproducible from its seed (replay must notice)."""

    def _begin_episode(self, task: Task) -> str:
        return f"{task.prompt} (nonce {time.time_ns()})"


class CheapEchoEnv(EchoEnv):
    """Like EchoEnv, but ``cheap_steps``: the engine builds and steps it on its event loop."""

    cheap_steps = True


class ProgressEnv(EchoEnv):
    """Like EchoEnv, but each echo pays 0.25 of progress (``add_reward``), and a truncated episode keeps what it
    earned, as TextWorld scores a truncated game by the points it has."""

    @tool
    def echo(self, text: str) -> str:
        """Echo the text back, for a quarter point of progress.

        Args:
            text: Anything.
        """
        self.add_reward("progress", 0.25)
        return f"echo: {text}"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.echo, self.stop])

    def _pay_outcome(self) -> None:
        if not self._finished:
            self._score = self._paid + float(sum(self._step_rewards.values()))
        super()._pay_outcome()
