"""The one trainer loop and its parts: GRPO, GiGPO, ARPO, ArCHer and filtered BC share sampling, evaluation,
checkpoints and one config vocabulary; advantages are per token, so step-level methods need no special cases."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.trainers import algorithms as alg  # noqa: E402
from agentgym.trainers import make_trainer  # noqa: E402
from agentgym.trainers.arpo import ArpoConfig  # noqa: E402
from agentgym.trainers.config import TRAINER_CONFIGS, GrpoConfig, config_from_dict  # noqa: E402
from agentgym.trainers.gigpo import GigpoConfig, GigpoTrainer, step_advantages  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trainers.loop import OnlineTrainer  # noqa: E402
from agentgym.trainers.returns import episode_return, step_rewards  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402
from tests.helpers.tiny_models import build_maze_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def maze_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_maze_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _maze(model: Path, out: Path, trainer: str = "gigpo", **overrides: object) -> dict[str, object]:
    values: dict[str, object] = dict(trainer=trainer, model=str(model), suite="games-maze", eval_split="validation",
                                     output_dir=str(out), steps=1, tasks_per_step=2, group_size=4, eval_tasks=2,
                                     eval_every=0, checkpoint_every=0, system_prompt="", max_tokens_per_turn=10,
                                     max_context_tokens=700, tensorboard=False, micro_batch_size=4, seed=0)
    values.update(overrides)
    return values


def _ready(trainer: OnlineTrainer) -> OnlineTrainer:
    """The trainer's model, optimizer, generation policy and parts, as ``train()`` builds them, without running."""
    trainer.model, trainer.tokenizer = trainer._load(trainer.config.model)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=trainer.config.learning_rate)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    trainer.policy = trainer._generation_policy(trainer.model_dir)
    trainer._setup(None)
    return trainer


# ---- one loop, one vocabulary ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TRAINER_CONFIGS))
def test_every_trainer_is_the_one_loop_with_the_shared_vocabulary(name: str) -> None:
    config = config_from_dict({"trainer": name, "model": "m", "suite": "games-maze", "steps": 3, "tasks_per_step": 4,
                               "learning_rate": 1e-4, "warmup_steps": 0, "eval_split": "validation"})
    module, _, cls_name = type(config).trainer_class.partition(":")
    import importlib

    trainer_cls = getattr(importlib.import_module(module), cls_name)
    assert issubclass(trainer_cls, OnlineTrainer)
    assert trainer_cls.train is OnlineTrainer.train and trainer_cls._step is OnlineTrainer._step
    assert (config.steps, config.tasks_per_step, config.learning_rate) == (3, 4, 1e-4)


def test_old_field_names_fail_with_the_lines_to_write_instead() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"trainer": "archer", "model": "m", "suite": "games-maze", "iterations": 30,
                          "episodes_per_iteration": 16, "actor_learning_rate": 3e-5, "warmup_iterations": 3})
    message = str(info.value)
    for line in ("iterations: 30  ->  steps: 30", "episodes_per_iteration: 16  ->  tasks_per_step: 16",
                 "actor_learning_rate: 3e-05  ->  learning_rate: 3e-05", "warmup_iterations: 3  ->  actor_warmup_steps: 3"):
        assert line in message
    with pytest.raises(ConfigError, match="unknown trainer 'gipgo'.*gigpo"):
        config_from_dict({"trainer": "gipgo", "model": "m", "suite": "games-maze"})
    with pytest.raises(ConfigError, match="make_trainer needs a trainer config"):
        make_trainer({"trainer": "grpo"})


def test_gigpo_config_checks_explain_the_fix() -> None:
    with pytest.raises(ConfigError, match="gamma"):
        GigpoConfig(model="m", suite="games-maze", gamma=1.5)
    with pytest.raises(ConfigError, match="similarity_thresh"):
        GigpoConfig(model="m", suite="games-maze", similarity_thresh=0.0)
    with pytest.raises(ConfigError, match="reward: outcome"):
        GigpoConfig(model="m", suite="games-maze", reward="dra")
    with pytest.raises(ConfigError, match="generation_backend: hf"):
        config_from_dict({"trainer": "archer", "model": "m", "suite": "games-maze", "generation_backend": "vllm",
                          "device": "cuda"})


# ---- one definition of return ------------------------------------------------------------------------
def _turn(obs: str, key: str | None, reward: float = 0.0, kind: str = "tool_call") -> Turn:
    return Turn(observation=obs, action="a", reward=reward, info={"kind": kind, "calls": []}, state_key=key)


def _traj(group: str, keys: list[str | None], score: float, rewards: list[float] | None = None,
          end: str = "solved") -> Trajectory:
    rewards = rewards or [0.0] * len(keys)
    turns = tuple(_turn(f"obs-{i}", k, r) for i, (k, r) in enumerate(zip(keys, rewards)))
    return Trajectory(env_id="agentgym/Maze-v0", task_id="t", seed=0, turns=turns, group_id=group,
                      outcome={"success": score > 0, "score": score, "end_reason": end}, end_reason=end)


