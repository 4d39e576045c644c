"""LoRA, precision and gradient checkpointing in the trainers, on the tiny model on a CPU.

LoRA end to end: only adapter weights train, the in-trainer sampler sees the adapted weights, the KL reference
``initial`` is the base under disabled adapters, checkpoints hold the adapter and resume bit for bit, and the
final ``model/`` is the merged model (same logits as base + adapter) that ``agentgym eval`` loads unchanged.
bfloat16 + gradient checkpointing (+ LoRA) update on a CPU; GPU-only options fail at once with the fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("peft") is None:  # a spec check: importing peft costs seconds in every collecting worker
    pytest.skip("peft is not installed (pip install 'agentgym[train]')", allow_module_level=True)

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.loading import LoadOptions, is_checkpointing, load_model, merged_state_dict  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.trainers.batch import build_batch, sequence_logprobs  # noqa: E402
from agentgym.trainers.config import GrpoConfig  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
LORA = {"r": 4, "alpha": 8}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 100),
                            config=SMALL)


def small_config(model_dir: Path, out: Path, **overrides: object) -> GrpoConfig:
    values = dict(model=str(model_dir), suite="games-calc", output_dir=str(out), steps=2, tasks_per_step=1,
                  group_size=4, eval_tasks=2, eval_every=0, checkpoint_every=1, system_prompt="",
                  max_tokens_per_turn=10, max_context_tokens=96, tensorboard=False, micro_batch_size=4, seed=0,
                  lora=LORA, learning_rate=1e-2, warmup_steps=0)
    values.update(overrides)
    return GrpoConfig(**values)  # type: ignore[arg-type]


def _trainer_with_model(config: GrpoConfig) -> GrpoTrainer:
    """A trainer with its model, reference and sampler set up as ``train()`` does, without running steps."""
    from agentgym.policies.hf import HFPolicy

    trainer = GrpoTrainer(config)
    trainer.model, trainer.tokenizer = trainer._load(config.model)
    trainer.reference = trainer._reference_model(trainer.model)
    trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
    return trainer


def _update_with_fixed_advantages(trainer: GrpoTrainer, step: int, optimizer: torch.optim.Optimizer) -> tuple:
    trajectories = trainer._sample(step)
    n = len(trajectories)
    batch = build_batch(trajectories, torch.tensor([1.0, -1.0] * (n // 2)), [True] * n, pad_id=0)
    return trainer._update(batch, optimizer, trainer._schedule(optimizer), step), batch


class VariedRewardGrpo(GrpoTrainer):
    """GRPO scored by how many distinct characters the agent wrote: the untrained tiny model never solves a task,
    so every real reward ties and GRPO's advantages vanish; this score differs within a group, so updates happen."""

    def _scores(self, trajectories: list) -> torch.Tensor:
        return torch.tensor([len(set("".join(turn.action for turn in t.turns))) / 20 for t in trajectories])


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _digest(state: dict) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


# ---- the update -------------------------------------------------------------------------------------------
def test_lora_trains_only_adapters_and_the_sampler_sees_them(model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer_with_model(small_config(model_dir, tmp_path, kl_coef=0.05, reference_model="initial"))
    model = trainer.model
    import peft  # noqa: PLC0415 - see the module's skip

    assert isinstance(model, peft.PeftModel) and trainer.reference is model  # the reference is the base, no copy
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    total = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) < total / 5
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(2):
        stats, batch = _update_with_fixed_advantages(trainer, step, optimizer)
        assert torch.isfinite(torch.tensor(stats["train/loss"])) and stats["train/tokens"] > 0
        # recomputed log-probs equal what the sampler recorded: at step 1 the adapters are non-zero, so the
        # sampler must have used the adapted weights
        assert stats["train/logprob_mismatch"] < 1e-4
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all("lora_" in k for k in changed), "only adapter weights may change"
    assert any("lora_B" in k for k in changed)
    # the KL reference (adapters disabled) is exactly the untouched base model
    base, _ = load_model(model_dir, trainable=False)
    ids, mask = batch.input_ids[:2], batch.attention_mask[:2]
    with torch.no_grad(), trainer._reference_context():
        ref = sequence_logprobs(model, ids, mask)
    with torch.no_grad():
        adapted = sequence_logprobs(model, ids, mask)
        plain = sequence_logprobs(base, ids, mask)
    m = mask.bool()
    assert torch.allclose(ref[m], plain[m], atol=1e-5)
    assert (adapted[m] - plain[m]).abs().max() > 1e-3, "the trained adapters change the policy"
    assert "train/kl" in stats and stats["train/kl"] > 0


