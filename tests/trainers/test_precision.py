"""Mixed precision (``mixed_precision: bf16``): float32 master weights that really train, forwards in bfloat16, and
a bfloat16 sampling copy that follows every update; a bad combination is refused with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.trainers.config import GrpoConfig  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trainers.precision import forward_precision, refresh_sampling_copy, sampling_copy  # noqa: E402
from tests.helpers.tiny_models import build_small_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def config(model_dir: Path, out: Path, **overrides: object) -> GrpoConfig:
    values = dict(model=str(model_dir), suite="games-calc", output_dir=str(out), steps=2, tasks_per_step=2,
                  group_size=4, eval_tasks=4, eval_every=0, checkpoint_every=1, system_prompt="",
                  max_tokens_per_turn=12, max_context_tokens=128, tensorboard=False, micro_batch_size=3, seed=0,
                  mixed_precision="bf16")
    values.update(overrides)
    return GrpoConfig(**values)  # type: ignore[arg-type]


def test_forwards_run_in_bfloat16_only_when_asked() -> None:
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with forward_precision("cpu", "no"):
        assert layer(x).dtype == torch.float32
    with forward_precision("cpu", "bf16"):
        assert layer(x).dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32


def test_the_sampling_copy_is_bfloat16_and_follows_the_master_weights() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    shadow = sampling_copy(model, "bf16")
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in shadow.parameters())
    assert not shadow.training
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert not torch.equal(shadow[0].weight, model[0].weight.to(torch.bfloat16))
    before = sum(p._version for p in shadow.parameters())
    refresh_sampling_copy(shadow, model)
    for mine, master in zip(shadow.parameters(), model.parameters()):
        assert torch.equal(mine, master.detach().to(torch.bfloat16))
    # in place: the version counters move, so a policy never reuses keys and values of the old weights
    assert sum(p._version for p in shadow.parameters()) > before
    assert sampling_copy(model, "no")[0].weight.dtype == torch.float32


@pytest.mark.parametrize("overrides, fix", [
    ({"dtype": "bfloat16"}, "set dtype: float32"),
    ({"parallelism": "fsdp"}, "use parallelism: ddp"),
    ({"mixed_precision": "fp16"}, "expected one of 'no', 'bf16'"),
])
def test_a_combination_that_cannot_work_is_refused_with_the_fix(model_dir: Path, tmp_path: Path,
                                                                 overrides: dict, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        config(model_dir, tmp_path, **overrides)


def test_a_mixed_precision_run_trains_float32_weights_and_samples_from_their_bfloat16_copy(model_dir: Path,
                                                                                          tmp_path: Path) -> None:
    trainer = GrpoTrainer(config(model_dir, tmp_path / "run", warmstart="bc", bc_demos=8, bc_steps=2))
    trainer.train()
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    sampler_model = trainer.policy.model
    assert sampler_model is not trainer.model
    for mine, master in zip(sampler_model.parameters(), trainer.model.parameters()):
        assert torch.equal(mine, master.detach().to(torch.bfloat16)), "the copy must hold the last update's weights"
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "train/loss" in m]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(m["train/loss"])) for m in steps)
    # the sampler's bfloat16 log-probs against the update's: close, but not equal (else nothing ran in bfloat16)
    gaps = [m["train/logprob_mismatch"] for m in steps]
    assert all(0 < g < 0.1 for g in gaps), gaps
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved.get("mixed_precision", saved.get("config", {}).get("mixed_precision")) == "bf16"


def test_a_resumed_mixed_precision_run_samples_from_the_checkpoint_weights(model_dir: Path, tmp_path: Path) -> None:
    GrpoTrainer(config(model_dir, tmp_path / "run", steps=1)).train()
    trainer = GrpoTrainer(config(model_dir, tmp_path / "run", steps=2))
    summary = trainer.train()
    assert summary.get("resumed_from")
    for mine, master in zip(trainer.policy.model.parameters(), trainer.model.parameters()):
        assert torch.equal(mine, master.detach().to(torch.bfloat16))


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_an_asynchronous_worker_samples_in_bfloat16_too(model_dir: Path, tmp_path: Path, worker: str) -> None:
    trainer = GrpoTrainer(config(model_dir, tmp_path / "run", steps=3, checkpoint_every=0, max_staleness=1,
                                 async_worker=worker))
    trainer.train()
    if worker == "thread":
        assert all(p.dtype == torch.bfloat16 for p in trainer._async.policy.model.parameters())
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "train/loss" in m]
    assert len(steps) == 3
    # every update's pi_old is the float32-weight forward; the worker's samples came from the bfloat16 copy
    assert all(0 < m["train/logprob_mismatch"] < 0.1 for m in steps), [m["train/logprob_mismatch"] for m in steps]


def test_a_cpu_without_bfloat16_products_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentgym.trainers.precision as precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert "set mixed_precision: no" in precision.slow_bfloat16("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert precision.slow_bfloat16("cpu") is None
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset())  # no /proc/cpuinfo: not judged
    assert precision.slow_bfloat16("cpu") is None
    assert precision.slow_bfloat16("cuda") is None
