"""The GRPO trainer: updates change parameters with a finite loss, masks and G-RA act exactly as SimpleTIR,
Mini-o3 and G-RA (Sun et al., 2025) define them, a SIGKILLed run resumes to identical parameters, and (slow) a
tiny model really learns (data parallel: tests/trainers/test_data_parallel.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.trainers.batch import TrainingBatch, build_batch  # noqa: E402
from agentgym.trainers.config import GrpoConfig  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 100),
                            config=SMALL)


def small_config(model_dir: Path, out: Path, **overrides: object) -> GrpoConfig:
    values = dict(model=str(model_dir), suite="games-calc", output_dir=str(out), steps=2, tasks_per_step=2,
                  group_size=4, eval_tasks=4, eval_every=0, checkpoint_every=1, system_prompt="",
                  max_tokens_per_turn=12, max_context_tokens=128, tensorboard=False, micro_batch_size=3, seed=0)
    values.update(overrides)
    return GrpoConfig(**values)  # type: ignore[arg-type]


def _params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


# ---- the update -------------------------------------------------------------------------------------
def test_update_changes_parameters_with_finite_loss(model_dir: Path, tmp_path: Path) -> None:
    trainer = GrpoTrainer(small_config(model_dir, tmp_path))
    from agentgym.policies.hf import HFPolicy

    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.reference = None
    trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
    trajectories = trainer._sample(0)
    assert len(trajectories) == 8 and all(t.has_tokens for t in trajectories)
    advantages = torch.tensor([1.0, -1.0] * 4)
    batch = build_batch(trajectories, advantages, [True] * 8, pad_id=0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    stats = trainer._update(batch, optimizer, trainer._schedule(optimizer), 0)
    assert torch.isfinite(torch.tensor(stats["train/loss"])) and stats["train/tokens"] > 0
    assert stats["train/logprob_mismatch"] < 1e-4, "recomputed log-probs must match what the sampler recorded"
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before), f"unchanged: {set(before) - set(changed)}"


@pytest.mark.parametrize("packing", [False, True])
def test_micro_batch_size_does_not_change_the_update(model_dir: Path, tmp_path: Path, packing: bool) -> None:
    """Neither the micro-batch size nor packing changes the update (to float tolerance)."""
    digests = []
    for micro in (1, 3, 8):
        trainer = GrpoTrainer(small_config(model_dir, tmp_path / str(micro), micro_batch_size=micro,
                                           packing=packing and micro > 1))
        from agentgym.policies.hf import HFPolicy

        trainer.model, trainer.tokenizer = trainer._load(model_dir)
        trainer.reference = None
        trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
        trajectories = trainer._sample(0)
        batch = build_batch(trajectories, torch.tensor([1.0, -0.5, 0.25, -1.0] * 2), [True] * 8, pad_id=0)
        optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
        trainer._update(batch, optimizer, trainer._schedule(optimizer), 0)
        digests.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    assert torch.allclose(digests[0], digests[1], atol=1e-6) and torch.allclose(digests[0], digests[2], atol=1e-6)


@pytest.mark.parametrize("lengths", [[20, 18, 15], [20, 7, 5]])
def test_packing_runs_only_where_two_sequences_share_a_row(model_dir: Path, tmp_path: Path, lengths: list[int]) -> None:
    """With packing on, a micro-batch in which no two sequences fit one row is scored padded with no attention mask
    at all (the causal kernel); one where two do is packed, under its block-diagonal mask. Same log-probs either
    way."""
    from agentgym.trainers.batch import TrainingBatch, sequence_logprobs

    trainer = GrpoTrainer(small_config(model_dir, tmp_path, packing=True))
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    width = max(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(3, 200, mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    mb = TrainingBatch(ids, mask, mask.float(), torch.zeros(len(lengths)), torch.zeros(mask.shape))
    masks = []
    hook = trainer.model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True)
    try:
        with torch.no_grad():
            scored = trainer._forward_logprobs(trainer.model, mb)
    finally:
        hook.remove()
    shares = any(a + b <= width for i, a in enumerate(lengths) for b in lengths[i + 1:])
    assert (masks[-1] is not None and masks[-1].dim() == 4) if shares else masks[-1] is None
    with torch.no_grad():
        padded = sequence_logprobs(trainer.model, ids, mask)
    assert scored.shape == padded.shape and float((scored - padded).abs().max()) < 1e-5


def _trainer_and_batch(model_dir: Path, out: Path, **overrides: object) -> tuple[GrpoTrainer, TrainingBatch]:
    """A GRPO trainer on the tiny model (no reference) and one batch of its own rollouts with fixed advantages."""
    from agentgym.policies.hf import HFPolicy

    trainer = GrpoTrainer(small_config(model_dir, out, **overrides))
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.reference = None
    trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
    batch = build_batch(trainer._sample(0), torch.tensor([1.0, -0.5, 0.25, -1.0] * 2), [True] * 8, pad_id=0)
    return trainer, batch


def _update_watching_forwards(trainer: GrpoTrainer, batch: TrainingBatch) -> tuple[torch.Tensor, dict, list[bool]]:
    """One AdamW update: (the parameters after, its stats, whether grad was on in each log-prob forward)."""
    calls: list[bool] = []
    forward = trainer._forward_logprobs
    trainer._forward_logprobs = lambda model, mb: calls.append(torch.is_grad_enabled()) or forward(model, mb)
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    stats = trainer._update(batch, optimizer, trainer._schedule(optimizer), 0)
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()]), stats, calls


@pytest.mark.parametrize("packing", [False, True])
def test_one_step_update_reads_pi_old_off_its_own_forward(model_dir: Path, tmp_path: Path, packing: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One optimizer step on fresh samples skips the no-grad pass over the batch: the update, the loss and the
    log-prob mismatch are those of the separate pass (forced here by pretending the model has dropout)."""
    import agentgym.trainers.grpo as grpo_module

    results = []
    for separate in (False, True):
        if separate:
            monkeypatch.setattr(grpo_module, "same_in_train_and_eval", lambda model: False)
        trainer, batch = _trainer_and_batch(model_dir, tmp_path / str(separate), packing=packing)
        results.append(_update_watching_forwards(trainer, batch))
    (fused, fused_stats, fused_calls), (separate, separate_stats, separate_calls) = results
    assert not any(not grad for grad in fused_calls) and any(not grad for grad in separate_calls)  # no no-grad pass
    assert torch.allclose(fused, separate, atol=1e-6)
    assert fused_stats["train/loss"] == pytest.approx(separate_stats["train/loss"], abs=1e-6)
    assert fused_stats["train/logprob_mismatch"] == pytest.approx(separate_stats["train/logprob_mismatch"], abs=1e-5)
    assert fused_stats["train/logprob_mismatch"] < 1e-4