def test_step_rewards_sum_to_the_return_even_when_an_episode_is_cut() -> None:
    paid = _traj("g", ["a", "b"], 1.0, [0.25, 0.75])
    assert step_rewards(paid) == [0.25, 0.75] and episode_return(paid) == 1.0
    cut = _traj("g", ["a", "b"], 0.0, [0.25, 0.0], end="context_limit")  # shaped credit paid, then cut off
    assert step_rewards(cut) == [0.25, -0.25] and sum(step_rewards(cut)) == episode_return(cut)


# ---- GiGPO on recorded trajectories ------------------------------------------------------------------
def test_gigpo_reproduces_the_spec_example_from_recorded_turns() -> None:
    """GiGPO's example hand-computed from its equations (Feng et al., 2025; mean_norm, per-trajectory statistics)
    from Trajectory objects: state keys are the anchors and the step rewards the returns. Token ids are not needed
    (trajectories from OpenAIPolicy in chat mode work)."""
    trajs = [_traj("g", ["s0", "s1", "s2"], 1.0, [0, 0, 1]), _traj("g", ["s0", "s1", "s3"], 0.0),
             _traj("g", ["s0", "s4"], 1.0, [0, 1])]
    result = step_advantages(trajs, GigpoConfig(model="m", suite="games-maze", invalid_penalty=0.0))
    assert result is not None
    expected = [[0.6183, 0.8083, 0.3333], [-1.2842, -1.1417, -0.6667], [0.6658, 0.3333]]
    for got, want in zip(result.advantages, expected):
        assert got.tolist() == pytest.approx(want, abs=1e-4)
    assert result.stats["gigpo/anchor_groups"] == 5


@pytest.mark.parametrize("kind", ["void", "invalid"])
def test_gigpo_penalises_a_turn_whose_action_did_not_parse_void_or_invalid(kind: str) -> None:
    """GiGPO (Feng et al., 2025): the invalid-action penalty falls on every step whose action failed to parse. A
    void turn (no tool call found) failed to parse as much as an invalid one; left unpunished, a policy drifts
    into void turns."""
    def traj(kinds: list[str]) -> Trajectory:
        turns = tuple(_turn(f"obs-{i}", f"s{i}", 0.0, k) for i, k in enumerate(kinds))
        return Trajectory(env_id="agentgym/Maze-v0", task_id="t", seed=0, turns=turns, group_id="g",
                          outcome={"success": False, "score": 0.0, "end_reason": "max_turns"}, end_reason="max_turns")
    trajs = [traj(["tool_call", kind]), traj(["tool_call", "tool_call"])]
    result = step_advantages(trajs, GigpoConfig(model="m", suite="games-maze", invalid_penalty=0.1))
    assert result is not None
    (_, bad), (_, good) = (a.tolist() for a in result.advantages)
    assert bad < good  # the same state, the same outcome: only the unparsed action is worse
    off = step_advantages(trajs, GigpoConfig(model="m", suite="games-maze", invalid_penalty=0.0))
    assert off is not None and off.advantages[0].tolist() == pytest.approx(off.advantages[1].tolist())


def test_gigpo_with_omega_zero_is_grpo_and_missing_keys_fall_back_to_the_observation() -> None:
    trajs = [_traj("g", [None, None], 1.0, [0, 1]), _traj("g", [None, None], 0.0), _traj("h", ["x"], 1.0, [1])]
    grpo = alg.group_advantages(torch.tensor([t.score for t in trajs]), [t.group_id for t in trajs], mode="mean_norm")
    gigpo = step_advantages(trajs, GigpoConfig(model="m", suite="games-maze", omega=0.0, invalid_penalty=0.0))
    assert gigpo is not None
    for adv, row in zip(gigpo.advantages, grpo.tolist()):
        assert adv.tolist() == pytest.approx([row] * len(adv))
    with_steps = step_advantages(trajs, GigpoConfig(model="m", suite="games-maze", invalid_penalty=0.0))
    assert with_steps is not None and with_steps.stats["gigpo/anchor_groups"] == 3  # obs-0, obs-1 in g; h's one


def test_rollouts_reuse_every_episodes_kv_cache_when_more_run_than_the_policy_default(maze_model: Path,
                                                                                      tmp_path: Path) -> None:
    """96 episodes in flight, more than HFPolicy's default of 64 kept episodes: each episode recomputes only its
    first prompt, every later turn reuses its own cache (least-recently-used eviction used to drop each entry
    just before its episode's next turn), and the trainer sizes the cache for every episode at full context."""
    trainer = _ready(make_trainer(config_from_dict(_maze(maze_model, tmp_path, temperature=1.0, tasks_per_step=12,
                                                         group_size=8, max_in_flight=96))))
    assert trainer.policy.kv_cache.max_tokens == 96 * 700
    trajectories = trainer._sample(0)
    turns = sum(len(t.turns) for t in trajectories)
    assert len(trajectories) == 96 and turns > 2 * 96
    stats = trainer.policy.kv_cache.stats
    assert stats["misses"] == 96 and stats["hits"] == turns - 96 and stats["evictions"] == 0
    assert len(trainer.policy.kv_cache) == 0  # every entry freed as its episode ended