def test_bfloat16_gradient_checkpointing_and_lora_update_on_cpu(model_dir: Path, tmp_path: Path) -> None:
    for lora in (LORA, None):
        trainer = _trainer_with_model(small_config(model_dir, tmp_path / str(bool(lora)), dtype="bfloat16",
                                                   gradient_checkpointing=True, lora=lora, attn_implementation="sdpa"))
        model = trainer.model
        base = model.get_base_model() if lora else model
        assert is_checkpointing(model)
        assert base.model.embed_tokens.weight.dtype == torch.bfloat16
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        before = [p.detach().clone() for p in params]
        stats, _ = _update_with_fixed_advantages(trainer, 0, optimizer)
        assert torch.isfinite(torch.tensor(stats["train/loss"])) and stats["train/grad_norm"] > 0
        assert sum(not torch.equal(p, b) for p, b in zip(params, before)) > 0
        assert stats["train/logprob_mismatch"] < 0.05  # bfloat16 sampler vs bfloat16 recomputation


def test_merged_state_dict_matches_peft_merge(model_dir: Path) -> None:
    """What vLLM would receive after each update equals peft's own merge, under the base model's names."""
    model, _ = load_model(model_dir, LoadOptions(lora=LORA))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    mine = merged_state_dict(model)
    reference = json.loads(json.dumps(sorted(mine)))  # names only, to compare below
    import copy

    theirs = copy.deepcopy(model).merge_and_unload().state_dict()
    assert reference == sorted(theirs)
    for key, value in theirs.items():
        assert torch.allclose(mine[key], value, atol=1e-6), key
    plain, _ = load_model(model_dir, trainable=False)
    assert any(not torch.allclose(mine[k], v) for k, v in plain.state_dict().items())


