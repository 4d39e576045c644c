"""Every trainer takes segmented episodes (a context strategy rewrote their history): one step each on episodes the
tiny model sampled with ``context: window``. Segments are rows; an episode's rows share its advantage; the
recomputed log-probs of every row match what the sampler recorded (each row is what the model conditioned on)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.models.tiny import build_tiny_model  # noqa: E402
from agentgym.rollout.branching import BranchingConfig  # noqa: E402
from agentgym.trainers.batch import TrainingBatch, build_batch  # noqa: E402
from agentgym.trainers.replay import transitions_from_trajectory  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402
from tests.helpers.tiny_models import SMALL  # noqa: E402

#: Short quests (7 turns) whose history is windowed every 2 turns: 3-4 segments per episode.
SEGMENTED: dict[str, Any] = dict(
    suite="quest-long", env_kwargs={"max_turns": 7}, context={"strategy": "window", "keep_turns": 1, "trigger_turns": 2},
    max_tokens_per_turn=8, max_context_tokens=768, system_prompt="", tasks_per_step=1, group_size=2, eval_tasks=1,
    eval_every=0, checkpoint_every=0, tensorboard=False, seed=0, steps=1, micro_batch_size=2, warmup_steps=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("quest-long", 4),
                            config=SMALL)


def bare(cls: type, config: Any, model_dir: Path) -> Any:
    """A trainer with its model, policy and optimizer built, without running ``train()``."""
    from agentgym.policies.hf import HFPolicy

    trainer = cls(config)
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.reference = None
    trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    if hasattr(trainer, "_setup"):
        trainer._setup(None)
    return trainer


def sampled(trainer: Any) -> list[Trajectory]:
    """This step's episodes, the first one scored 1 so that group advantages are not all zero."""
    trajectories = trainer._sample(0)
    assert all(t.error is None and t.has_tokens for t in trajectories)
    assert all(t.num_segments >= 3 for t in trajectories), [t.num_segments for t in trajectories]
    first = trajectories[0]
    trajectories[0] = dataclasses.replace(first, outcome={**first.outcome, "score": 1.0})
    return trajectories


def learn_recording_batch(trainer: Any, trajectories: list[Trajectory]) -> tuple[dict[str, float], TrainingBatch]:
    seen: list[TrainingBatch] = []
    update = trainer._update

    def recording(batch: TrainingBatch, *args: Any) -> dict[str, float]:
        seen.append(batch)
        return update(batch, *args)

    trainer._update = recording
    stats = trainer._learn(0, trajectories)
    return stats, seen[0]


def assert_rows_share_their_episode(batch: TrainingBatch, trajectories: list[Trajectory]) -> None:
    assert batch.episode_index is not None
    assert len(batch) == sum(t.num_segments for t in trajectories), "one row per segment"
    for i, t in enumerate(trajectories):
        rows = (batch.episode_index == i).nonzero().flatten()
        assert len(rows) == t.num_segments
        trained = batch.advantages[rows][batch.loss_mask[rows] > 0]
        assert trained.numel() and torch.all(trained == trained[0]), "the episode's advantage on all its rows"


@pytest.mark.parametrize("name", ["grpo", "arpo"])
def test_grpo_and_arpo_train_a_step_on_segmented_episodes(model_dir: Path, tmp_path: Path, name: str) -> None:
    if name == "grpo":
        from agentgym.trainers.config import GrpoConfig as Config
        from agentgym.trainers.grpo import GrpoTrainer as Trainer
        extra: dict[str, Any] = {}
    else:
        from agentgym.trainers.arpo import ArpoConfig as Config
        from agentgym.trainers.arpo import ArpoTrainer as Trainer
        extra = {"branching": BranchingConfig(budget=2, initial_rollouts=1, branch_probability=1.0,
                                              entropy_weight=0.0)}
    trainer = bare(Trainer, Config(model=str(model_dir), output_dir=str(tmp_path), **SEGMENTED, **extra), model_dir)
    trajectories = sampled(trainer)
    stats, batch = learn_recording_batch(trainer, trajectories)
    assert_rows_share_their_episode(batch, trajectories)
    assert stats["train/logprob_mismatch"] < 1e-4, "every segment row is what the model sampled from"
    assert stats["train/tokens"] == sum(t.num_action_tokens for t in trajectories)
    assert torch.isfinite(torch.tensor(stats["train/loss"]))


def test_gigpo_puts_each_turns_step_advantage_on_its_segment_row(model_dir: Path, tmp_path: Path) -> None:
    from agentgym.trainers.gigpo import GigpoConfig, GigpoTrainer

    trainer = bare(GigpoTrainer, GigpoConfig(model=str(model_dir), output_dir=str(tmp_path), **SEGMENTED), model_dir)
    trajectories = sampled(trainer)
    stats, batch = learn_recording_batch(trainer, trajectories)
    assert len(batch) == sum(t.num_segments for t in trajectories)
    assert stats["train/logprob_mismatch"] < 1e-4 and torch.isfinite(torch.tensor(stats["train/loss"]))
    # turn indices run over the whole episode, so a later segment's row holds that episode's later turns
    for row in range(len(batch)):
        turns = batch.turn_index[row][batch.turn_index[row] >= 0].unique().tolist()
        episode = trajectories[int(batch.episode_index[row])]
        first, stop = episode.segment_bounds()[sum(1 for r in range(row) if batch.episode_index[r] ==
                                                   batch.episode_index[row])]
        assert turns == list(range(first, stop))


