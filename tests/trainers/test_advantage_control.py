"""``advantage_control: shuffle``: the shuffled-advantage control of GRPO (episodes) and GiGPO (steps), in the
trainer's own loss path, and refused when misspelled."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.trainers import make_trainer  # noqa: E402
from agentgym.trainers.batch import build_batch  # noqa: E402
from agentgym.trainers.config import config_from_dict  # noqa: E402
from tests.helpers.tiny_models import build_maze_tiny_model  # noqa: E402
from tests.trainers.test_study_options import BATCH  # noqa: E402


@pytest.fixture(scope="module")
def maze_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_maze_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _trainer(model: Path, out: Path, trainer: str, **extra: object):  # noqa: ANN202 - a trainer of either kind
    fields = {"trainer": trainer, "model": str(model), "suite": "games-maze", "output_dir": str(out),
              "group_size": 4, "tasks_per_step": 2, **extra}
    if trainer == "gigpo":
        fields.setdefault("invalid_penalty", 0.0)
    return make_trainer(config_from_dict(fields))


def _rows(built, step: int = 0) -> tuple[torch.Tensor, object]:  # noqa: ANN001
    batch = build_batch(BATCH, torch.zeros(len(BATCH)), [True] * len(BATCH), pad_id=0)
    built._control_step = step
    rows, _ = built._token_advantages(BATCH, built._scores(BATCH), torch.ones(len(BATCH), dtype=torch.bool),
                                      list(range(len(BATCH))), batch)
    return rows, batch


def _per_step(rows: torch.Tensor, batch) -> list[float]:  # noqa: ANN001
    """Each (row, turn)'s value, read on its first trained token, in batch order."""
    values = []
    for i in range(len(batch)):
        for turn in sorted({int(t) for t in batch.turn_index[i][batch.loss_mask[i] > 0].tolist()}):
            first = int(((batch.turn_index[i] == turn) & (batch.loss_mask[i] > 0)).nonzero()[0])
            values.append(round(float(rows[i, first]), 5))
    return values


def test_grpo_control_deals_the_episode_advantages_out_again(maze_model: Path, tmp_path: Path) -> None:
    real, batch = _rows(_trainer(maze_model, tmp_path / "a", "grpo"))
    shuffled, _ = _rows(_trainer(maze_model, tmp_path / "b", "grpo", advantage_control="shuffle"))
    trained = batch.loss_mask > 0
    assert all(len(set(row[m].tolist())) == 1 for row, m in zip(shuffled, trained))  # one value per episode still
    real_ep, shuffled_ep = real[:, 0].tolist(), shuffled[:, 0].tolist()
    assert Counter(round(v, 6) for v in shuffled_ep) == Counter(round(v, 6) for v in real_ep)  # a permutation
    assert shuffled_ep != real_ep  # ... that lost the pairing with what each episode did
    again, _ = _rows(_trainer(maze_model, tmp_path / "c", "grpo", advantage_control="shuffle"))
    assert torch.equal(again, shuffled)  # the run's seed and the step fix the permutation
    other_step, _ = _rows(_trainer(maze_model, tmp_path / "d", "grpo", advantage_control="shuffle"), step=1)
    assert not torch.equal(other_step, shuffled)  # a new permutation every step


def test_gigpo_control_deals_step_advantages_at_the_method_scale(maze_model: Path, tmp_path: Path) -> None:
    real, batch = _rows(_trainer(maze_model, tmp_path / "a", "gigpo"))
    shuffled, _ = _rows(_trainer(maze_model, tmp_path / "b", "gigpo", advantage_control="shuffle"))
    real_steps, shuffled_steps = _per_step(real, batch), _per_step(shuffled, batch)
    assert Counter(shuffled_steps) == Counter(real_steps) and shuffled_steps != real_steps
    grpo, _ = _rows(_trainer(maze_model, tmp_path / "c", "grpo"))
    scaled, _ = _rows(_trainer(maze_model, tmp_path / "d", "gigpo", advantage_control="shuffle",
                               advantage_scale="grpo"))
    mask = batch.loss_mask > 0
    assert float(scaled[mask].abs().mean()) == pytest.approx(float(grpo[mask].abs().mean()), rel=1e-5)


def test_the_update_trains_on_the_shuffled_advantages(maze_model: Path, tmp_path: Path) -> None:
    """The batch the clipped loss reads (kept by save_rollouts) holds the control's values, not the method's."""
    results = {}
    for control in ("none", "shuffle"):
        built = _trainer(maze_model, tmp_path / control, "grpo", advantage_control=control, save_rollouts=1,
                         micro_batch_size=8, tensorboard=False)
        built.model, built.tokenizer = built._load(maze_model)
        built._setup(None)
        built._make_optimizer()
        stats = built._learn(4, list(BATCH))
        _, learned = built._learned_batch
        results[control] = (learned.advantages[:, 0].tolist(), stats["train/loss"])
        expected, _ = _rows(_trainer(maze_model, tmp_path / f"{control}-x", "grpo", advantage_control=control), 4)
        assert learned.advantages[:, 0].tolist() == expected[:, 0].tolist()
    (real, real_loss), (shuffled, shuffled_loss) = results["none"], results["shuffle"]
    assert sorted(shuffled) == pytest.approx(sorted(real)) and shuffled != real
    assert shuffled_loss != pytest.approx(real_loss)


def test_an_unknown_control_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"advantage_control.*'none', 'shuffle'"):
        config_from_dict({"trainer": "grpo", "model": "m", "suite": "games-maze", "advantage_control": "shufle"})
    with pytest.raises(ConfigError, match="advantage_control"):
        config_from_dict({"trainer": "gigpo", "model": "m", "suite": "games-maze", "advantage_control": True})
