"""FSDP2 (``parallelism: fsdp``, 2 gloo processes on CPU): the sharded update equals the single-process update on the
union of the ranks' data, also with a KL reference, LoRA with gradient checkpointing, and a rank whose episodes all
errored (no hang); a whole run under ``torchrun`` checkpoints full state dicts that load in one process, and a run
resumed from its checkpoint ends with the uninterrupted run's weights.

The worker is this file itself (``torchrun tests/trainers/test_fsdp.py MODEL_DIR OUT``, launched by :mod:`tests.helpers.torchrun` with
a timeout); pytest runs the same updates in one process and compares.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.trainers.test_data_parallel import _trajectories  # noqa: E402  - the same fixed trajectories as the DDP tests
from tests.helpers.torchrun import build_small_model, torchrun  # noqa: E402

SUITE = "games-calc"
LEARN_STEPS = 3  # _learn calls per case: the sharded optimizer state and parameters carry across steps

#: name -> which data each rank holds ("A", "B": healthy groups; "E": episodes that all errored) and the config.
CASES: dict[str, dict[str, Any]] = {
    # rank 0 has fewer micro-batches than rank 1 (zero-weight passes); 2 epochs; a sharded KL reference. (With
    # mini_batches > 1 each rank splits its own rows, so the mini-batches are not one process's: not compared here.)
    "union": {"ranks": ["A", "B"], "config": {"micro_batch_size": 2, "reference_model": "initial", "kl_coef": 0.1,
                                             "ppo_epochs": 2}},
    "errored": {"ranks": ["A", "E"], "config": {"micro_batch_size": 2, "packing": True}},
    # LoRA: frozen base and trainable adapters in the same FSDP units; the reference is the base (adapters off)
    "lora": {"ranks": ["A", "B"], "config": {"micro_batch_size": 3, "lora": {"r": 4, "alpha": 8},
                                            "gradient_checkpointing": True, "reference_model": "initial",
                                            "kl_coef": 0.1}},
}


def _config(model_dir: str, out: str, **overrides: Any) -> Any:
    from agentgym.trainers.config import GrpoConfig

    values: dict[str, Any] = dict(model=model_dir, suite=SUITE, output_dir=out, steps=1, tasks_per_step=4,
                                  group_size=4, eval_tasks=2, eval_every=0, checkpoint_every=0, system_prompt="",
                                  max_tokens_per_turn=8, max_context_tokens=128, tensorboard=False, seed=0,
                                  parallelism="fsdp")
    values.update(overrides)
    return GrpoConfig(**values)


def run_learn(model_dir: str, out: str, data: str, **config: Any) -> dict[str, Any]:
    """``LEARN_STEPS`` GRPO ``_learn`` calls on ``data``'s trajectories, set up in ``train()``'s order (load, shard,
    optimizer, method's modules), in whatever world this process is in; the trainable parameters by name (on rank
    0 when sharded: gathered full)."""
    from agentgym.trainers.grpo import GrpoTrainer

    trainer = GrpoTrainer(_config(model_dir, out, **config))
    torch.manual_seed(0)  # LoRA's initial adapters are drawn: the same on every rank and in the reference
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer._parallelize()
    trainer.optimizer = torch.optim.SGD([p for p in trainer.model.parameters() if p.requires_grad], lr=0.5)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    trainer._setup(None)
    trajectories = [t for kind in data for t in _trajectories(kind)]
    stats = [trainer._learn(step, trajectories) for step in range(LEARN_STEPS)]
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    full, _ = trainer.sharding.full_state_dicts(trainer.model, trainer.optimizer)
    state = full if full is not None else trainer.model.state_dict()
    if config.get("lora") and trainer.world.is_main:  # the final save's path: adapter/ and the merged model/
        from agentgym.models.loading import save_trained_model

        save_trained_model(trainer.model, trainer.tokenizer, Path(out) / "final", base=model_dir, state_dict=full)
    return {"params": {k: v.detach().double().clone() for k, v in state.items() if k in names},
            "sharded": trainer.sharding.is_sharded(trainer.model), "stats": stats}


def _worker(model_dir: str, out: str) -> None:
    """Entry point under torchrun: the update cases, then a whole run and its resume from the step-1 checkpoint."""
    import torch.distributed as dist

    from agentgym.trainers.grpo import GrpoTrainer

    rank = int(os.environ["RANK"])
    for case, spec in CASES.items():
        result = run_learn(model_dir, os.path.join(out, f"{case}-run"), spec["ranks"][rank], **spec["config"])
        torch.save(result, os.path.join(out, f"{case}-rank{rank}.pt"))
    # AdamW (the trainer's own) with weight decay, which moves the weights even when advantages are all zero
    straight = _config(model_dir, os.path.join(out, "straight"), steps=2, tasks_per_step=2, micro_batch_size=3,
                       weight_decay=0.1, learning_rate=1e-3, warmup_steps=0, checkpoint_every=1)
    GrpoTrainer(straight).train()
    if rank == 0:  # a run stopped after its step-1 checkpoint: the same directory without what came later
        resumed = Path(out) / "resumed" / "checkpoints"
        resumed.mkdir(parents=True)
        shutil.copytree(Path(out) / "straight" / "checkpoints" / "step-000001", resumed / "step-000001")
        (resumed / "latest").write_text("step-000001", encoding="utf-8")
    dist.barrier()
    GrpoTrainer(dataclasses.replace(straight, output_dir=os.path.join(out, "resumed"))).train()


# ---- pytest side --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_model(tmp_path_factory.mktemp("tiny") / "model", SUITE)


@pytest.fixture(scope="module")
def two_ranks(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case and the whole runs on 2 gloo ranks with FSDP (one launch; a deadlock fails after the timeout)."""
    out = tmp_path_factory.mktemp("fsdp")
    torchrun([str(Path(__file__).resolve()), str(model_dir), str(out)], timeout=240)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_update_equals_one_process_on_the_union(two_ranks: Path, model_dir: Path, tmp_path: Path,
                                                        case: str) -> None:
    sharded = torch.load(two_ranks / f"{case}-rank0.pt")
    assert sharded["sharded"], "the model must have been sharded under torchrun"
    data = "".join(CASES[case]["ranks"])
    single = run_learn(str(model_dir), str(tmp_path), data, **CASES[case]["config"])
    assert not single["sharded"]
    assert sharded["params"].keys() == single["params"].keys() and single["params"]
    if case == "union":
        from transformers import AutoModelForCausalLM

        before = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        moved = max(float((single["params"][k] - before[k]).abs().max()) for k in single["params"])
        assert moved > 1e-3, "the updates must change the parameters"
    for name, value in single["params"].items():
        error = float((sharded["params"][name] - value).abs().max())
        assert error < 1e-5, f"{name} differs from one process by {error:.3g}"
    for step in range(LEARN_STEPS):  # metrics are global, not rank 0's share
        for key in ("train/tokens", "train/loss", "train/grad_norm"):
            assert sharded["stats"][step][key] == pytest.approx(single["stats"][step][key], rel=1e-5, abs=1e-6), key
    if case == "lora":  # the merged model rank 0 saved from the gathered adapters is one process's
        from transformers import AutoModelForCausalLM

        merged = [AutoModelForCausalLM.from_pretrained(d / "final" / "model")
                  for d in (two_ranks / "lora-run", tmp_path)]
        base = AutoModelForCausalLM.from_pretrained(model_dir)
        pairs = list(zip(merged[0].parameters(), merged[1].parameters(), base.parameters()))
        assert max(float((a - b).abs().max()) for a, b, _ in pairs) < 1e-5
        assert max(float((a - c).abs().max()) for a, _, c in pairs) > 1e-4, "the adapters must be merged in"
    if case == "errored":
        rank1 = torch.load(two_ranks / f"{case}-rank1.pt")
        assert rank1["stats"][0]["train/errors"] == 4.0 and rank1["stats"][0]["train/tokens"] > 0


