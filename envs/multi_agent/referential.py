"""A cooperative referential game: a speaker describes a target object so that a listener can pick it.

Both agents see the same candidate objects (size, colour, shape), but in different orders, so "the second
one" does not help: the speaker must describe the target's attributes. Only the speaker knows the target.
The speaker calls ``describe(message)``; the listener answers with ``choose(index)`` or ``ask(question)``
(which gives the speaker another turn). Both agents get +1 when the listener picks the target and 0
otherwise: the reward is shared, so this is a test of communication, not of competition.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from agentgym.errors import ConfigError, TaskError
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

from .base import TextAECEnv, outcome
from .messages import clean_message, quote_message

__all__ = ["ATTRIBUTES", "ReferentialEnv", "distinguishing_description", "generate_setups", "generate_tasks"]

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "size": ("small", "large"),
    "color": ("red", "green", "blue", "yellow"),
    "shape": ("circle", "square", "triangle", "star"),
}
_KEYS = tuple(ATTRIBUTES)
_OBJECTS = list(itertools.product(*(range(len(v)) for v in ATTRIBUTES.values())))  # 32 objects
_WORDS = [w for values in ATTRIBUTES.values() for w in values]
_AGENTS = ("speaker_0", "listener_0")
_MAX_MESSAGE = 200


def _name(obj: Sequence[int]) -> str:
    return " ".join(ATTRIBUTES[k][i] for k, i in zip(_KEYS, obj))


#: The speaker's catalogue: every single attribute word, then every full description.
_SPEAKER_CATALOGUE = _WORDS + [_name(o) for o in _OBJECTS]


def distinguishing_description(target: Sequence[int], others: Sequence[Sequence[int]]) -> str:
    """The shortest attribute description that fits the target and no other candidate."""
    for size in range(1, len(_KEYS) + 1):
        for keys in itertools.combinations(range(len(_KEYS)), size):
            if all(any(o[k] != target[k] for k in keys) for o in others):
                return " ".join(ATTRIBUTES[_KEYS[k]][target[k]] for k in keys)
    return _name(target)


def generate_setups(rng: random.Random, count: int, *, candidates: int = 4) -> list[dict[str, Any]]:
    """Games: distinct candidate objects, a target, and the listener's order of the candidates."""
    if not 2 <= candidates <= len(_OBJECTS):
        raise TaskError(f"candidates must be in 2..{len(_OBJECTS)}, got {candidates}.")
    setups = []
    for _ in range(count):
        objects = [list(o) for o in rng.sample(_OBJECTS, candidates)]
        order = list(range(candidates))
        while order == list(range(candidates)):
            rng.shuffle(order)
        setups.append({"objects": objects, "target": rng.randrange(candidates), "listener_order": order})
    return setups


def generate_tasks(rng: random.Random, count: int, *, candidates: int = 4, seat: str = "speaker_0") -> list[Task]:
    """Tasks for the self-play env: one game each, with the learner's seat.

    Args:
        rng: The only source of randomness.
        count: Number of tasks.
        candidates: Objects per game.
        seat: ``speaker_0`` or ``listener_0``.
    """
    if seat not in _AGENTS:
        raise TaskError(f"seat must be one of {list(_AGENTS)}, got {seat!r}.")
    setups = generate_setups(rng, count, candidates=candidates)
    # The id reaches the learner (info["task_id"]); as the listener it must not name the target, so ids are
    # random draws taken after the setups (same setups as before, deterministic per seed).
    ids = [f"ref-{i}-{rng.getrandbits(32):08x}" for i in range(count)]
    return [Task(id=task_id, prompt=f"Referential game as {seat}.", answer=_name(setup["objects"][setup["target"]]),
                 metadata={"setup": setup, "seat": seat})
            for task_id, setup in zip(ids, setups, strict=True)]


def _mentioned(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower())) & set(_WORDS)


