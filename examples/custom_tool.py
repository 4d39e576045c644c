"""A custom tool: a typed, documented function; agentgym derives its JSON schema from the hints and docstring."""
import json

from agentgym import ToolCall, ToolSet, tool
from reverse_env import ReverseEnv


@tool
def spell(word: str, backwards: bool = False) -> str:
    """Spell a word letter by letter.

    Args:
        word: The word to spell.
        backwards: Spell it from the last letter to the first.
    """
    return " ".join(reversed(word) if backwards else word)


class ReverseWithSpellEnv(ReverseEnv):
    """The example env with one more tool: every parser format reaches it, and its schema is in the prompt."""

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.answer, spell])


if __name__ == "__main__":
    print(json.dumps(spell.schema(), indent=1))
    tools = ToolSet([spell])
    print(tools.call(ToolCall("spell", {"word": "otter", "backwards": True})).content)
    print(tools.call(ToolCall("spell", {"word": 42})).content)  # a bad argument is an error result, not a crash
    env = ReverseWithSpellEnv()
    observation, info = env.reset(seed=0)
    print(observation, "->", env.step('spell("owlfox", backwards=True)')[0])
