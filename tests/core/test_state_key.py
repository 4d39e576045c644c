"""``AgentEnv.state_key()``: the env-state key GiGPO groups steps by (anchor states; Feng et al., 2025).

Every registered id: the key is a str before and after steps, and replaying a seed's actions on a fresh env gives
the same keys. For the games, keys are checked against the state itself: two paths to the same state share a key,
different states have different keys.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym.env import AgentEnv
from agentgym.envs.games.calculator import CalculatorEnv
from agentgym.envs.games.guess_number import GuessNumberEnv
from agentgym.envs.games.maze import MazeEnv
from agentgym.errors import EnvCrashed
from agentgym.parsers import CompositeParser, FunctionCallParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolSet, tool

MAX_STEPS = 6  # enough to leave the first state in every family, short enough for the slow ones
VOID_ENDS = ("agentgym/CodeInterpreter-v1",)  # a reply with neither code nor an answer ends a TIR episode


def _make_or_skip(env_id: str) -> gym.Env[Any, Any]:
    """Make the env, skipping (as the family tests do) when a system dependency is missing."""
    from agentgym.tools.browser import BrowserUnavailable
    from agentgym.tools.sandbox.backends import SandboxUnavailable

    try:
        return gym.make(env_id)
    except (SandboxUnavailable, BrowserUnavailable) as exc:
        pytest.skip(f"{env_id}: {exc}")
    except EnvCrashed as exc:  # Stockfish missing
        if "not found" in str(exc) or "not executable" in str(exc):
            pytest.skip(f"{env_id}: {exc}")
        raise


def _episode_keys(env_id: str, seed: int, actions: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Play an episode (the reference solver's actions, then void replies) and return (actions, keys)."""
    env = _make_or_skip(env_id)
    try:
        obs, info = env.reset(seed=seed)
        inner = env.unwrapped
        keys = [inner.state_key()]
        played: list[str] = []
        solver = None
        if actions is None:
            try:
                solver = inner.reference_solver()
            except (NotImplementedError, Exception):  # noqa: BLE001 - families without a solver use void turns
                solver = None
        for index in range(MAX_STEPS if actions is None else len(actions)):
            if actions is not None:
                action = actions[index]
            elif index == 0 and env_id not in VOID_ENDS:
                action = "I am not sure yet."  # a void turn first: the state must not change
            else:
                action = solver(obs) if solver is not None else "no tool call here"
            obs, _, terminated, truncated, info = env.step(action)
            played.append(action)
            keys.append(inner.state_key())
            assert "state_key" not in info and "state_key" not in info.get("turn", {})
            if terminated or truncated:
                break
        return played, keys
    finally:
        env.close()


@pytest.mark.parametrize("env_id", agentgym.env_ids())
def test_state_key_is_a_deterministic_str(env_id: str) -> None:
    actions, keys = _episode_keys(env_id, seed=0)
    assert all(isinstance(key, str) and key for key in keys), keys
    _, replayed = _episode_keys(env_id, seed=0, actions=actions)
    assert replayed == keys
    assert len(set(keys)) >= 2  # the episode left its first state
    # A void reply changes nothing in any env, so its key is the reset key.
    if len(keys) > 1 and env_id not in VOID_ENDS:
        assert keys[1] == keys[0], (keys[0][:300], keys[1][:300])


def test_state_key_is_reachable_through_wrappers() -> None:
    env = gym.make("agentgym/Maze-v0")
    env.reset(seed=1)
    assert env.unwrapped.state_key().startswith("maze position ")
    env.close()


# ---- the default: the raw current observation ---------------------------------------------------------------
class _EchoEnv(AgentEnv):
    """A family that does not override state_key."""

    description: ClassVar[str] = "test env"

    @tool
    def say(self, text: str) -> str:
        """Echo.

        Args:
            text: Anything.
        """
        return f"you said {text}"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.say])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([FunctionCallParser(["say"])])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return Task("t", "say something")

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Call say."


def test_default_key_is_the_current_observation_without_history() -> None:
    env = _EchoEnv(max_turns=5)
    assert env.state_key() == ""
    obs, _ = env.reset(seed=0)
    assert env.state_key() == obs == "say something"
    obs, *_ = env.step('say("a")')
    env.step('say("b")')
    obs, *_ = env.step('say("a")')
    assert env.state_key() == obs == "you said a"  # the same as after the first step: no history in the key


# ---- Maze: the position -----------------------------------------------------------------------------------------
def _maze_keys(env: MazeEnv, moves: list[str]) -> list[str]:
    keys = [env.state_key()]
    for move in moves:
        env.step(f'move("{move}")')
        keys.append(env.state_key())
    return keys


def test_maze_key_is_the_position_whatever_the_path() -> None:
    env = MazeEnv(max_turns=30)
    env.reset(seed=3)
    start = env._pos
    maze = env._maze
    assert maze is not None
    doors = sorted(maze.open[start])
    walls = [d for d in ("north", "south", "east", "west") if d not in maze.open[start]]
    back = {"north": "south", "south": "north", "east": "west", "west": "east"}
    assert doors and walls
    direct = _maze_keys(env, [doors[0]])
    env.reset(seed=3)
    detour = _maze_keys(env, [walls[0], doors[0], back[doors[0]], doors[0]])  # bump a wall, go and come back
    assert detour[1] == direct[0]  # the wall bump kept the state
    assert detour[3] == direct[0]  # there and back is the start again
    assert detour[-1] == direct[-1] != direct[0]  # the same cell by two paths, a different cell from the start
    assert direct[0] == f"maze position {start[0]},{start[1]}"