class ReferentialEnv(TextAECEnv):
    """Cooperative: a speaker describes a target object, a listener (other order) must pick it.

    ## Description

    A PettingZoo AEC env with a shared reward: a test of communication, not of competition. `speaker_0` and
    `listener_0` see the same candidate objects (size, colour, shape) in different orders, so "the second one" does
    not help: the speaker must describe the target's attributes. Only the speaker knows the target.

    ## Tools

    - `describe(message)`: (the speaker) describe the target to the listener, at most 200 characters.
    - `choose(index)`: (the listener) pick the object by its number in the listener's own list; this ends the game.
    - `ask(question)`: (the listener) ask the speaker a question instead of choosing now; the speaker gets another
      turn.

    ## Reward

    Both agents get 1 when the listener picks the target and 0 otherwise (component `outcome`), minus
    `invalid_action_penalty` per rejected reply.

    ## Episode end

    Terminated when the listener chooses, when `rounds` speaker turns pass without a choice (a failure), or after
    `max_invalid_actions` bad replies in a row (a failure); truncated after `max_steps` steps.

    ## Arguments

    - `candidates`: objects per game (the listener's catalogue size).
    - `rounds`: speaker turns before the listener must have chosen; the game fails after that.
    - `invalid_action_penalty`: subtracted from an agent's reward for each reply that makes no legal move
      (component `invalid_action`).
    - `max_invalid_actions`: bad replies in a row after which the agent forfeits (`None`: never).
    - `max_steps`: steps (good or bad replies of all agents) after which every agent is truncated.
    - `max_action_chars`: longer replies are rejected as invalid.
    - `render_mode`: `"ansi"` (the whole game state as text) or `None`.

    ## Version history

    - v0: the first version.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "referential_text_v0", "render_modes": ["ansi"],
                                          "is_parallelizable": False}
    description: ClassVar[str] = ("Cooperative referential game: a speaker describes a target object, a listener who "
                                  "sees the objects in another order must pick it.")
    native_format_hint: ClassVar[str] = ('You may also write moves as function calls, e.g. describe("small red circle"), '
                                         'choose(2) or ask("which colour?").')

    def __init__(self, *, candidates: int = 4, rounds: int = 3, invalid_action_penalty: float = 0.1,
                 max_invalid_actions: int | None = 3, max_steps: int = 40, max_action_chars: int = 4000,
                 render_mode: str | None = None) -> None:
        if not 2 <= candidates <= len(_OBJECTS):
            raise ConfigError(f"candidates must be in 2..{len(_OBJECTS)}, got {candidates}.")
        if rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {rounds}.")
        self.candidates = int(candidates)
        self.rounds = int(rounds)
        self.objects: list[list[int]] = []
        self.target = 0
        self.listener_order: list[int] = []
        self.messages: list[tuple[str, str]] = []
        self.speaker_turns = 0
        super().__init__(agents=_AGENTS, invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    # ---- game ----------------------------------------------------------------------------------------------
    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        if setup is None:
            setup = generate_setups(random.Random(int(rng.integers(2**63 - 1))), 1, candidates=self.candidates)[0]
        try:
            objects = [[int(v) for v in o] for o in setup["objects"]]
            target, order = int(setup["target"]), [int(i) for i in setup["listener_order"]]
        except (KeyError, TypeError, ValueError):
            raise ConfigError("A referential setup needs 'objects', 'target' and 'listener_order'.") from None
        if (len(objects) != self.candidates or sorted(order) != list(range(self.candidates))
                or not 0 <= target < len(objects)):
            raise ConfigError(f"The setup must hold {self.candidates} objects, a target index among them and a "
                              "permutation of their indices as 'listener_order'.")
        self.objects, self.target, self.listener_order = objects, target, order
        self.messages = []
        self.speaker_turns = 0

    def listener_index_of_target(self) -> int:
        return self.listener_order.index(self.target)

    def _end(self, correct: bool, summary: str) -> None:
        value = 1.0 if correct else 0.0
        self._end_game(dict.fromkeys(self.agents, value),
                       {a: outcome(success=correct, score=value, end_reason="solved" if correct else "failed",
                                   result="correct" if correct else "wrong") for a in self.agents}, summary)

    def _forfeit(self, agent: str) -> None:
        self._end(False, f"{agent} made {self.max_invalid_actions} invalid replies in a row.")

    # ---- tools ------------------------------------------------------------------------------------------------
    @tool
    def describe(self, message: str) -> str | ToolResult:
        """Describe the target object to the listener.

        Args:
            message: A short description (at most 200 characters), e.g. "the small red one".
        """
        if not clean_message(message):
            return ToolResult.error("Error: the description is empty; describe the target's size, colour or shape.")
        if len(message) > _MAX_MESSAGE:
            return ToolResult.error(f"Error: the description has {len(message)} characters; the limit is {_MAX_MESSAGE}.")
        message = clean_message(message)
        self.messages.append(("speaker_0", message))
        self.speaker_turns += 1
        self._tell_others(f"The speaker says: {quote_message(message)}")
        return "Your description was sent to the listener."

    @tool
    def choose(self, index: int) -> str | ToolResult:
        """Pick the object you think is the target.

        Args:
            index: The object's number in YOUR list.
        """
        if isinstance(index, float) and index.is_integer():
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.candidates:
            return ToolResult.error(f"Error: choose an object number between 0 and {self.candidates - 1}.")
        picked = self.listener_order[index]
        correct = picked == self.target
        self._tell_others(f"The listener chose {_name(self.objects[picked])}.")
        self._end(correct, f"The listener chose {_name(self.objects[picked])}; the target was "
                  f"{_name(self.objects[self.target])}.")
        return f"You chose {_name(self.objects[picked])}: {'correct' if correct else 'wrong'}."

    @tool
    def ask(self, question: str) -> str | ToolResult:
        """Ask the speaker a question instead of choosing now.

        Args:
            question: The question (at most 200 characters).
        """
        if self.speaker_turns >= self.rounds:
            return ToolResult.error("Error: the speaker has no turns left; call choose(index) now.")
        if not clean_message(question) or len(question) > _MAX_MESSAGE:
            return ToolResult.error(f"Error: ask a non-empty question of at most {_MAX_MESSAGE} characters.")
        question = clean_message(question)
        self.messages.append(("listener_0", question))
        self._tell_others(f"The listener asks: {quote_message(question)}")
        return "Your question was sent to the speaker."

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.describe]) if agent == "speaker_0" else ToolSet([self.choose, self.ask])

    def _raw_argument_tools(self) -> dict[str, str]:
        return {"describe": "message", "ask": "question"}

    def _next_agent(self, agent: str) -> str:
        return "listener_0" if agent == "speaker_0" else "speaker_0"

    # ---- observations -------------------------------------------------------------------------------------------
    def _view(self, agent: str) -> list[int]:
        """Indices into ``objects`` in the order ``agent`` sees them."""
        return list(range(self.candidates)) if agent == "speaker_0" else list(self.listener_order)

    def _observation_box(self, agent: str) -> spaces.Box:
        return spaces.Box(0, max(len(v) for v in ATTRIBUTES.values()) - 1, shape=(self.candidates, len(_KEYS) + 1),
                          dtype=np.int64)

    def _observation_array(self, agent: str) -> np.ndarray:
        rows = []
        for i in self._view(agent):
            is_target = int(agent == "speaker_0" and i == self.target)
            rows.append([*(self.objects[i] if self.objects else [0, 0, 0]), is_target])
        return np.array(rows, dtype=np.int64)

    def _catalogue_size(self, agent: str) -> int | None:
        return len(_SPEAKER_CATALOGUE) if agent == "speaker_0" else self.candidates

    def _catalogue_action(self, agent: str, index: int) -> str:
        if agent == "speaker_0":
            return f'describe("{_SPEAKER_CATALOGUE[index]}")'
        return f"choose({index})"

    def _legal_mask(self, agent: str) -> np.ndarray:
        return np.ones(self._catalogue_size(agent) or 0, dtype=np.int8)

    def _render_state(self, agent: str) -> str:
        lines = [f"Referential game. You are the {'speaker' if agent == 'speaker_0' else 'listener'} ({agent}).",
                 "Objects (in your order):"]
        for pos, i in enumerate(self._view(agent)):
            mark = "  <- TARGET" if agent == "speaker_0" and i == self.target else ""
            lines.append(f"  {pos}. {_name(self.objects[i])}{mark}")
        if self.messages:
            lines.append("Conversation so far: " + " | ".join(f"{who.split('_')[0]}: {quote_message(text)}"
                                                    for who, text in self.messages))
        lines.append(f"Speaker turns left: {self.rounds - self.speaker_turns}.")
        return "\n".join(lines)

    def _your_move(self, agent: str) -> str:
        if agent == "speaker_0":
            return 'Your move: describe("...") the target so that the listener can pick it.'
        if self.speaker_turns >= self.rounds:
            return "Your move: choose(index) now (the speaker has no turns left)."
        return 'Your move: choose(index) with the number in your list, or ask("...") the speaker.'

    def _rules(self, agent: str) -> str:
        common = (f"A cooperative game for two: {self.candidates} objects, each with a size, colour and shape. Both "
                  "players see them, but in different orders. Only the speaker knows which one is the target. Both "
                  "score 1 if the listener chooses the target and 0 otherwise. ")
        if agent == "speaker_0":
            return common + ("You are the speaker: call describe(message) with words that single out the target "
                             "(positions are useless: the listener's order differs).")
        return common + ("You are the listener: read the speaker's description and call choose(index) with the "
                         "target's number in your list, or ask(question) while the speaker has turns left "
                         f"(it has {self.rounds}).")

    # ---- bots ---------------------------------------------------------------------------------------------------
    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """Speaker: the shortest distinguishing description. Listener: the candidate that fits the words best."""
        if agent == "speaker_0":
            others = [o for i, o in enumerate(self.objects) if i != self.target]
            return f'describe("{distinguishing_description(self.objects[self.target], others)}")'
        words = set().union(*(_mentioned(text) for who, text in self.messages if who == "speaker_0"))
        view = self._view(agent)
        scores = [sum(ATTRIBUTES[k][v] in words for k, v in zip(_KEYS, self.objects[i])) for i in view]
        best = [pos for pos, s in enumerate(scores) if s == max(scores)]
        if len(best) > 1 and self.speaker_turns < self.rounds and not words:
            return 'ask("Which object is it? Please name its size, colour or shape.")'
        return f"choose({best[int(rng.integers(len(best)))]})"

    def reference_action(self, agent: str) -> str:
        """Speaker: the distinguishing description. Listener: the target (it knows the answer)."""
        if agent == "speaker_0":
            return self.scripted_action(agent, np.random.default_rng(0))
        return f"choose({self.listener_index_of_target()})"