@pytest.mark.parametrize("shape", [dict(mini_batches=2), dict(mini_batches=1, ppo_epochs=2)])
def test_several_optimizer_steps_take_pi_old_from_a_sampler_that_matches(model_dir: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        shape: dict) -> None:
    """With several optimizer steps, the sampler's float32 log-probs are pi_old once the first mini-batch's own
    forward confirms them: no no-grad pass over the batch, and the same update as with that pass (forced here by a
    tolerance nothing meets)."""
    import agentgym.trainers.grpo as grpo_module

    results = []
    for forced in (False, True):
        if forced:
            monkeypatch.setattr(grpo_module, "SAMPLER_MEAN_GAP", -1.0)
        trainer, batch = _trainer_and_batch(model_dir, tmp_path / str(forced), micro_batch_size=2, **shape)
        results.append(_update_watching_forwards(trainer, batch))
    (taken, taken_stats, taken_calls), (recomputed, recomputed_stats, recomputed_calls) = results
    assert taken_stats["train/pi_old_from_sampler"] == 1.0 and all(taken_calls), "no no-grad pass"
    assert recomputed_stats["train/pi_old_from_sampler"] == 0.0
    assert sum(not grad for grad in recomputed_calls) == 4, "one no-grad pass over the 8 rows, 2 a micro-batch"
    assert torch.allclose(taken, recomputed, atol=1e-6)
    assert taken_stats["train/loss"] == pytest.approx(recomputed_stats["train/loss"], abs=1e-6)
    assert taken_stats["train/logprob_mismatch"] < 1e-4 and recomputed_stats["train/logprob_mismatch"] < 1e-4


