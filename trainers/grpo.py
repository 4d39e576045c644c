"""GRPO for multi-turn agents: collect groups of rollouts, score, mask, compute group advantages, update.

Reads top to bottom in execution order (``GrpoTrainer.train``): load or resume, optional behaviour-cloning
warm start, held-out evaluation, then for each step: rollouts through the engine (deterministic mode, so a
run and its resume are reproducible), trajectory scores (outcome, D-RA or G-RA), sample masks (errors,
SimpleTIR void turns, Mini-o3 over-turns, group filtering), group advantages, and a clipped policy-gradient
update with exact global token denominators, micro-batching and gradient clipping. Every function of
the math lives in :mod:`agentgym.trainers.algorithms`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from agentgym.policies import SamplingParams
from agentgym.progress import track
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.suite import Task
from agentgym.trainers import algorithms as alg
from agentgym.trainers.batch import TrainingBatch, build_batch, sequence_logprobs
from agentgym.trainers.bc import behaviour_clone, collect_demonstrations
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.config import GrpoConfig
from agentgym.trainers.distributed import World, init_world
from agentgym.trainers.metrics import MetricsLogger, plot_learning_curve
from agentgym.trainers.packing import pack_sequences, packed_inputs, packed_sequence_logprobs, unpack_logprobs
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["GrpoTrainer"]

logger = logging.getLogger(__name__)


class GrpoTrainer:
    """``GrpoTrainer(config).train()``; see the module docstring for the order of work.

    Everything that can be checked without a rollout is checked here, so a bad config fails at once.
    """

    def __init__(self, config: GrpoConfig, *, world: World | None = None) -> None:
        self.config = config
        self.world = world or init_world(config.device)
        self.suite, self.eval_suite = config.load_suites()
        self.model_dir = config.check_model_dir("model")  # a local directory, or a Hub id's cached snapshot
        if config.reference_model and config.reference_model != "initial":
            config.check_model_dir("reference_model")
        config.check_runtime()
        self.output_dir = Path(config.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.train_tasks = self.suite.split(config.train_split)
        self.eval_tasks = self.eval_suite.split(config.eval_split)[: config.eval_tasks]

    # ---- setup -------------------------------------------------------------------------------------
    def _load(self, path: str | Path, *, trainable: bool = True) -> tuple[Any, Any]:
        """The model at ``path`` as the config's loading fields say; a LoRA checkpoint (``adapter_config.json``,
        no full weights) is the base model plus its saved adapter."""
        from agentgym.models.loading import load_model

        options = self.config.load_options()
        if trainable and (Path(path) / "adapter_config.json").is_file():
            return load_model(self.model_dir, options, adapter_dir=path)
        return load_model(path, options, trainable=trainable)

    def _schedule(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        warmup = self.config.warmup_steps
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    def _log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.world.is_main:
            self.metrics.log(step, metrics)
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()
                     if k in ("train/success_rate", "eval/success_rate", "train/loss", "bc/loss", "time/step_s",
                              "train/errors")}  # errored episodes are dropped from the update: show how many
            logger.info("step %d %s", step, shown)

    # ---- the run -----------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run (or resume) training; returns the summary also written to ``summary.json``."""
        cfg = self.config
        torch.manual_seed(cfg.seed)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLogger.from_config(self.output_dir, cfg, main=self.world.is_main)
        resume_from = latest_checkpoint(self.checkpoint_dir)
        model, tokenizer = self._load(resume_from / "model" if resume_from else cfg.model)
        self.model, self.tokenizer = model, tokenizer
        summary: dict[str, Any] = {"config": cfg.to_dict()}
        if resume_from is None and self.world.is_main:
            (self.output_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")

        if resume_from is None and cfg.warmstart == "bc":
            demos = collect_demonstrations(self.suite, cfg.train_split, cfg.bc_demos, tokenizer,
                                           shortcut_fraction=cfg.bc_shortcut_fraction, seed=cfg.seed,
                                           system_prompt=cfg.system_prompt)
            summary["bc"] = behaviour_clone(model, tokenizer, demos, steps=cfg.bc_steps, learning_rate=cfg.bc_learning_rate,
                                            batch_size=cfg.bc_batch_size, seed=cfg.seed, device=cfg.device,
                                            log=lambda s, m: self.world.is_main and self.metrics.log(
                                                0, {**m, "bc/step": s}))
            self.world.broadcast_parameters(model)

        trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
        optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        scheduler = self._schedule(optimizer)
        start_step = 0
        if resume_from is not None:
            state = load_checkpoint(resume_from, optimizer, scheduler)
            start_step = int(state["step"])
            summary["resumed_from"] = str(resume_from)
        self.reference = self._reference_model(model)
        self.policy = self._generation_policy(resume_from / "model" if resume_from and not cfg.lora else self.model_dir)

        if start_step == 0:
            summary["eval_before"] = self._evaluate(0)
        for step in track(range(start_step, cfg.steps), f"{cfg.trainer_name} steps", completed=start_step, unit="step",
                          enabled=cfg.progress if self.world.is_main else False):
            self._train_step(step, optimizer, scheduler)
            done = step + 1
            if cfg.eval_every and done % cfg.eval_every == 0 and done != cfg.steps:
                self._evaluate(done)
            if self.world.is_main and cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
                save_checkpoint(self.checkpoint_dir, done, model, tokenizer, optimizer, scheduler,
                                {"data_cursor": done * cfg.tasks_per_step}, cfg.keep_checkpoints, self._save_defaults)
            self.world.barrier()
        summary["eval_after"] = self._evaluate(cfg.steps)
        if self.world.is_main:
            from agentgym.models.loading import save_trained_model

            # LoRA: model/ is the merged model (loads like any model directory) and adapter/ the adapter alone
            final = save_trained_model(model, tokenizer, self.output_dir, base=self.model_dir,
                                       options=cfg.load_options())
            self._save_defaults(final)
            if (self.output_dir / "adapter").is_dir() and cfg.lora is not None:
                self._save_defaults(self.output_dir / "adapter")
            save_checkpoint(self.checkpoint_dir, cfg.steps, model, tokenizer, optimizer, scheduler,
                            {"data_cursor": cfg.steps * cfg.tasks_per_step}, cfg.keep_checkpoints, self._save_defaults)
            plot_learning_curve(self.metrics.path, self.output_dir / "learning_curve.png")
            (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        self.metrics.close()
        return summary

    def _generation_policy(self, model_dir: Path) -> Any:
        """HF: sample from the training model itself (always current). vLLM: a separate engine, synced now."""
        cfg = self.config
        if cfg.generation_backend == "vllm":
            from agentgym.policies.vllm import VLLMPolicy

            policy = VLLMPolicy(str(model_dir), tokenizer=self.tokenizer, max_batch_size=cfg.max_in_flight,
                                seed=cfg.seed, name="grpo")
            policy.load_weights(self._sync_weights())  # the BC warm start may have changed them
            return policy
        from agentgym.policies.hf import HFPolicy

        return HFPolicy(self.model, self.tokenizer, device=cfg.device, max_batch_size=cfg.max_in_flight, name="grpo")

    def _sync_weights(self) -> Any:
        """What vLLM loads after an update: the model itself, or with LoRA the base with the adapters merged in."""
        from agentgym.models.loading import is_peft_model, merged_state_dict

        return merged_state_dict(self.model) if is_peft_model(self.model) else self.model

    def _save_defaults(self, model_dir: Path) -> None:
        """Write the rollout settings next to the weights, so `agentgym eval` prompts the model as in training."""
        from agentgym.policies.rollout_defaults import save_rollout_defaults

        save_rollout_defaults(model_dir, system_prompt=self.config.system_prompt,
                              max_tokens=self.config.max_tokens_per_turn, suite=self.config.suite)

    def _reference_model(self, model: Any) -> Any:
        """The frozen KL reference. With LoRA and no BC warm start, ``initial`` is the training model with its
        adapters disabled (the untouched base), so no second copy of the weights is held; after a BC warm start
        the initial policy includes the BC-trained adapters, so it is a copy as without LoRA."""
        from agentgym.models.loading import is_peft_model

        cfg = self.config
        self._reference_is_base = False
        if cfg.kl_coef == 0:
            return None
        if cfg.reference_model == "initial" and is_peft_model(model) and cfg.warmstart == "none":
            self._reference_is_base = True
            return model
        if cfg.reference_model == "initial":
            reference = copy.deepcopy(model)
        else:
            reference = self._load(self.config.check_model_dir("reference_model"), trainable=False)[0]
        reference.eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        return reference

    # ---- one step ----------------------------------------------------------------------------------
    def _tasks_for_step(self, step: int) -> list[Task]:
        """The data cursor: a seeded permutation of the train split per epoch over it, read in order."""
        cfg = self.config
        n = len(self.train_tasks)
        chosen = []
        for k in range(step * cfg.tasks_per_step, (step + 1) * cfg.tasks_per_step):
            epoch, offset = divmod(k, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(cfg.seed, epoch)))
            chosen.append(self.train_tasks[int(order[offset])])
        return chosen

    def _rollout_plan(self, step: int) -> tuple[list[EpisodeSpec], SamplingParams]:
        """This rank's episode specs (``group_size`` per task; whole groups are sharded) and sampling."""
        cfg = self.config
        groups = self.world.shard(list(enumerate(self._tasks_for_step(step))))
        specs = [EpisodeSpec(self.suite.env_id, task=task, seed=mix_seed(cfg.seed, step, k, g) % (2**31),
                             group_id=f"{step}/{k}", env_kwargs=dict(self.suite.env_kwargs))
                 for k, task in groups for g in range(cfg.group_size)]
        sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, top_p=cfg.top_p,
                                  seed=mix_seed(cfg.seed, step, self.world.rank))
        return specs, sampling

    def _rollout(self, step: int) -> list[Trajectory]:
        """G independent rollouts for each of this step's tasks."""
        specs, sampling = self._rollout_plan(step)
        engine = RolloutEngine(self.policy, self._rollout_config(sampling, self.config.max_in_flight))
        return engine.run(specs)

    def _rollout_config(self, sampling: SamplingParams, in_flight: int) -> RolloutConfig:
        return RolloutConfig(max_in_flight=in_flight, sampling=sampling, system_prompt=self.config.system_prompt,
                             max_context_tokens=self.config.max_context_tokens, deterministic=True)

    def _scores(self, trajectories: list[Trajectory]) -> torch.Tensor:
        cfg = self.config
        if cfg.reward == "outcome":
            return torch.tensor([t.score for t in trajectories], dtype=torch.float32)
        scores = []
        for t in trajectories:
            steps = torch.tensor([cfg.step_rewards.get(turn.kind, 0.0) for turn in t.turns] or [0.0])
            if cfg.reward == "gra":
                total, _ = alg.gated_reward_accumulation([t.score, steps], [cfg.gra_threshold], cmp=cfg.gra_cmp)
            else:
                total, _ = alg.direct_reward_accumulation([t.score, steps])
            scores.append(float(total))
        return torch.tensor(scores, dtype=torch.float32)

    def _masks(self, trajectories: list[Trajectory], scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(sample_mask, stats_mask, counts): which trajectories train, which count in group statistics."""
        cfg = self.config
        healthy = torch.tensor([t.error is None and t.end_reason != "error" and t.has_tokens for t in trajectories])
        sample = healthy.clone()
        void = alg.void_trajectory_mask([[turn.kind for turn in t.turns] for t in trajectories],
                                        void_kinds=cfg.void_turn_kinds)
        over = alg.over_turn_mask([t.end_reason for t in trajectories],
                                  last_turn_kinds=[t.turns[-1].kind if t.turns else None for t in trajectories])
        if cfg.mask_void_turns:
            sample &= void
        if cfg.mask_over_turn:
            sample &= over
        stats = healthy & sample if cfg.exclude_masked_from_group_stats else healthy
        group_ids = [t.group_id for t in trajectories]
        if cfg.group_filter_std is not None:
            keep = alg.group_filter(scores, group_ids, std_threshold=cfg.group_filter_std,
                                    member_mask=over if cfg.mask_over_turn else None, sample_mask=sample)
            sample &= keep
        groups = {}
        for gid, s in zip(group_ids, sample.tolist()):
            groups[gid] = groups.get(gid, False) or s
        counts = {
            "train/errors": float((~healthy).sum()),
            "train/void_rate": float((~void).float().mean()),
            "train/over_turn_rate": float((~over).float().mean()),
            "train/masked_rate": float((~sample).float().mean()),
            "train/dropped_groups": float(sum(not v for v in groups.values())),
        }
        return sample, stats, counts

    def _train_step(self, step: int, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        cfg = self.config
        t0 = time.perf_counter()
        trajectories = self._rollout(step)
        t_rollout = time.perf_counter() - t0
        scores = self._scores(trajectories)
        sample_mask, stats_mask, counts = self._masks(trajectories, scores)
        advantages = alg.group_advantages(scores, [t.group_id for t in trajectories], mode=cfg.advantage,
                                          singleton=cfg.singleton_advantage, stats_mask=stats_mask)
        usable = [i for i, t in enumerate(trajectories) if t.has_tokens]
        batch = build_batch([trajectories[i] for i in usable], advantages[usable], sample_mask[usable],
                            pad_id=int(self.tokenizer.pad_token_id or 0))
        batch = self._attribute(batch, [trajectories[i] for i in usable])
        update = self._update(batch, optimizer, scheduler, step)
        if cfg.generation_backend == "vllm":
            self.policy.load_weights(self._sync_weights())
        summary = summarize(trajectories)
        self._log(step + 1, {
            "train/success_rate": summary.get("success_rate", 0.0),
            "train/score_mean": float(scores.mean()) if len(scores) else 0.0,
            "train/mean_turns": summary.get("mean_turns", 0.0),
            "train/mean_tool_calls": summary.get("mean_tool_calls", 0.0),
            "train/episodes": float(len(trajectories)),
            **counts, **update, **self._rollout_metrics(trajectories),
            "time/rollout_s": t_rollout, "time/step_s": time.perf_counter() - t0,
            "lr": scheduler.get_last_lr()[0],
        })

    def _attribute(self, batch: TrainingBatch, trajectories: list[Trajectory]) -> TrainingBatch:
        """How advantages reach tokens; GRPO broadcasts each trajectory's scalar (ARPO may override)."""
        return batch

    def _rollout_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Extra per-step metrics of the rollout (ARPO: branching statistics)."""
        return {}

    def _forward_logprobs(self, model: Any, mb: TrainingBatch) -> torch.Tensor:
        """``[n, L]`` per-token log-probs of a micro-batch, padded or packed (identical values)."""
        cfg = self.config
        if not cfg.packing:
            return sequence_logprobs(model, mb.input_ids.to(cfg.device), mb.attention_mask.to(cfg.device), cfg.temperature)
        width = int(mb.input_ids.shape[1])
        bins = pack_sequences(mb.attention_mask.sum(dim=1).tolist(), max_tokens=width)
        inputs = {k: v.to(cfg.device) if isinstance(v, torch.Tensor) else v for k, v in packed_inputs(mb, bins).items()}
        packed = packed_sequence_logprobs(model, inputs, cfg.temperature)
        return unpack_logprobs(packed, inputs, len(mb), width)

    def _update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, scheduler: Any, step: int) -> dict[str, float]:
        cfg = self.config
        model = self.model
        t0 = time.perf_counter()
        if len(batch) == 0:
            return {"train/tokens": self.world.sum(0.0), "train/skipped_update": 1.0}
        with torch.no_grad():
            model.eval()
            width = int(batch.input_ids.shape[1])
            batch.old_logprobs = torch.cat([_pad_to(self._forward_logprobs(model, mb).cpu(), width)
                                            for mb in batch.micro_batches(cfg.micro_batch_size)])
            if self.reference is not None:
                with self._reference_context():
                    batch.ref_logprobs = torch.cat([_pad_to(self._forward_logprobs(self.reference, mb).cpu(), width)
                                                    for mb in batch.micro_batches(cfg.micro_batch_size)])
        mask = batch.loss_mask
        trained_tokens = self.world.sum(float(mask.sum()))
        mismatch = float(((batch.old_logprobs - batch.sampler_logprobs).abs() * mask).sum() / max(mask.sum().item(), 1.0))
        stats: dict[str, float] = {"train/tokens": trained_tokens, "train/logprob_mismatch": mismatch}
        if trained_tokens == 0:
            stats["train/skipped_update"] = 1.0
            return stats
        model.train()
        losses, clip_fracs, kls, norms = [], [], [], []
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(mix_seed(cfg.seed, step, epoch)))
            for chunk in order.chunk(cfg.mini_batches):
                mini = batch.select(chunk.sort().values)
                tokens, seqs = alg.loss_denominators(mini.loss_mask)
                tokens, seqs = self.world.sum(tokens), self.world.sum(seqs)
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for mb in mini.micro_batches(cfg.micro_batch_size):
                    logp = self._forward_logprobs(model, mb)
                    m = mb.loss_mask.to(logp.device)
                    per_token, metrics = alg.clipped_policy_loss(
                        logp, mb.old_logprobs.to(logp.device), mb.advantages.to(logp.device), eps_low=cfg.clip_eps_low,
                        eps_high=cfg.clip_eps_high, dual_clip_c=cfg.dual_clip_c, loss_mask=m)
                    agg = dict(mode=cfg.loss_agg, global_token_count=max(tokens, 1.0), global_seq_count=max(seqs, 1.0),
                               max_len_norm=cfg.max_context_tokens or int(batch.input_ids.shape[1]))
                    loss = alg.aggregate_loss(per_token, m, **agg)
                    if self.reference is not None:
                        kl = alg.kl_penalty(logp, mb.ref_logprobs.to(logp.device), estimator=cfg.kl_estimator)
                        kl_loss = alg.aggregate_loss(kl, m, **agg)
                        loss = loss + cfg.kl_coef * kl_loss
                        kls.append(float(kl_loss.detach()))
                    loss.backward()
                    total += float(loss.detach())
                    clip_fracs.append(float(metrics["clip_frac"]))
                self.world.sum_gradients([p for p in model.parameters() if p.requires_grad])
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
                norms.append(float(norm))
                optimizer.step()
                scheduler.step()
                losses.append(total)
        model.eval()
        stats.update({"train/loss": sum(losses) / len(losses), "train/clip_frac": sum(clip_fracs) / max(len(clip_fracs), 1),
                      "train/grad_norm": sum(norms) / len(norms), "time/update_s": time.perf_counter() - t0})
        if kls:
            stats["train/kl"] = sum(kls) / len(kls)
        return stats

    def _reference_context(self) -> Any:
        """Disables the LoRA adapters while the reference is the base under them; otherwise does nothing."""
        if getattr(self, "_reference_is_base", False):
            return self.reference.disable_adapter()
        return contextlib.nullcontext()

    # ---- evaluation --------------------------------------------------------------------------------
    def _evaluate(self, step: int) -> dict[str, Any]:
        """Held-out success with the current weights (rank 0; other ranks wait)."""
        cfg = self.config
        result: dict[str, Any] = {}
        if self.world.is_main:
            sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.eval_temperature,
                                      seed=mix_seed(cfg.seed, 999))
            specs = [EpisodeSpec(self.eval_suite.env_id, task=t, seed=i, env_kwargs=dict(self.eval_suite.env_kwargs))
                     for i, t in enumerate(self.eval_tasks)]
            started = time.perf_counter()
            trajectories = RolloutEngine(self.policy, self._rollout_config(sampling, cfg.max_in_flight)).run(specs)
            result = summarize(trajectories)
            result["wall_s"] = time.perf_counter() - started
            self._log(step, {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))})
        self.world.barrier()
        return result


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad ``[n, w]`` to ``[n, width]`` with zeros (micro-batches are trimmed to their own width)."""
    if t.shape[1] == width:
        return t
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))
