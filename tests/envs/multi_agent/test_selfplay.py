"""SelfPlay: every registered self-play id passes check_agent_env; opponents (scripted, random, policy,
frozen checkpoint, league) play through the game's rules; suites are solvable; the single-agent rollout
engine and the GRPO trainer run on a self-play env unchanged."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("pyspiel")

from agentgym.envs.multi_agent.board_games import TicTacToeEnv
from agentgym.envs.multi_agent.negotiation import NegotiationEnv
from agentgym.envs.multi_agent.opponents import (
    CheckpointOpponent,
    League,
    Opponent,
    PolicyOpponent,
    RandomOpponent,
    ScriptedOpponent,
)
from agentgym.registration.multi_agent import SELFPLAY_ENTRIES
from agentgym.envs.multi_agent.selfplay import SelfPlay
from agentgym.envs.multi_agent.stockfish import find_stockfish

from agentgym.errors import ConfigError, EnvCrashed
from agentgym.policies import ReferencePolicy, ScriptedPolicy
from agentgym.rollout import RolloutEngine, episodes_for_suite, summarize
from agentgym.suite import Task
from agentgym.registration.suites import load_suite
from agentgym.testing import check_agent_env

for _entry in SELFPLAY_ENTRIES:
    if _entry.id not in gym.registry:
        gym.register(id=_entry.id, entry_point=_entry.entry_point)

try:
    find_stockfish()
    HAVE_STOCKFISH = True
except EnvCrashed:
    HAVE_STOCKFISH = False

SELFPLAY_IDS = [
    pytest.param(e.id, marks=pytest.mark.skipif("Stockfish" in e.id and not HAVE_STOCKFISH, reason="needs stockfish"))
    for e in SELFPLAY_ENTRIES
]


@pytest.mark.parametrize("env_id", SELFPLAY_IDS)
def test_check_agent_env(env_id: str) -> None:
    check_agent_env(env_id, seed=0, fuzz_examples=50)


def test_expected_ids_are_listed() -> None:
    ids = {e.id for e in SELFPLAY_ENTRIES}
    assert {"agentgym/Chess-vs-Stockfish-v0", "agentgym/Negotiation-SelfPlay-v0"} <= ids
    assert all(e.family == "multi_agent" and e.description for e in SELFPLAY_ENTRIES)


# ---- the wrapped turn ------------------------------------------------------------------------------------------
def test_opponent_moves_come_back_in_the_observation_and_info() -> None:
    env = gym.make("agentgym/TicTacToe-SelfPlay-v0", learner="player_1")
    obs, info = env.reset(seed=0)
    assert "player_0 played" in obs and "You are o" in obs, "x (the opponent) moved before the learner's first turn"
    assert "play(4)" in info["instructions"] and info["tools"][0]["function"]["name"] == "play"
    cell = next(c for c in range(9) if str(c) in obs.split("Empty cells:")[1])
    _, _, terminated, _, info = env.step(f"play({cell})")
    assert info["turn"]["kind"] == "tool_call" and len(info["turn"]["opponents"]) == (0 if terminated else 1)
    assert info["turn"]["opponents"] == [] or info["turn"]["opponents"][0]["opponent"] == "scripted"


def test_an_opponents_winning_move_is_the_learners_loss() -> None:
    env = SelfPlay(TicTacToeEnv(), ScriptedOpponent(), learner="player_1")
    env.reset(seed=0, options={"task": Task("t", "ttt")})
    total, outcome = 0.0, None
    for cell in [0, 1, 2, 3, 5, 6, 7, 8]:  # a learner that ignores threats
        if f"play({cell})" not in env.game.legal_actions("player_1"):
            continue
        _, reward, terminated, _, info = env.step(f"play({cell})")
        total += reward
        if terminated:
            outcome = info["outcome"]
            break
    assert outcome == {"success": False, "score": 0.0, "end_reason": "failed"}
    # The reward rule: the return is the outcome score (a loss is worth 0, a draw 0.5, a win 1); the game's own
    # -1, which comes from the opponent's move, lands on the learner's last step and is balanced there.
    assert total == outcome["score"] == 0.0
    assert set(info["turn"]["rewards"]) == {"outcome"}


def test_negotiation_task_fixes_the_game_and_seat() -> None:
    setup = {"counts": [1, 2, 3], "values": [[4, 0, 2], [0, 2, 2]]}
    env = gym.make("agentgym/Negotiation-SelfPlay-v0")
    obs, _ = env.reset(seed=0, options={"task": Task("n", "negotiate", metadata={"setup": setup, "seat": "player_1"})})
    assert "You are player_1" in obs and "book=0, hat=2, ball=2" in obs and "Standing proposal" in obs
    obs, reward, terminated, _, info = env.step("accept()")
    assert terminated and info["turn"]["rewards"].get("deal_value", 0.0) == pytest.approx(reward)


def test_policy_opponent_league_and_frozen_checkpoint() -> None:
    walker = PolicyOpponent(ScriptedPolicy(["walk_away()"]), name="walker")
    loads: list[str] = []

    def loader(path: str) -> ScriptedPolicy:
        loads.append(path)
        return ScriptedPolicy(["propose(0, 0, 0, \"take it all\")"])

    league = League([walker])
    frozen = league.add_checkpoint("runs/ckpt-7", loader=loader)
    assert isinstance(frozen, CheckpointOpponent) and not loads, "checkpoints load on first use"
    env = SelfPlay(NegotiationEnv(), league, learner="player_1")
    seen = set()
    for seed in range(8):
        obs, _ = env.reset(seed=seed)
        seen.add(league.current.name)
        if league.current is walker:
            assert env.game.game_over and "walks away" in obs
        else:
            assert "take it all" in obs
            obs, reward, terminated, _, _ = env.step("accept()")
            assert terminated and reward == pytest.approx(1.0)
    assert seen == {"walker", "checkpoint:ckpt-7"} and loads == ["runs/ckpt-7"]
    assert not env.cheap_steps, "a policy opponent may block, so the engine must not step inline"
    env.close()


def test_a_failing_opponent_ends_the_episode_with_error() -> None:
    class Broken(Opponent):
        cheap = True

        def act(self, game: object, agent: str) -> str:
            raise ConnectionError("model server down")

    env = SelfPlay(TicTacToeEnv(), Broken(), learner="player_0")
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("play(4)")
    assert terminated and info["outcome"]["end_reason"] == "error" and "model server down" in obs


def test_selfplay_argument_errors() -> None:
    with pytest.raises(ConfigError, match="Did you mean .*'player_0'"):
        SelfPlay(TicTacToeEnv(), RandomOpponent(), learner="player_O")
    with pytest.raises(ConfigError, match="unknown seats"):
        SelfPlay(TicTacToeEnv(), {"player_9": RandomOpponent()})
    with pytest.raises(ConfigError, match="Unknown opponent 'scriptd'"):
        gym.make("agentgym/TicTacToe-SelfPlay-v0", opponent="scriptd")


def test_random_seat_is_drawn_from_the_seed() -> None:
    env = gym.make("agentgym/PrisonersDilemma-SelfPlay-v0")
    seats = []
    for seed in range(12):
        env.reset(seed=seed)
        seats.append(env.unwrapped.learner)
    assert set(seats) == {"player_0", "player_1"}
    again = []
    for seed in range(12):
        env.reset(seed=seed)
        again.append(env.unwrapped.learner)
    assert seats == again


# ---- suites and the single-agent machinery ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["ma-negotiation", "ma-referential"])
def test_suites_are_solvable(name: str) -> None:
    report = load_suite(name).validate(limit=60)
    assert report.ok, str(report)


def test_single_agent_rollout_engine_runs_selfplay_suites() -> None:
    suite = load_suite("ma-negotiation")
    engine = RolloutEngine(ReferencePolicy())
    trajectories = engine.run(episodes_for_suite(suite, "test", group_size=2, limit=10))
    stats = summarize(trajectories)
    assert stats["episodes"] == 20 and stats["success_rate"] == 1.0 and stats["errors"] == 0


def test_grpo_trainer_updates_on_selfplay_rollouts(tmp_path: Path) -> None:
    """The GRPO trainer's own rollout and update run unchanged on a self-play suite (as tests/test_trainer_grpo)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agentgym.trainers.batch import build_batch
    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer

    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy
    from agentgym.rollout import run_reference_episode

    suite = load_suite("ma-negotiation")
    env = suite.make_env()
    texts = [env.reset(seed=0)[1]["instructions"]]
    for i, task in enumerate(suite.train[:20]):
        for turn in run_reference_episode(env, task, seed=i).turns:
            texts += [turn.observation, turn.action]
    env.close()
    model_dir = build_tiny_model(tmp_path / "model", texts=texts, config=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128))
    config = GrpoConfig(model=str(model_dir), suite="ma-negotiation", output_dir=str(tmp_path / "run"), steps=1,
                        tasks_per_step=2, group_size=2, eval_tasks=2, eval_every=0, checkpoint_every=0,
                        system_prompt="", max_tokens_per_turn=12, max_context_tokens=4096, tensorboard=False, seed=0)
    trainer = GrpoTrainer(config)
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.reference = None
    trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
    trajectories = trainer._sample(0)
    assert len(trajectories) == 4 and all(t.has_tokens for t in trajectories)
    assert all(t.env_id == "agentgym/Negotiation-SelfPlay-v0" for t in trajectories)
    batch = build_batch(trajectories, torch.tensor([1.0, -1.0] * 2), [True] * 4, pad_id=0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    stats = trainer._update(batch, optimizer, trainer._schedule(optimizer), 0)
    assert torch.isfinite(torch.tensor(stats["train/loss"])) and stats["train/tokens"] > 0
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


def test_reference_solvers_win_where_the_game_allows() -> None:
    """Chess: full-strength Stockfish beats skill 0; tic-tac-toe: minimax never loses."""
    ttt = gym.make("agentgym/TicTacToe-SelfPlay-v0")
    for seed in range(4):
        obs, _ = ttt.reset(seed=seed)
        solver = ttt.unwrapped.reference_solver()
        terminated = False
        while not terminated:
            obs, _, terminated, truncated, info = ttt.step(solver(obs))
            assert not truncated
        assert info["outcome"]["score"] >= 0.5
    if HAVE_STOCKFISH:
        chess = gym.make("agentgym/Chess-vs-Stockfish-v0")
        obs, _ = chess.reset(seed=3)
        solver = chess.unwrapped.reference_solver()
        terminated = truncated = False
        while not (terminated or truncated):
            obs, _, terminated, truncated, info = chess.step(solver(obs))
        assert info["outcome"]["success"], info["outcome"]
        chess.close()
