"""SayWord: say the word you are given. Replace the task and the tools with your own."""

import random

from agentgym import AgentEnv, Task, ToolSet, tool

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "piano", "lemon", "ocean", "zebra"]


def make_tasks(rng: random.Random, count: int) -> list[Task]:
    """The task sampler: ``count`` tasks drawn from ``rng`` (a suite file calls it once per split)."""
    words = [rng.choice(WORDS) for _ in range(count)]
    return [Task(id=f"say-{i}", prompt=f"Say the word {w}.", answer=w) for i, w in enumerate(words)]


class SayWordEnv(AgentEnv):
    description = "SayWord: say the word you are given."

    @tool
    def answer(self, text: str) -> str:
        """Say the word; this ends the episode.

        Args:
            text: The word.
        """
        self.mark_answer()
        self.finish(success=text.strip().lower() == self.task.answer)  # score 1.0 or 0.0, paid as the reward
        return f"The word was {self.task.answer}."

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.answer])

    def _sample_task(self, rng) -> Task:  # rng is self.np_random, so episodes replay from their seed
        return make_tasks(random.Random(int(rng.integers(2**31))), 1)[0]

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Call answer with the word you are asked to say."

    def reference_solver(self):
        return lambda observation: f'answer("{self.task.answer}")'
