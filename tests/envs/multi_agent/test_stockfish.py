"""Stockfish over UCI: it beats a random mover at its lowest level, strength and determinism settings work,
a dying or hung engine is restarted or ends the episode with an error, and no process outlives its env."""

from __future__ import annotations

import gc
import os
import signal
import stat
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("pyspiel")

from agentgym.envs.multi_agent.chess import ChessEnv
from agentgym.registration.multi_agent import SELFPLAY_ENTRIES
from agentgym.envs.multi_agent.stockfish import (
    FULL_STRENGTH_DEPTH,
    StockfishConfig,
    StockfishEngine,
    _Candidate,
    find_stockfish,
    pick_skill_move,
)

from agentgym.errors import ConfigError, EnvCrashed

try:
    find_stockfish()
    HAVE_STOCKFISH = True
except EnvCrashed:
    HAVE_STOCKFISH = False
needs_stockfish = pytest.mark.skipif(not HAVE_STOCKFISH, reason="needs the stockfish binary (apt-get install stockfish)")

for _entry in SELFPLAY_ENTRIES:
    if _entry.id not in gym.registry:
        gym.register(id=_entry.id, entry_point=_entry.entry_point)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def _play_vs_random(engine: StockfishEngine, game_index: int) -> str:
    env = ChessEnv(max_steps=1000)
    env.reset(seed=game_index)
    rng = np.random.default_rng(game_index)
    engine_seat = "player_0" if game_index % 2 == 0 else "player_1"
    while not env.game_over:
        if env.agent_selection == engine_seat:
            env.step(env.play_uci(engine.best_move(env.uci_moves, rng=rng)))
        else:
            legal = env.legal_actions()
            env.step(legal[int(rng.integers(len(legal)))])
    return env.infos[engine_seat]["outcome"]["result"]


@needs_stockfish
@pytest.mark.parametrize("deterministic", [False, True], ids=["engine-skill-0", "reproducible-skill-0"])
def test_lowest_level_stockfish_beats_random_moves(deterministic: bool) -> None:
    """Skill Level 0 at depth 1 (``deterministic=False`` sends Stockfish's own Skill Level option)."""
    with StockfishEngine(StockfishConfig(skill_level=0, depth=1, deterministic=deterministic)) as engine:
        results = [_play_vs_random(engine, g) for g in range(10)]
    assert results.count("win") >= 9, results


@needs_stockfish
def test_reproducible_mode_replays_and_skill_changes_play() -> None:
    def game(skill: int, seed: int) -> list[str]:
        with StockfishEngine(StockfishConfig(skill_level=skill, depth=None)) as engine:
            env = ChessEnv()
            env.reset(seed=0)
            rng = np.random.default_rng(seed)
            for _ in range(16):
                env.step(env.play_uci(engine.best_move(env.uci_moves, rng=rng)))
            return list(env.uci_moves)

    assert game(0, seed=1) == game(0, seed=1)
    assert game(0, seed=1) != game(0, seed=2), "skill 0 picks among its best moves with the episode RNG"


def test_skill_rule_never_misses_a_mate_and_spreads_otherwise() -> None:
    rng = np.random.default_rng(0)
    mate = [_Candidate("h5f7", 99_999), _Candidate("a2a3", 10), _Candidate("b2b3", 5), _Candidate("c2c3", 0)]
    assert {pick_skill_move(mate, 0, rng) for _ in range(200)} == {"h5f7"}
    close = [_Candidate("e2e4", 30), _Candidate("d2d4", 28), _Candidate("g1f3", 25), _Candidate("c2c4", 20)]
    assert len({pick_skill_move(close, 0, rng) for _ in range(200)}) >= 3


def test_config_is_validated_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="0..20"):
        StockfishConfig(skill_level=21)
    with pytest.raises(ConfigError, match="not reproducible"):
        StockfishConfig(skill_level=20, movetime_ms=50)
    with pytest.raises(ConfigError, match="would cap Skill Level 6"):
        StockfishConfig(skill_level=6, depth=1)  # the old default depth=1 flattened every level into one
    with pytest.raises(ConfigError, match="skill_level=20"):
        StockfishConfig(skill_level=6, nodes=100)
    assert [StockfishConfig(skill_level=level).effective_depth() for level in (0, 6, 19)] == [1, 7, 20]
    assert StockfishConfig(skill_level=20).effective_depth() == FULL_STRENGTH_DEPTH
    assert StockfishConfig(skill_level=20, depth=5).effective_depth() == 5