def test_a_sampler_that_differs_from_the_model_gets_the_no_grad_pass(model_dir: Path, tmp_path: Path) -> None:
    """Sampler log-probs off by 0.05 on every token (as another engine's or precision's would be): the first
    mini-batch detects it, the batch is scored again before any optimizer step, and the update equals one whose
    sampler log-probs were exact (the ratio's pi_old is the model's, not the sampler's)."""
    results = []
    for offset in (0.0, 0.05):
        trainer, batch = _trainer_and_batch(model_dir, tmp_path / str(offset), micro_batch_size=2, mini_batches=2)
        batch.sampler_logprobs = batch.sampler_logprobs - offset * batch.loss_mask
        results.append(_update_watching_forwards(trainer, batch))
    (exact, exact_stats, _), (off, off_stats, _) = results
    assert exact_stats["train/pi_old_from_sampler"] == 1.0 and off_stats["train/pi_old_from_sampler"] == 0.0
    assert off_stats["train/logprob_mismatch"] == pytest.approx(0.05, abs=1e-3), "measured on the whole batch"
    assert torch.allclose(exact, off, atol=1e-6)


def test_dropout_keeps_the_separate_pass() -> None:
    from agentgym.trainers.grpo import same_in_train_and_eval

    assert same_in_train_and_eval(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
    assert not same_in_train_and_eval(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))


# ---- masks and rewards on constructed trajectories ----------------------------------------------------
def _traj(kinds: list[str], score: float, end_reason: str, group: str = "g", error: str | None = None) -> Trajectory:
    turns = tuple(Turn(observation="o", action="a", info={"kind": k, "calls": []}, prompt_token_ids=(1, 2),
                       action_token_ids=(3, 4, 5), action_logprobs=(-0.1, -0.2, -0.3)) for k in kinds)
    return Trajectory(env_id="agentgym/Calculator-v0", task_id="t", seed=0, turns=turns,
                      outcome={"success": score >= 1.0, "score": score, "end_reason": end_reason},
                      end_reason=end_reason, group_id=group, error=error)


CONSTRUCTED = [
    _traj(["tool_call", "answer"], 1.0, "answered"),            # clean success
    _traj(["void", "tool_call", "answer"], 0.0, "answered"),    # contains a void turn
    _traj(["tool_call", "tool_call"], 0.0, "max_turns"),        # over-turn: out of turns while calling tools
    _traj(["tool_call"], 0.0, "error", error="sandbox died"),   # infrastructure failure
]


@pytest.mark.parametrize(
    ("flags", "trained"),
    [
        ({}, [True, True, True, False]),
        ({"mask_void_turns": True}, [True, False, True, False]),
        ({"mask_over_turn": True}, [True, True, False, False]),
        ({"mask_void_turns": True, "mask_over_turn": True}, [True, False, False, False]),
    ],
)
def test_mask_switches_change_which_tokens_get_gradient(model_dir: Path, tmp_path: Path, flags: dict,
                                                        trained: list[bool]) -> None:
    trainer = GrpoTrainer(small_config(model_dir, tmp_path, **flags))
    scores = trainer._scores(CONSTRUCTED)
    sample, stats, counts = trainer._masks(CONSTRUCTED, scores)
    assert sample.tolist() == trained
    assert stats.tolist() == [True, True, True, False], "masked trajectories stay in group statistics by default"
    assert counts["train/errors"] == 1.0
    batch = build_batch(CONSTRUCTED, torch.ones(4), sample, pad_id=0)
    for row, keep in enumerate(trained):
        assert (batch.loss_mask[row].sum() > 0) == keep
        if keep:  # exactly the sampled action tokens, nothing else
            n_turns = len(CONSTRUCTED[row].turns)
            assert batch.loss_mask[row].sum() == 3 * n_turns
    # the gradient of any loss through the mask is exactly zero on masked rows
    logp = torch.zeros_like(batch.loss_mask, requires_grad=True)
    (logp * batch.loss_mask).sum().backward()
    for row, keep in enumerate(trained):
        assert bool(logp.grad[row].abs().sum() > 0) == keep


def test_excluding_masked_members_from_group_statistics(model_dir: Path, tmp_path: Path) -> None:
    trainer = GrpoTrainer(small_config(model_dir, tmp_path, mask_void_turns=True, exclude_masked_from_group_stats=True))
    _, stats, _ = trainer._masks(CONSTRUCTED, trainer._scores(CONSTRUCTED))
    assert stats.tolist() == [True, False, True, False]


