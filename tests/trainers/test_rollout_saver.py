"""Trainers keep their rollouts: ``save_rollouts: N`` writes every N-th step's episodes in eval's trajectories
format with a token sidecar (loss mask, log-prob, advantage per token) that the viewer reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.storage import read_trajectories  # noqa: E402
from agentgym.trainers.config import GrpoConfig  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trainers.rollout_saver import RolloutSaver, run_length  # noqa: E402
from agentgym.viewer.run import load_run  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


def _config(model_dir: Path, out: Path, **overrides: object) -> GrpoConfig:
    values = dict(model=str(model_dir), suite="games-calc", output_dir=str(out), steps=2, tasks_per_step=2,
                  group_size=2, eval_tasks=2, eval_every=0, checkpoint_every=0, system_prompt="",
                  max_tokens_per_turn=8, max_context_tokens=96, tensorboard=False, micro_batch_size=4, seed=0,
                  save_rollouts=1)
    values.update(overrides)
    return GrpoConfig(**values)  # type: ignore[arg-type]


def test_run_length_rounds_and_merges() -> None:
    assert run_length([0, 0, 1.0, 1, 1, 0]) == [[0, 2], [1, 3], [0, 1]]
    assert run_length([0.12344, 0.12341, -0.0]) == [[0.123, 2], [0, 1]]
    assert json.dumps(run_length([-0.0, 0.5])) == "[[0, 1], [0.5, 1]]"


def test_save_rollouts_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="save_rollouts: must be >= 0"):
        _config(tmp_path, tmp_path / "out", save_rollouts=-1)


def test_only_due_steps_are_saved_and_a_full_disk_costs_only_the_files(tmp_path: Path) -> None:
    saver = RolloutSaver(tmp_path, 3)
    assert [s for s in range(1, 10) if saver.wants(s)] == [3, 6, 9]
    assert saver.save(2, []) is None and not (tmp_path / "rollouts").exists()
    (tmp_path / "rollouts").write_text("a file where the folder goes")  # mkdir fails like a read-only disk
    assert saver.save(3, []) is None


def test_a_tiny_grpo_run_keeps_rollouts_the_viewer_reads(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "model", texts=demonstration_texts("games-calc", 60), config=SMALL)
    out = tmp_path / "run"
    GrpoTrainer(_config(model_dir, out)).train()
    files = sorted(p.name for p in (out / "rollouts").iterdir())
    assert files == ["step-000001.jsonl", "step-000001.tokens.jsonl", "step-000002.jsonl", "step-000002.tokens.jsonl"]
    episodes = list(read_trajectories(out / "rollouts" / "step-000002.jsonl"))  # eval's reader takes them as they are
    assert len(episodes) == 4 and all(t.metadata["train_step"] == 2 and t.has_tokens for t in episodes)
    records = [json.loads(line) for line in (out / "rollouts" / "step-000002.tokens.jsonl").read_text().splitlines()]
    assert [r["traj_id"] for r in records] == [t.traj_id for t in episodes]
    for record, traj in zip(records, episodes):
        view = traj.token_view()
        assert len(record["tokens"]) == len(record["logprob"]) == len(view) == sum(n for _, n in record["mask"])
        assert sum(n for _, n in record["advantage"]) == len(view) and record["trained"] is True
        # the update's loss mask: never on the prompt, and on sampled tokens only for episodes that trained
        assert sum(v * n for v, n in record["mask"]) <= sum(view.loss_mask)
        assert record["tokens"][0] and all(isinstance(x, str) for x in record["tokens"])
        lp = [x for x, m in zip(record["logprob"], view.loss_mask) if m]
        assert lp == [round(x, 3) + 0.0 for x, m in zip(view.logprobs, view.loss_mask) if m]
    run = load_run(out)
    assert run.kind == "train" and len(run.episodes) == 8 and all(e.tokens is not None for e in run.episodes)
    assert {e.train_step for e in run.episodes} == {1, 2} and run.metrics and run.settings["save_rollouts"] == 1


def test_a_segmented_episode_keeps_each_segments_tokens(tmp_path: Path) -> None:
    """An episode in two segments (its history was rewritten) is one record whose token fields hold both segments
    in order, ``segments`` their lengths; rows of the update map to segments in order; the viewer reads it."""
    from agentgym.trainers.rollout_saver import StepTokens
    from agentgym.trajectory import Trajectory, Turn

    turns = tuple(Turn(observation=f"o{i}", action=f"a{i}", info={"kind": "tool_call"}, prompt_token_ids=(10 * i + 1,),
                       action_token_ids=(10 * i + 2,), action_logprobs=(-0.5,), segment_index=i // 2)
                  for i in range(3))
    trajectory = Trajectory(env_id="e", task_id="t", seed=0, turns=turns, end_reason="solved",
                            outcome={"success": True, "score": 1.0, "end_reason": "solved"}, traj_id="x")
    tokens = StepTokens(rows=[0, 0], loss_mask=[[0, 1, 0, 1], [0, 1, 0, 0]],
                        advantages=[[0.5, 0.5, 0.5, 0.5], [0.25, 0.25, 0, 0]])
    saver = RolloutSaver(tmp_path, 1)
    assert saver.save(1, [trajectory], tokens) is not None
    [record] = [json.loads(line) for line in (tmp_path / "rollouts" / "step-000001.tokens.jsonl").read_text().splitlines()]
    assert record["segments"] == [4, 2] and record["trained"] is True
    assert record["tokens"] == ["<1>", "<2>", "<11>", "<12>", "<21>", "<22>"]
    assert record["mask"] == [[0, 1], [1, 1], [0, 1], [1, 1], [0, 1], [1, 1]]
    assert record["advantage"] == [[0.5, 4], [0.25, 2]]
    assert record["logprob"] == [0, -0.5, 0, -0.5, 0, -0.5]
    [episode] = load_run(tmp_path).episodes
    assert episode.tokens == record


def test_an_unsegmented_episode_keeps_the_record_it_always_had(tmp_path: Path) -> None:
    from agentgym.trajectory import Trajectory, Turn

    turn = Turn(observation="o", action="a", info={"kind": "answer"}, prompt_token_ids=(1,), action_token_ids=(2,),
                action_logprobs=(-0.5,))
    trajectory = Trajectory(env_id="e", task_id="t", seed=0, turns=(turn,), end_reason="answered",
                            outcome={"success": True, "score": 1.0, "end_reason": "answered"}, traj_id="y")
    RolloutSaver(tmp_path, 1).save(1, [trajectory])
    [record] = [json.loads(line) for line in (tmp_path / "rollouts" / "step-000001.tokens.jsonl").read_text().splitlines()]
    assert record == {"traj_id": "y", "train_step": 1, "tokens": ["<1>", "<2>"], "mask": [[0, 1], [1, 1]],
                      "logprob": [0, -0.5], "advantage": [[0, 2]], "trained": False}