@needs_stockfish
def test_a_higher_skill_level_beats_a_lower_one() -> None:
    """Level 6 against level 2, six games with colours alternating: measured 6-0 (about 10 s on a loaded machine).
    With the old default depth=1 both levels searched one ply and the same match went 3-3: the level changed
    only the random push, not the search."""
    results = []
    with StockfishEngine(StockfishConfig(skill_level=6)) as strong, \
            StockfishEngine(StockfishConfig(skill_level=2)) as weak:
        for game in range(6):
            env = ChessEnv(max_steps=400)
            env.reset(seed=game)
            rng = np.random.default_rng(game)
            seat = "player_0" if game % 2 == 0 else "player_1"
            while not env.game_over:
                engine = strong if env.agent_selection == seat else weak
                env.step(env.play_uci(engine.best_move(env.uci_moves, rng=rng)))
            results.append(env.infos[seat]["outcome"]["result"])
    assert results.count("win") >= 5, results


@needs_stockfish
def test_illegal_moves_get_an_error_observation_and_the_configured_penalty() -> None:
    env = gym.make("agentgym/Chess-vs-Stockfish-v0", learner="player_0", invalid_action_penalty=0.5)
    obs, info = env.reset(seed=0)
    assert "Legal moves:" in obs and "move(" in info["instructions"]
    for action in ['move("e2e5")', "I resign", '<tool_call>{"name": "move", "arguments": {"move": "Ke9"}}</tool_call>']:
        obs, reward, terminated, _, step_info = env.step(action)
        if terminated:
            break
        assert obs.startswith(("Error", "No move found")) and reward == -0.5
        assert step_info["turn"]["rewards"] == {"invalid_action": -0.5}
    assert terminated and step_info["outcome"] == {"success": False, "score": 0.0, "end_reason": "failed"}
    env.close()


@needs_stockfish
def test_env_close_stops_the_engine_and_a_collected_engine_is_killed() -> None:
    env = gym.make("agentgym/Chess-vs-Stockfish-v0", learner="player_1")
    env.reset(seed=0)  # the engine moves first as White
    pid = env.unwrapped.stockfish.engine.pid
    assert pid is not None and _alive(pid)
    env.close()
    env.close()
    assert not _alive(pid)

    engine = StockfishEngine()
    engine.best_move([], rng=np.random.default_rng(0))
    pid = engine.pid
    assert pid is not None
    del engine
    gc.collect()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "an engine dropped without close() must not leak its process"


@needs_stockfish
def test_a_killed_engine_is_restarted_mid_game() -> None:
    env = gym.make("agentgym/Chess-vs-Stockfish-v0", learner="player_0")
    env.reset(seed=0)
    env.step('move("e2e4")')
    engine = env.unwrapped.stockfish.engine
    old_pid = engine.pid
    os.kill(old_pid, signal.SIGKILL)
    obs, _, terminated, _, info = env.step('move("d2d4")')
    assert not terminated and info["turn"]["kind"] == "tool_call" and "Legal moves" in obs
    assert engine.restarts == 1 and engine.pid not in (None, old_pid)
    assert len(env.unwrapped.game.uci_moves) == 4
    env.close()


def _fake_engine(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-stockfish"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_an_engine_that_cannot_run_ends_the_episode_with_error(tmp_path: Path) -> None:
    dead = _fake_engine(tmp_path, "exit 1")
    env = gym.make("agentgym/Chess-vs-Stockfish-v0", learner="player_0", stockfish_path=dead)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step('move("e2e4")')
    assert terminated and info["outcome"]["end_reason"] == "error" and reward == 0.0
    assert "crashed" in obs
    env.close()


def test_a_hung_engine_times_out_and_is_killed(tmp_path: Path) -> None:
    hung = _fake_engine(tmp_path, "exec sleep 60")
    engine = StockfishEngine(StockfishConfig(path=hung, timeout_s=0.3, max_restarts=1))
    started = time.monotonic()
    with pytest.raises(EnvCrashed, match="failed 2 times"):
        engine.best_move([], rng=np.random.default_rng(0))
    assert time.monotonic() - started < 10
    assert engine.restarts == 1 and engine.pid is None
    engine.close()
