"""``agentgym/TextWorld-v0``: play TextWorld cooking and household games with ``command(text)``.

The games are generated offline by TextWorld (see :mod:`agentgym.envs.textworld.games`) and played through
``textworld.start``. The reward is the game's own score, normalised by its maximum score, paid on the step that
earns it; the episode ends when the game is won (success) or lost. A truncated episode keeps the score it earned
(the standard TextWorld metric), so the return is always ``score / max_score``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.envs.games._common import games_parser
from agentgym.envs.textworld.games import (KINDS, LEVELS, GameSpec, check_content, game_content, game_path,
                                           prepare_games, require_textworld, spec_from_task, task_for)
from agentgym.errors import EnvCrashed, TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["TextWorldEnv"]

MAX_COMMAND_CHARS = 200
_COMMAND_OK = re.compile(r"[ -~]+")  # printable ASCII: what the Inform parser reads
# TextWorld parses a game's logic with one shared parser object, which is not thread-safe: envs starting games on
# several rollout threads at once failed with parser errors ("expecting 'predicates'", "pop from empty list") in
# 18-39 of 40 episodes. Starting one game at a time fixes it; a started game's reset and steps are its own.
_START_LOCK = threading.Lock()
_BANNER_CHARS = set(" _|\\/$<>")


def _clean(feedback: str) -> str:
    """The game's text without the ASCII-art title, the replay prompt and the status-line padding."""
    lines = []
    for line in feedback.splitlines():
        stripped = line.strip()
        if stripped and set(stripped) <= _BANNER_CHARS:
            continue
        if stripped.startswith("Would you like to RESTART"):
            continue
        if stripped.startswith(">") and len(line) > 80:  # the status line the interpreter pads to 128 columns
            stripped = stripped.lstrip("> ").strip()
            if re.fullmatch(r"-= .* =-\d+/\d+", stripped):
                continue
        lines.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class TextWorldEnv(AgentEnv):
    """TextWorld cooking and household games generated offline: `command("open fridge")`; the game's own score.

    ## Description

    Two kinds of TextWorld games: cooking (the First TextWorld Problems games: houses of 1, 6 or 9 rooms drawn per
    game) and household (TextWorld's `tw-simple`: one fixed six-room house with a few dozen quests, for training
    only; it is not ALFWorld). The games are generated offline by TextWorld (`agentgym.envs.textworld.games`) at
    difficulty levels 1-3 and played through `textworld.start`; every game is generated once and cached, so seeded
    resets stay fast. With `admissible_commands`, every observation also lists the commands the game accepts (an
    easier variant).

    Held-out games are held out in content: a game's distribution (`train`, `valid`, `test`) fixes its recipe's
    foods (disjoint lists) and its house layout (disjoint sets of layouts), so no validation or test recipe,
    walkthrough or house equals a training one; every reset checks this (`check_content`) and refuses a game that
    breaks it. Held-out games are cooking games of levels 2-3 (level 1 is one kitchen in every game).

    ## Tools

    - `command(text)`: type one command into the game, e.g. `open fridge`, `take apple`, `go east`, `look`,
      `inventory`.

    ## Reward

    The game's own score normalised by its maximum score, paid on the step that earns it (component `score`). A
    truncated episode keeps the score it earned (the standard TextWorld metric), so the return is always `score /
    max_score`; success means the game is won.

    ## Episode end

    Terminated when the game is won or lost; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation. `None` (default): twice the game's walkthrough plus 10.
    - `tasks`: tasks to draw from (see `agentgym.envs.textworld.games.generate_tasks`).
    - `kinds`: game kinds of the default pool, drawn from when no tasks are given.
    - `level`: difficulty level (1-3) of the default pool (training distribution).
    - `pool_size`: game seeds `0 .. pool_size - 1` per kind form the default pool. It is small on purpose: every
      game is generated once (seconds) and then cached.
    - `admissible_commands`: append the game's admissible commands to every observation (an easier variant).
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`; extra commands in one reply run in order.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version; held-out distributions made disjoint in foods and layouts later (games are
      regenerated into a new cache directory, `games-v3`).
    """

    description: ClassVar[str] = "TextWorld cooking and household games played with command(text); the game's score."
    native_format_hint: ClassVar[str] = (
        'You may also write a command as a plain function call, e.g. command("open fridge").')

    @classmethod
    def prepare_tasks(cls, tasks: Sequence[Task]) -> None:
        """Generate the games these tasks name that are not cached yet, in parallel, before their episodes start
        (tasks that name no game are left to ``reset``, which says what they lack)."""
        specs = []
        for task in tasks:
            try:
                specs.append(spec_from_task(task))
            except TaskError:
                continue
        prepare_games(specs)

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        tasks: Sequence[Task] | None = None,
        kinds: Sequence[str] = KINDS,
        level: int = 1,
        pool_size: int = 1,
        admissible_commands: bool = False,
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}.")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}.")
        self._pool = [GameSpec(kind, int(level), "train", seed) for kind in kinds for seed in range(pool_size)]
        if not self._pool:
            raise ValueError(f"kinds must name at least one of {KINDS}.")
        self._admissible = bool(admissible_commands)
        self._fixed_max_turns = max_turns
        self._games: dict[str, Any] = {}  # game file -> started textworld env (reset per episode)
        self._game: Any = None
        self._state: Any = None
        self._walkthrough: list[str] = []
        self._max_score = 1.0
        super().__init__(max_turns=60 if max_turns is None else max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, max_calls_per_turn=max_calls_per_turn,
                         render_mode=render_mode)

    # ---- tool --------------------------------------------------------------------------------
    @tool
    def command(self, text: str) -> str | ToolResult:
        """Type one command into the game, e.g. "open fridge", "take apple", "go east", "look", "inventory".

        Args:
            text: The command in plain English.
        """
        if self._game is None or self._state is None:
            return ToolResult.error("Error: no game is loaded; call reset() first.")
        if self._finished:
            return ToolResult.error("Error: the game is over; this command was not run.")
        text = " ".join(str(text).split())
        if not text:
            return ToolResult.error('Error: the command is empty. Type a command such as "look".')
        if len(text) > MAX_COMMAND_CHARS or not _COMMAND_OK.fullmatch(text):
            return ToolResult.error(f"Error: a command is one line of plain ASCII text of at most {MAX_COMMAND_CHARS} "
                                    'characters, such as "take apple".')
        before = float(self._state["score"])
        try:
            self._state, _, _ = self._game.step(text)
        except Exception as exc:  # noqa: BLE001 - the interpreter died: infrastructure, not a model mistake
            raise EnvCrashed(f"the TextWorld interpreter failed on {text!r}: {type(exc).__name__}: {exc}") from exc
        score = float(self._state["score"])
        if score != before:
            self.add_reward("score", (score - before) / self._max_score)
        observation = _clean(self._state["feedback"])
        if self._state["won"]:
            self.finish(success=True, score=score / self._max_score, reason="solved")
        elif self._state["lost"]:
            self.finish(success=False, score=score / self._max_score, reason="failed")
        else:
            observation += self._hint()
        return ToolResult(observation, metadata={"score": score, "max_score": self._max_score})

    def _hint(self) -> str:
        if not self._admissible or self._state is None:
            return ""
        return "\n\nAdmissible commands: " + ", ".join(self._state["admissible_commands"])

    # ---- AgentEnv hooks ------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.command])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["command"], {"command": "text"})

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return task_for(self._pool[int(rng.integers(len(self._pool)))])

    def _begin_episode(self, task: Task) -> str:
        spec = spec_from_task(task)
        path = str(game_path(spec))
        game = self._games.get(path)
        if game is None:
            # A held-out game must not share foods or a house with training games; refusing one here makes every
            # episode (and so a suite's validate()) fail loudly should the generator ever stop holding them out.
            check_content(spec, game_content(spec))
            textworld = require_textworld()
            infos = textworld.EnvInfos(score=True, max_score=True, won=True, lost=True, facts=True,
                                       policy_commands=True, admissible_commands=self._admissible,
                                       extras=["walkthrough"])
            try:
                with warnings.catch_warnings():
                    # Jericho does not know TextWorld's generated games; TextWorld tracks score and win itself.
                    warnings.filterwarnings("ignore", message=".*is not fully supported.*")
                    with _START_LOCK:
                        game = textworld.start(path, request_infos=infos)
            except Exception as exc:  # noqa: BLE001 - a corrupt cache entry or a broken install
                raise TaskError(f"Cannot start the TextWorld game {path} for task {task.id!r}: {exc}. Delete that "
                                "directory to regenerate the game.") from exc
            self._games[path] = game
        self._game = game
        self._state = game.reset()
        self._walkthrough = list(self._state.get("extra.walkthrough") or [])
        self._max_score = float(self._state["max_score"]) or 1.0
        if self._fixed_max_turns is None:
            self.max_turns = int(task.metadata.get("max_turns", 2 * len(self._walkthrough) + 10))
        return f"{task.prompt}\n\n{_clean(self._state['feedback'])}{self._hint()}"

    def _task_instructions(self) -> str:
        return (
            "You play a text adventure. Each turn, type one command with the command tool (for example "
            '"look", "inventory", "examine cookbook", "open fridge", "take apple from fridge", "go east", '
            '"put apple on table"). The game answers in text and gives points for progress; it ends when you '
            f"win or lose. You have {self.max_turns} turns."
        )

    def _pay_outcome(self) -> None:
        """A truncated game keeps the points it earned (TextWorld's normalised score), not zero."""
        if not self._finished and self._state is not None:
            self._score = float(self._state["score"]) / self._max_score
        super()._pay_outcome()

    def state_key(self) -> str:
        """The game's world state: a digest of its true facts (the player's room, what is open, held, cooked),
        named by the room, so the same situation reached along different paths gives the same key."""
        if self._state is None:
            return "textworld (no game)"
        facts = sorted(str(f) for f in self._state["facts"])
        room = next((f.arguments[1].name for f in self._state["facts"]
                     if f.name == "at" and f.arguments[0].name == "P"), "?")
        digest = hashlib.sha1("\n".join(facts).encode()).hexdigest()[:16]
        return f"textworld {room} {digest}" + (" (won)" if self._state["won"] else "")

    def reference_solver(self) -> ReferenceSolver:
        """The game's own winning policy from the current state (TextWorld recomputes it after every command)."""

        def solve(observation: str) -> str:
            if self._state is None:
                return 'command("look")'
            policy = self._state["policy_commands"] or ["look"]
            # the native call, as the tool is documented: a tool-call JSON wrapper is 18 more tokens a turn to clone
            return f"command({json.dumps(policy[0])})"

        return solve

    def close(self) -> None:
        for game in self._games.values():
            try:
                game.close()
            except Exception:  # noqa: BLE001 - closing is best effort and idempotent
                pass
        self._games.clear()
        self._game = self._state = None
        super().close()