def test_maze_keys_differ_between_cells_and_replay_with_the_reference() -> None:
    env = MazeEnv()
    env.reset(seed=5)
    solve = env.reference_solver()
    obs, keys, done = "", [env.state_key()], False
    while not done:
        obs, _, terminated, truncated, _ = env.step(solve(obs))
        keys.append(env.state_key())
        done = terminated or truncated
    assert len(set(keys)) == len(keys)  # a shortest path never revisits a cell
    assert keys[-1].endswith("(exit)")


# ---- GuessNumber: the interval left ------------------------------------------------------------------------------
def _guess_keys(guesses: list[int], secret: int = 37) -> list[str]:
    env = GuessNumberEnv(max_turns=10)
    env.reset(options={"task": Task("g", "Find it.", answer=secret, metadata={"low": 1, "high": 100, "secret": secret})})
    keys = [env.state_key()]
    for number in guesses:
        env.step(f"guess({number})")
        keys.append(env.state_key())
    return keys


def test_guess_number_key_is_the_interval_left() -> None:
    assert _guess_keys([])[0] == "secret in [1, 100]"
    a, b = _guess_keys([50, 25]), _guess_keys([25, 50])
    assert a[-1] == b[-1] == "secret in [26, 49]"  # two orders, one state
    assert a[1] != b[1]  # [1, 49] vs [26, 100]
    wasted = _guess_keys([50, 60])  # 60 tells nothing new once 50 said "lower"
    assert wasted[1] == wasted[2] == "secret in [1, 49]"
    assert _guess_keys([0])[-1] == "secret in [1, 100]"  # an out-of-range guess is rejected and changes nothing
    assert _guess_keys([50, 25, 37])[-1] == "solved 37"


# ---- Calculator: the values known --------------------------------------------------------------------------------
def test_calculator_key_is_the_values_computed() -> None:
    def keys(actions: list[str]) -> list[str]:
        env = CalculatorEnv(max_turns=5)
        env.reset(options={"task": Task("c", "What is 27*42?", answer=1134, metadata={"expression": "27*42"})})
        out = [env.state_key()]
        for action in actions:
            env.step(action)
            out.append(env.state_key())
        return out

    a, b = keys(["calc(27*42)"]), keys(["calc(42 * 27)"])
    assert a[-1] == b[-1] != a[0]
    assert keys(["calc(27*)"])[-1] == a[0]  # a malformed expression shows nothing, so the state is unchanged
    assert keys(["calc(1+1)", "calc(27*42)"])[-1] == keys(["calc(27*42)", "calc(1+1)"])[-1]


# ---- a board game: the position, not the messages ------------------------------------------------------------------
def test_tictactoe_key_is_the_board() -> None:
    pytest.importorskip("pyspiel")
    env = gym.make("agentgym/TicTacToe-SelfPlay-v0")
    try:
        env.reset(seed=0)
        inner = env.unwrapped
        before = inner.state_key()
        occupied = next(str(c) for c in range(9) if str(c) not in inner.game._your_move(inner.learner))
        obs, *_ = env.step(f"play({occupied})")  # rejected: the board is unchanged
        assert inner.state_key() == before
        assert "player_" in before and "Board" in before
        free = inner.game._state.legal_actions()[0]
        env.step(f"play({free})")
        assert inner.state_key() != before
    finally:
        env.close()


# ---- the text web shop: URL and form state --------------------------------------------------------------------------
def test_webshop_key_is_url_and_form_state() -> None:
    env = gym.make("agentgym/WebShop-text-v1")
    try:
        obs, _ = env.reset(seed=0)
        inner = env.unwrapped
        home = inner.state_key()
        assert home.startswith("URL: /\n") and "[active]" not in home
        env.step('type("e10", "mashed potatoes")')
        typed = inner.state_key()
        assert typed != home and "mashed potatoes" in typed  # the form value is part of the state
        env.step('goto("/")')
        assert inner.state_key() == home  # a fresh home page: the typed text is gone
    finally:
        env.close()


# ---- the code interpreter: what the runs printed -----------------------------------------------------------------------
def test_code_interpreter_key_is_the_outputs_learned() -> None:
    def keys(replies: list[str]) -> list[str]:
        env = _make_or_skip("agentgym/CodeInterpreter-v1")
        try:
            env.reset(seed=0)
            out = [env.unwrapped.state_key()]
            for reply in replies:
                env.step(f"```python\n{reply}\n```")
                out.append(env.unwrapped.state_key())
            return out
        finally:
            env.close()

    a = keys(["print(6 * 7)"])
    b = keys(["x = 6\nprint(x * 7)"])
    assert a == b == ["[]", '["42"]']  # different code, the same result learned
    assert keys(["1 / 0", "print(6 * 7)"]) == ["[]", "[]", '["42"]']  # a failing run teaches nothing
