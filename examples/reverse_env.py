"""Reverse a word: a complete agentgym env (one tool, a task sampler, a reference solver) in 40 lines."""
import random

from agentgym import AgentEnv, Task, ToolSet, tool

WORDS = ["fox", "owl", "tiger", "otter", "lemur", "zebra", "koala", "panda", "bison", "camel", "moose", "llama"]


def make_tasks(rng: random.Random, count: int) -> list[Task]:  # the task sampler (the suite calls it per split)
    words = [rng.choice(WORDS) + rng.choice(WORDS) for _ in range(count)]
    return [Task(id=f"w{i}", prompt=f"Reverse the word {w}.", answer=w[::-1]) for i, w in enumerate(words)]


class ReverseEnv(AgentEnv):
    @tool
    def answer(self, text: str) -> str:
        """Give the reversed word; this ends the episode.

        Args:
            text: The word spelled backwards.
        """
        self.mark_answer()
        self.finish(success=text.strip() == self.task.answer)  # score 1.0 or 0.0, paid as this step's reward
        return f"The answer was {self.task.answer}."

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.answer])

    def _sample_task(self, rng) -> Task:  # rng is self.np_random: episodes replay from their seed
        return make_tasks(random.Random(int(rng.integers(2**31))), 1)[0]

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Reverse the word you are given and call answer with it."

    def reference_solver(self):
        return lambda observation: f'answer("{self.task.answer}")'