def test_gigpo_step_puts_each_turns_advantage_on_its_tokens(maze_model: Path, tmp_path: Path) -> None:
    """A real GiGPO step on mazes: the group's rollouts share the start cell, so anchor groups are not all
    singletons; every trained token carries its own turn's advantage; the update runs and logs gigpo/*."""
    trainer = _ready(make_trainer(config_from_dict(_maze(maze_model, tmp_path, temperature=1.0))))
    assert isinstance(trainer, GigpoTrainer)
    trajectories = trainer._sample(0)
    assert all(turn.state_key is not None for t in trajectories for turn in t.turns)
    scores = trainer._scores(trajectories)
    _, stats_mask, _ = trainer._masks(trajectories, scores)
    usable = [i for i, t in enumerate(trajectories) if t.has_tokens]
    from agentgym.trainers.batch import build_batch

    batch = build_batch([trajectories[i] for i in usable], torch.zeros(len(usable)), [True] * len(usable), pad_id=0)
    tokens, stats = trainer._token_advantages(trajectories, scores, stats_mask, usable, batch)
    assert stats["gigpo/steps_in_shared_anchor"] > 0
    counted = [i for i, keep in enumerate(stats_mask.tolist()) if keep and trajectories[i].turns]
    per_step = dict(zip(counted, step_advantages([trajectories[i] for i in counted], trainer.config).advantages))
    for row, i in enumerate(usable):
        for col in torch.nonzero(batch.loss_mask[row]).flatten().tolist():
            turn = int(batch.turn_index[row, col])
            assert tokens[row, col] == pytest.approx(float(per_step[i][turn]))
    metrics = trainer._learn(0, trajectories)
    assert torch.isfinite(torch.tensor(metrics["train/loss"])) and metrics["gigpo/anchor_groups"] >= 1


def test_arpo_hard_attribution_trains_with_packing(maze_model: Path, tmp_path: Path) -> None:
    """Hard attribution gives per-token advantages; packing carried only one scalar per row and crashed."""
    config = config_from_dict(_maze(maze_model, tmp_path, trainer="arpo", attribution="hard", hard_dedupe=True,
                                    packing=True, initial_rollouts=2, branch_probability=1.0, entropy_weight=0.0))
    assert isinstance(config, ArpoConfig)
    trainer = _ready(make_trainer(config))
    trajectories = trainer._sample(0)
    assert all(turn.state_key is not None for t in trajectories for turn in t.turns)  # branches carry anchors too
    metrics = trainer._learn(0, trajectories)
    assert torch.isfinite(torch.tensor(metrics["train/loss"])) and metrics["train/tokens"] > 0


@pytest.mark.parametrize("trainer_name", ["gigpo", "arpo"])
def test_a_constrained_training_step_trains_only_the_choice_tokens(maze_model: Path, tmp_path: Path,
                                                                   trainer_name: str) -> None:
    """``constrain_actions``: every sampled turn is one of the env's moves, and the update trains exactly the tokens
    where the policy chose among them (the ones the choice forced are out of the loss)."""
    extra = dict(initial_rollouts=2, branch_probability=1.0, entropy_weight=0.0) if trainer_name == "arpo" else {}
    trainer = _ready(make_trainer(config_from_dict(_maze(maze_model, tmp_path, trainer=trainer_name, temperature=1.0,
                                                         constrain_actions=True, **extra))))
    trajectories = trainer._sample(0)
    turns = [turn for t in trajectories for turn in t.turns]
    assert turns and all(turn.kind == "tool_call" and turn.action_forced is not None for turn in turns)
    metrics = trainer._learn(0, trajectories)
    assert metrics["train/tokens"] == sum(not f for turn in turns for f in turn.action_forced)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


def test_grpo_and_gigpo_share_the_loop_end_to_end(maze_model: Path, tmp_path: Path) -> None:
    """``train()`` of the shared loop: the same episodes per step, eval/episodes_seen logged, summary written."""
    import json

    for name in ("grpo", "gigpo"):
        summary = make_trainer(config_from_dict(_maze(maze_model, tmp_path / name, trainer=name, steps=2,
                                                      eval_every=1))).train()
        assert summary["episodes"] == 2 * 2 * 4 and "eval_after" in summary
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        seen = [r["eval/episodes_seen"] for r in rows if "eval/episodes_seen" in r]
        assert seen == [0.0, 8.0, 16.0]
    assert isinstance(make_trainer(GrpoConfig(**{k: v for k, v in _maze(maze_model, tmp_path / "g").items()
                                                  if k != "trainer"})), GrpoTrainer)