def test_archer_and_filtered_bc_take_segmented_episodes(model_dir: Path, tmp_path: Path) -> None:
    from agentgym.trainers.archer import ArcherConfig, ArcherTrainer
    from agentgym.trainers.filtered_bc import FilteredBCConfig, FilteredBCTrainer

    common = {k: v for k, v in SEGMENTED.items() if k not in ("group_size", "micro_batch_size", "warmup_steps")}
    common.update(tasks_per_step=2, batch_size=2, actor_warmup_steps=0, actor_steps=1)
    archer = bare(ArcherTrainer, ArcherConfig(model=str(model_dir), output_dir=str(tmp_path / "archer"),
                                              critic_steps=1, **common), model_dir)
    trajectories = sampled(archer)
    stats = archer._learn(0, trajectories)
    assert stats["replay/size"] == sum(len(t.turns) for t in trajectories)
    assert all(torch.isfinite(torch.tensor(stats[k])) for k in ("critic/loss", "actor/loss"))
    fbc = bare(FilteredBCTrainer, FilteredBCConfig(model=str(model_dir), output_dir=str(tmp_path / "fbc"), **common),
               model_dir)
    stats = fbc._learn(0, trajectories)
    assert stats["filter/episodes_kept"] >= 1.0 and "actor/loss" in stats


def test_replay_states_restart_at_each_segment() -> None:
    """A turn's state ids are its segment's ids up to it, never ids of an earlier segment the model no longer saw."""
    turns = tuple(Turn(observation=f"o{i}", action=f"a{i}", info={"kind": "tool_call"}, prompt_token_ids=(10 * i + 1,),
                       action_token_ids=(10 * i + 2,), segment_index=i // 2) for i in range(5))
    trajectory = Trajectory(env_id="e", task_id="t", seed=0, turns=turns, end_reason="solved",
                            outcome={"success": True, "score": 1.0, "end_reason": "solved"}, traj_id="x")
    states = [t.state_ids for t in transitions_from_trajectory(trajectory, lambda ids: " ".join(map(str, ids)))]
    assert states == [(1,), (1, 2, 11), (21,), (21, 22, 31), (41,)]
    rows = build_batch([trajectory], [0.5], [True], pad_id=0)
    assert rows.input_ids.tolist() == [[1, 2, 11, 12], [21, 22, 31, 32], [41, 42, 0, 0]]
    assert rows.advantages[:, 0].tolist() == [0.5, 0.5, 0.5] and rows.episode_index.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="segments"):
        trajectory.token_view()
    shorter = dataclasses.replace(trajectory, turns=turns[:1] + turns[2:])  # segments 0, 1, 1, 2: still in order
    assert shorter.num_segments == 3
    with pytest.raises(ValueError, match="count up"):
        dataclasses.replace(trajectory, turns=turns[2:]).segment_bounds()


def test_saved_rollouts_keep_every_segments_token_data(model_dir: Path, tmp_path: Path) -> None:
    """``save_rollouts`` keeps a segmented episode's token data (each segment's tokens, loss mask, log-probs and
    advantages, in order, with the segments' lengths) and the viewer shows it."""
    import json

    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer
    from agentgym.trainers.rollout_saver import save_step_rollouts
    from agentgym.viewer.run import load_run

    trainer = bare(GrpoTrainer, GrpoConfig(model=str(model_dir), output_dir=str(tmp_path), save_rollouts=1,
                                           **SEGMENTED), model_dir)
    trajectories = sampled(trainer)
    _, batch = learn_recording_batch(trainer, trajectories)
    assert save_step_rollouts(trainer, 1, trajectories) is not None
    sidecar = tmp_path / "rollouts" / "step-000001.tokens.jsonl"
    records = [json.loads(line) for line in sidecar.read_text().splitlines()]
    assert [r["traj_id"] for r in records] == [t.traj_id for t in trajectories]
    row = 0
    for record, trajectory in zip(records, trajectories):
        views = trajectory.token_views()
        assert record["segments"] == [len(v) for v in views] and record["trained"] is True
        assert len(record["tokens"]) == len(record["logprob"]) == sum(len(v) for v in views)
        mask = [v for v, n in record["mask"] for _ in range(n)]
        advantage = [v for v, n in record["advantage"] for _ in range(n)]
        start = 0
        for view in views:  # each segment's slice is its batch row: the update's mask and advantages
            stop = start + len(view)
            assert mask[start:stop] == batch.loss_mask[row][:len(view)].tolist()
            assert advantage[start:stop] == [round(x, 3) + 0.0 for x in batch.advantages[row][:len(view)].tolist()]
            assert record["logprob"][start:stop] == [round(x, 3) + 0.0 for x in view.logprobs]
            start, row = stop, row + 1
    run = load_run(tmp_path)
    assert all(e.tokens is not None and e.tokens["segments"] for e in run.episodes)
