"""SayWord: say the word you are given. Replace the task and the tools with your own."""

import random

from agentgym import AgentEnv, Task, ToolSet, tool

# Held out means never trained on: the test split draws from words the training split cannot contain.
WORDS = {"train": ["apple", "river", "stone", "cloud", "tiger", "maple", "piano", "lemon"], "test": ["ocean", "zebra"]}


def make_tasks(rng: random.Random, count: int, words: str = "train") -> list[Task]:
    """The task sampler: ``count`` tasks drawn from ``rng`` out of the ``words`` list (a suite file calls it once
    per split, with that split's options)."""
    drawn = [rng.choice(WORDS[words]) for _ in range(count)]
    return [Task(id=f"say-{i}", prompt=f"Say the word {w}.", answer=w) for i, w in enumerate(drawn)]


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