def test_gra_and_dra_scores_follow_the_spec(model_dir: Path, tmp_path: Path) -> None:
    """G-RA (Sun et al., 2025): a trajectory that never submits earns its step rewards only without the gate."""
    farming = _traj(["tool_call", "tool_call", "tool_call"], 0.0, "max_turns")
    solved = _traj(["tool_call", "answer"], 1.0, "answered")
    gra = GrpoTrainer(small_config(model_dir, tmp_path, reward="gra", gra_threshold=0.5))
    dra = GrpoTrainer(small_config(model_dir, tmp_path, reward="dra"))
    out = GrpoTrainer(small_config(model_dir, tmp_path))
    assert gra._scores([farming, solved]).tolist() == pytest.approx([0.0, 1.05])
    assert dra._scores([farming, solved]).tolist() == pytest.approx([0.15, 1.05])
    assert out._scores([farming, solved]).tolist() == pytest.approx([0.0, 1.0])


def test_group_filter_drops_zero_variance_groups(model_dir: Path, tmp_path: Path) -> None:
    trajs = [_traj(["answer"], 1.0, "answered", group="a"), _traj(["answer"], 1.0, "answered", group="a"),
             _traj(["answer"], 1.0, "answered", group="b"), _traj(["answer"], 0.0, "answered", group="b")]
    trainer = GrpoTrainer(small_config(model_dir, tmp_path, group_filter_std=1e-3))
    sample, _, counts = trainer._masks(trajs, trainer._scores(trajs))
    assert sample.tolist() == [False, False, True, True] and counts["train/dropped_groups"] == 1.0


# ---- resume ------------------------------------------------------------------------------------------
def _train_cli(config: GrpoConfig, tmp: Path) -> subprocess.Popen[bytes]:
    path = tmp / f"config-{time.monotonic_ns()}.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"trainer": "grpo", **config.to_dict()}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "agentgym.cli", "train", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_resumed_run_still_reports_its_warm_start_and_evaluation_before_training(model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """A resumed run does not repeat the warm start or the first evaluation, but its summary must still carry them
    (the quickstart's table read ``eval_before`` and failed with a KeyError when run a second time)."""
    config = small_config(model_dir, tmp_path / "run", warmstart="bc", bc_steps=2, bc_demos=4)
    first = GrpoTrainer(config).train()
    again = GrpoTrainer(config).train()  # resumes the finished run from its last checkpoint: no step left
    assert again["resumed_from"].endswith("step-000002")
    assert again["eval_before"] == first["eval_before"] and again["bc"] == first["bc"]
    assert again["eval_after"]["episodes"] == first["eval_after"]["episodes"] == 4
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["eval_before"] == first["eval_before"]
    # a checkpoint from before checkpoints carried the summary: the finished run's summary.json stands in
    state_path = tmp_path / "run" / "checkpoints" / "step-000002" / "state.json"
    state = json.loads(state_path.read_text())
    del state["summary"]
    state_path.write_text(json.dumps(state))
    assert GrpoTrainer(config).train()["eval_before"] == first["eval_before"]


@pytest.mark.slow  # three training processes (minutes); test_lora and test_fsdp check exact resumes by default
def test_sigkilled_run_resumes_to_identical_parameters(model_dir: Path, tmp_path: Path) -> None:
    straight = small_config(model_dir, tmp_path / "straight", steps=4, warmstart="bc", bc_steps=20, bc_demos=16,
                            bc_shortcut_fraction=0.5, group_size=4)
    proc = _train_cli(straight, tmp_path)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]

    killed = dataclasses.replace(straight, output_dir=str(tmp_path / "killed"))
    proc = _train_cli(killed, tmp_path)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and not (latest.is_file() and latest.read_text().strip() >= "step-000002"):
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest.read_text().strip() in ("step-000002", "step-000003")
    proc = _train_cli(killed, tmp_path)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]

    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / "model")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "killed" / "model")
    assert _params_digest(a) == _params_digest(b)
    resumed = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert "resumed_from" in resumed
    # the trained model records how it was prompted, so `agentgym eval --policy hf:DIR` prompts it the same way
    from agentgym.policies.rollout_defaults import load_rollout_defaults

    assert load_rollout_defaults(tmp_path / "killed" / "model") == {"system_prompt": "", "max_tokens": 12,
                                                                      "suite": "games-calc"}