def test_checkpoint_holds_full_states_that_load_in_one_process(two_ranks: Path) -> None:
    """Rank 0 writes a complete model directory and name-keyed, full (not sharded) AdamW states; one process loads
    both into an unsharded model."""
    from transformers import AutoModelForCausalLM

    from agentgym.trainers.checkpoint import load_checkpoint

    checkpoint = two_ranks / "straight" / "checkpoints" / "step-000001"
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    blob = torch.load(checkpoint / "trainer.pt", weights_only=False)
    assert blob["optimizer_format"] == "names"
    shapes = {n: p.shape for n, p in model.named_parameters()}
    assert set(blob["optimizer"]["state"]) == set(shapes)
    for name, state in blob["optimizer"]["state"].items():
        assert state["exp_avg"].shape == shapes[name] and state["exp_avg_sq"].shape == shapes[name]
        assert not type(state["exp_avg"]).__name__ == "DTensor"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    assert load_checkpoint(checkpoint, optimizer, scheduler, model=model)["step"] == 1
    name = "model.layers.0.mlp.down_proj.weight"
    saved = blob["optimizer"]["state"][name]["exp_avg"]
    assert torch.equal(optimizer.state[model.get_parameter(name)]["exp_avg"], saved)


def test_resumed_sharded_run_equals_the_uninterrupted_one(two_ranks: Path, model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    straight = AutoModelForCausalLM.from_pretrained(two_ranks / "straight" / "model")
    resumed = AutoModelForCausalLM.from_pretrained(two_ranks / "resumed" / "model")
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    for (name, a), b, c in zip(straight.named_parameters(), resumed.parameters(), initial.parameters()):
        assert torch.equal(a, b), f"{name} differs after resuming: {float((a - b).abs().max()):.3g}"
    assert any(not torch.equal(a, c) for a, c in zip(straight.parameters(), initial.parameters()))
    assert (two_ranks / "resumed" / "summary.json").is_file()


def test_parallelism_is_validated(model_dir: Path, tmp_path: Path) -> None:
    from agentgym.errors import ConfigError
    from agentgym.trainers.archer import ArcherConfig, ArcherTrainer
    from agentgym.trainers.distributed import World

    with pytest.raises(ConfigError, match=r"GrpoConfig.parallelism: expected one of 'ddp', 'fsdp', got 'zero3'"):
        _config(str(model_dir), str(tmp_path), parallelism="zero3")
    with pytest.raises(ConfigError, match="parallelism: 'fsdp' samples with the trained model"):
        _config(str(model_dir), str(tmp_path), generation_backend="vllm", device="cuda")
    archer = ArcherConfig(model=str(model_dir), suite=SUITE, output_dir=str(tmp_path), parallelism="fsdp",
                          eval_tasks=2, tensorboard=False)
    with pytest.raises(ConfigError, match="ArcherConfig.parallelism: ArCHer does not shard its models yet"):
        ArcherTrainer(archer, world=World(0, 2))  # two ranks: checked before any collective


if __name__ == "__main__":  # a rank under torchrun: MODEL_DIR OUT
    _worker(sys.argv[1], sys.argv[2])