# ---- a run end to end -------------------------------------------------------------------------------------
def test_lora_run_saves_merged_model_and_adapter_and_resumes_exactly(model_dir: Path, tmp_path: Path) -> None:
    from agentgym.cli import main
    from agentgym.policies.hf import HFPolicy

    config = small_config(model_dir, tmp_path / "straight", keep_checkpoints=3, kl_coef=0.05, reference_model="initial")
    VariedRewardGrpo(config).train()
    out = tmp_path / "straight"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/grad_norm"] > 0 for m in metrics if "train/grad_norm" in m] == [True, True]
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "adapter" / "agentgym.json").is_file()
    assert (out / "model" / "config.json").is_file() and not (out / "model" / "adapter_config.json").exists()
    checkpoint = out / "checkpoints" / "step-000001" / "model"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()

    # the merged model has the logits of base + adapter, and they differ from the base model's
    base, tokenizer = load_model(model_dir, trainable=False)
    import peft  # noqa: PLC0415 - see the module's skip

    adapted = peft.PeftModel.from_pretrained(load_model(model_dir, trainable=False)[0], str(out / "adapter"))
    merged = HFPolicy.from_pretrained(out / "model")
    ids = torch.tensor([tokenizer("Compute 12 * 7 with the calculator.")["input_ids"]])
    want = _logits(adapted, ids)
    assert (_logits(merged.model, ids) - want).abs().max() < 1e-4
    assert (_logits(base, ids) - want).abs().max() > 1e-3
    assert merged.default_system_prompt == ""  # agentgym.json travelled with the merged model

    # resume from the step-1 checkpoint as if the run had died after it: the same adapter, bit for bit
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000002")
    shutil.rmtree(resumed / "model")
    shutil.rmtree(resumed / "adapter")
    (resumed / "checkpoints" / "latest").write_text("step-000001")
    import dataclasses

    summary = VariedRewardGrpo(dataclasses.replace(config, output_dir=str(resumed))).train()
    assert summary["resumed_from"].endswith("step-000001")
    from safetensors.torch import load_file

    a = load_file(out / "adapter" / "adapter_model.safetensors")
    b = load_file(resumed / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and _digest(a) == _digest(b)
    step1 = load_file(checkpoint / "adapter_model.safetensors")
    assert _digest(step1) != _digest(a), "step 2 changed the adapter, so the resumed step was a real update"

    # `agentgym eval` runs the merged model unchanged
    assert main(["eval", "--suite", "games-calc", "--policy", f"hf:{out / 'model'}", "--limit", "2", "--out",
                 str(tmp_path / "eval"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["episodes"] == 2


def test_archer_loads_with_bfloat16_and_gradient_checkpointing(model_dir: Path, tmp_path: Path) -> None:
    from agentgym.trainers.archer import ArcherConfig, ArcherTrainer

    config = ArcherConfig(model=str(model_dir), suite="games-calc", output_dir=str(tmp_path), steps=1,
                          tasks_per_step=4, actor_warmup_steps=0, batch_size=4, eval_tasks=2, eval_every=0,
                          checkpoint_every=0, system_prompt="", max_tokens_per_turn=8, max_context_tokens=128,
                          tensorboard=False, actor_steps=1, critic_steps=1, dtype="bfloat16",
                          gradient_checkpointing=True)
    trainer = ArcherTrainer(config)
    summary = trainer.train()
    assert "eval_after" in summary
    assert trainer.model.dtype == torch.bfloat16 and is_checkpointing(trainer.model)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(torch.isfinite(torch.tensor(m["actor/loss"])) for m in metrics if "actor/loss" in m)


# ---- configuration ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "field", "hint"),
    [
        ({"load_in_4bit": True}, "load_in_4bit", "needs lora"),
        ({"load_in_4bit": True, "lora": {}}, "load_in_4bit", "CUDA GPU"),
        ({"attn_implementation": "flash_attention_2"}, "attn_implementation", "CUDA GPU"),
        ({"attn_implementation": "flash"}, "attn_implementation", "one of"),
        ({"dtype": "fp16"}, "dtype", "one of"),
        ({"lora": {"rank": 8}}, "lora", "unknown keys ['rank']"),
        ({"lora": {"r": 0}}, "lora", "lora.r"),
        ({"lora": {"dropout": 1.0}}, "lora", "lora.dropout"),
        ({"lora": {"target_modules": []}}, "lora", "target_modules"),
        ({"lora": {"alpha": -1}}, "lora", "lora.alpha"),
        ({"gradient_checkpointing": "yes"}, "gradient_checkpointing", "expected bool"),
    ],
)
def test_loading_fields_are_checked_with_the_fix(overrides: dict, field: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=f"GrpoConfig.{field}") as info:
        GrpoConfig(model="m", suite="games-calc", **overrides)
    assert hint in str(info.value)


def test_gpu_only_options_and_unsupported_combinations_fail_with_the_fix(tmp_path: Path) -> None:
    from agentgym.trainers.archer import ArcherConfig
    from agentgym.trainers.config import load_config

    from agentgym.trainers.arpo import ArpoConfig

    with pytest.raises(ConfigError, match="ArcherConfig.lora: LoRA is supported by the GRPO, GiGPO and ARPO"):
        ArcherConfig(model="m", suite="games-calc", lora={})
    assert ArpoConfig(model="m", suite="games-calc", lora={}).load_options().lora == {}  # ARPO trains LoRA as GRPO
    with pytest.raises(ConfigError, match="GrpoConfig.packing: .*flash_attention_2"):
        GrpoConfig(model="m", suite="games-calc", device="cuda", packing=True, attn_implementation="flash_attention_2")
    if not torch.cuda.is_available():  # a config written for a GPU fails before any rollout on a CPU machine
        for fields in ({"attn_implementation": "flash_attention_2"}, {"load_in_4bit": True, "lora": {}}):
            with pytest.raises(ConfigError, match="CUDA GPU"):
                GrpoConfig(model="m", suite="games-calc", device="cuda", **fields).check_runtime()
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nsuite: games-calc\ndtype: bfloat16\ngradient_checkpointing: true\n"
                    "lora: {r: 16, alpha: 32, target_modules: [q_proj, v_proj]}\n")
    config = load_config(path)
    assert config.lora == {"r": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"]}
    assert config.to_dict()["lora"]["target_modules"] == ["q_proj", "v_proj"]