# ---- learning ----------------------------------------------------------------------------------------
@pytest.mark.slow  # about 10 minutes on 2 cores; `make quickstart` runs the full recipe
def test_tiny_model_learns_from_bc_warm_start_with_grpo(tmp_path: Path) -> None:
    """A smaller budget of the quickstart recipe: held-out success must rise by at least 20 points."""
    model = build_tiny_model(tmp_path / "model", texts=demonstration_texts("games-calc", 300))
    config = GrpoConfig(model=str(model), suite="games-calc", output_dir=str(tmp_path / "run"), system_prompt="",
                        warmstart="bc", bc_demos=200, bc_shortcut_fraction=0.5, bc_steps=500, steps=12,
                        tasks_per_step=16, group_size=8, learning_rate=3e-4, warmup_steps=5, max_tokens_per_turn=24,
                        max_context_tokens=256, eval_every=0, eval_tasks=60, checkpoint_every=0, tensorboard=False)
    summary = GrpoTrainer(config).train()
    before, after = summary["eval_before"]["success_rate"], summary["eval_after"]["success_rate"]
    assert after - before >= 0.2, (before, after)
    assert (tmp_path / "run" / "learning_curve.png").is_file()


@pytest.mark.gpu
def test_grpo_with_vllm_generation_syncs_weights(model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    config = small_config(model_dir, tmp_path, device="cuda", generation_backend="vllm", steps=2)
    summary = GrpoTrainer(config).train()
    assert "eval_after" in summary
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # vLLM samples with the synced weights: its log-probs match the trainer's recomputation closely
    mismatches = [m["train/logprob_mismatch"] for m in metrics if "train/logprob_mismatch" in m]
    assert mismatches and max(mismatches) < 0.05


def test_success_scores_make_trying_worth_more_than_leaving_the_page(model_dir: Path, tmp_path: Path) -> None:
    """MiniWoB scores a wrong click -1 and an untouched page 0: under the outcome score the group ranks doing nothing
    above trying, which collapsed the tiny VLM to empty replies; ``reward: success`` scores both 0 and a success 1."""
    wrong = _traj(["tool_call"], -1.0, "failed")
    idle = _traj(["void", "void"], 0.0, "max_turns")
    solved = _traj(["tool_call"], 1.0, "solved")
    outcome = GrpoTrainer(small_config(model_dir, tmp_path))
    success = GrpoTrainer(small_config(model_dir, tmp_path, reward="success"))
    assert outcome._scores([wrong, idle, solved]).tolist() == pytest.approx([-1.0, 0.0, 1.0])
    assert success._scores([wrong, idle, solved]).tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_micro_batches_group_rows_of_like_length_and_give_every_row_its_own_values() -> None:
    """The update scores rows longest first (far less padding per micro-batch) and hands each row's values back
    in the batch's order: a row's log-probs are its own whatever micro-batch it lands in."""
    import torch

    from agentgym.trainers.batch import TrainingBatch
    from agentgym.trainers.grpo import _no_grad_logprobs, longest_first

    lengths = [3, 9, 1, 9, 5, 2, 7]
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.arange(1, length + 1) + 100 * row
        attention[row, :length] = 1
    zeros = torch.zeros((len(lengths), width))
    batch = TrainingBatch(ids, attention, zeros, zeros.clone(), zeros.clone())
    assert longest_first(batch, torch.arange(len(lengths))).tolist() == [1, 3, 6, 4, 0, 5, 2]  # ties keep order
    assert longest_first(batch, torch.tensor([0, 2, 4])).tolist() == [4, 0, 2]
    seen_widths = []

    def fake_logprobs(model: object, mb: TrainingBatch) -> torch.Tensor:
        seen_widths.append(int(mb.input_ids.shape[1]))
        return mb.input_ids.float()  # a value that names its row and position

    out = _no_grad_logprobs(fake_logprobs, None, batch, micro_batch_size=3, width=width)
    assert torch.equal(out, ids.float())
    assert seen_widths == [9, 5, 1]  # [9, 9, 7], [5, 3, 2], [1]: trajectory order would pad to 9, 9, 7
    assert _no_grad_logprobs(fake_logprobs, None, batch.select(torch.tensor([], dtype=torch.long)), 3, width).shape \
        == (0, width)
