"""GRPO for multi-turn agents, and the clipped policy-gradient update GiGPO and ARPO share.

``GrpoTrainer`` is the one online loop (:class:`~agentgym.trainers.loop.OnlineTrainer`: sample, learn, evaluate,
checkpoint) with this :meth:`~GrpoTrainer._learn`, in execution order: trajectory scores (outcome, D-RA or G-RA),
sample masks (errors, SimpleTIR void turns, Mini-o3 over-turns, group filtering), **per-token** ``[N, L]``
advantages (:meth:`~GrpoTrainer._token_advantages`: GRPO broadcasts each trajectory's group advantage; GiGPO puts
each step's own advantage on its tokens; ARPO's hard attribution averages shared prefixes), then a clipped
policy-gradient update with exact global token denominators, micro-batching (padded or packed), an optional KL
term and gradient clipping. Every episode samples from its own seed, so a run and its resume are identical.
Every function of the math lives in :mod:`agentgym.trainers.algorithms`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.trainers import algorithms as alg
from agentgym.trainers.batch import TrainingBatch, build_batch, per_row, sequence_logprobs, vision_inputs
from agentgym.trainers.grpo_config import GrpoConfig
from agentgym.trainers.distributed import ForwardWith, World, data_parallel
from agentgym.trainers.loop import OnlineTrainer
from agentgym.trainers.returns import episode_return
from agentgym.trainers.packing import pack_sequences, packed_inputs, packed_sequence_logprobs, unpack_logprobs
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["GrpoTrainer", "ZeroSignal", "trained_episodes", "trained_steps", "zero_signal_groups"]

logger = logging.getLogger(__name__)


class GrpoTrainer(OnlineTrainer):
    """``GrpoTrainer(config).train()``; see the module docstring for the order of work."""

    config: GrpoConfig
    supports_distributed = True
    supports_fsdp = True

    def __init__(self, config: GrpoConfig, *, world: World | None = None) -> None:
        super().__init__(config, world=world)
        if config.reference_model and config.reference_model != "initial":
            config.check_model_dir("reference_model")

    def _setup(self, resume_from: Path | None) -> None:
        if not self.sharding.is_sharded(self.model):  # with FSDP, _parallelize built it before sharding the policy
            self.reference = self._reference_model(self.model)

    def _parallelize(self) -> None:
        """FSDP: shard the policy inside the module the update runs through (:meth:`_trained_module`), and the KL
        reference, built first since a copy of the policy needs its full weights."""
        if not self.sharding.active:
            return
        self.reference = self._reference_model(self.model)
        with torch.no_grad():  # a model's first log-prob pass checks its backbone + head split with an extra forward:
            for model in {id(m): m for m in (self.model, self.reference) if m is not None}.values():  # now, not
                self._forward_logprobs(model, _placeholder(int(self.tokenizer.pad_token_id or 0)))  # on one rank
        self._trained = (self.model, self.sharding.shard(self.model, ForwardWith(self.model, self._forward_logprobs)))
        if self.reference is not None and self.reference is not self.model:
            self.sharding.shard(self.reference)

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

    # ---- scores and masks ---------------------------------------------------------------------------
    def _scores(self, trajectories: list[Trajectory]) -> torch.Tensor:
        cfg = self.config
        if cfg.reward in ("outcome", "rubric"):  # a rubric's score is the outcome score once the judge has run
            return torch.tensor([episode_return(t) for t in trajectories], dtype=torch.float32)
        if cfg.reward == "success":
            return torch.tensor([float(t.success) for t in trajectories], dtype=torch.float32)
        scores = []
        for t in trajectories:
            steps = torch.tensor([cfg.step_rewards.get(turn.kind, 0.0) for turn in t.turns] or [0.0])
            if cfg.reward == "gra":
                total, _ = alg.gated_reward_accumulation([episode_return(t), steps], [cfg.gra_threshold], cmp=cfg.gra_cmp)
            else:
                total, _ = alg.direct_reward_accumulation([episode_return(t), steps])
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

    # ---- one step: estimate, then update ------------------------------------------------------------
    def _learn(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        scores = self._scores(trajectories)
        sample_mask, stats_mask, counts = self._masks(trajectories, scores)
        usable = [i for i, t in enumerate(trajectories) if t.has_tokens]
        kept = [trajectories[i] for i in usable]
        batch = build_batch(kept, torch.zeros(len(kept)), sample_mask[usable], pad_id=int(self.tokenizer.pad_token_id or 0))
        self._control_step = step  # seeds advantage_control: shuffle (a resumed run deals the same permutation)
        batch.advantages, estimate = self._token_advantages(trajectories, scores, stats_mask, usable, batch)
        batch = self._attribute(batch, kept)
        # saved rollouts' token data: the batch's rows belong to trajectories usable[batch.episode_index]
        self._learned_batch = (usable, batch) if self.config.save_rollouts else None
        signal = self._zero_signal(step, kept, batch)
        update = self._update(batch, self.optimizer, self.scheduler, step)
        return {"train/score_mean": float(scores.mean()) if len(scores) else 0.0, **counts, **estimate, **signal,
                **update, **self._rollout_metrics(trajectories)}

    def _zero_signal(self, step: int, trajectories: list[Trajectory], batch: TrainingBatch) -> dict[str, float]:
        """``train/zero_signal_groups``: the share of this step's groups whose advantages are all zero, so no
        token of theirs moves the policy; warns once per run when most groups carry no signal, with why and what
        to do."""
        zero = zero_signal_groups(per_row(batch, [t.group_id for t in trajectories]), batch.advantages,
                                  batch.loss_mask, per_row(batch, [bool(t.success) for t in trajectories]))
        if zero.share > 0.5 and not getattr(self, "_warned_zero_signal", False) and self.world.is_main:
            self._warned_zero_signal = True
            why = (f"{zero.all_fail} all fail, {zero.all_succeed} all succeed, {zero.other} score alike otherwise"
                   if zero.groups else "no group")
            logger.warning("step %d: %d of %d groups carry no learning signal (%s: group advantages compare rollouts "
                           "of one task, so equal outcomes give zero); try a warm start (warmstart: bc), a larger "
                           "group_size, or easier tasks", step + 1, zero.zero, zero.groups, why)
        return {"train/zero_signal_groups": zero.share}

    def _token_advantages(self, trajectories: list[Trajectory], scores: torch.Tensor, stats_mask: torch.Tensor,
                          usable: list[int], batch: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """``[N, L]`` advantages of the batch rows (trajectories ``usable``): GRPO's group advantage of each
        trajectory on all its tokens (all its segments' rows). GiGPO overrides this with per-step values."""
        episodes = self._episode_advantages(trajectories, scores, stats_mask, usable)
        if self.config.advantage_control == "shuffle":
            episodes = alg.shuffle_advantages(episodes, trained_episodes(batch, len(usable)), self._control_generator())
        return self._episode_rows(episodes, batch), {}

    def _episode_advantages(self, trajectories: list[Trajectory], scores: torch.Tensor, stats_mask: torch.Tensor,
                            usable: list[int]) -> torch.Tensor:
        """``[len(usable)]`` the ``advantage`` estimator's group advantage of each usable trajectory."""
        advantages = alg.group_advantages(scores, [t.group_id for t in trajectories], mode=self.config.advantage,
                                          singleton=self.config.singleton_advantage, stats_mask=stats_mask)
        return advantages[usable] if usable else torch.zeros(0)

    @staticmethod
    def _episode_rows(episodes: torch.Tensor, batch: TrainingBatch) -> torch.Tensor:
        """``[N, L]``: each episode's advantage on every token of its rows (a segmented episode's rows share it)."""
        rows = episodes
        if batch.episode_index is not None and len(rows):
            rows = rows[batch.episode_index]
        return rows[:, None].expand(-1, batch.input_ids.shape[1]).clone()

    def _control_generator(self) -> torch.Generator:
        """The shuffled control's generator for this step: the run's seed and the step, so the same config deals
        the same permutations, after a resume too."""
        return torch.Generator().manual_seed(mix_seed(self.config.seed, getattr(self, "_control_step", 0), 0x5F))

    def _attribute(self, batch: TrainingBatch, trajectories: list[Trajectory]) -> TrainingBatch:
        """How advantages reach tokens; GRPO broadcasts each trajectory's scalar (ARPO may override)."""
        return batch

    def _rollout_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Extra per-step metrics of the rollout (ARPO: branching statistics)."""
        return {}

    def _forward_logprobs(self, model: Any, mb: TrainingBatch) -> torch.Tensor:
        """``[n, L]`` per-token log-probs of a micro-batch, padded or packed (identical values), in the run's
        precision (:meth:`_forward_precision`)."""
        with self._forward_precision():
            return self._forward_logprobs_as_is(model, mb)

    def _forward_logprobs_as_is(self, model: Any, mb: TrainingBatch) -> torch.Tensor:
        cfg = self.config
        if mb.images is not None:  # a VLM's images, merged row by row: scored padded (packing would reorder them)
            vision = vision_inputs(mb, self._processor(), cfg.device, next(model.parameters()).dtype)
            return sequence_logprobs(model, mb.input_ids.to(cfg.device), mb.attention_mask.to(cfg.device),
                                     cfg.temperature, vision=vision)
        width = int(mb.input_ids.shape[1])
        bins = pack_sequences(mb.attention_mask.sum(dim=1).tolist(), max_tokens=width) if cfg.packing else []
        if all(len(b) == 1 for b in bins):  # no row would hold two sequences: the packed mask would only add cost
            return sequence_logprobs(model, mb.input_ids.to(cfg.device), mb.attention_mask.to(cfg.device), cfg.temperature)
        inputs = {k: v.to(cfg.device) if isinstance(v, torch.Tensor) else v for k, v in packed_inputs(mb, bins).items()}
        packed = packed_sequence_logprobs(model, inputs, cfg.temperature)
        return unpack_logprobs(packed, inputs, len(mb), width)

    def _update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, scheduler: Any, step: int) -> dict[str, float]:
        """The clipped policy-gradient update: ``ppo_epochs`` x exactly ``mini_batches`` optimizer steps.

        Data parallel (see :mod:`agentgym.trainers.distributed`): one all-gather first gives every mini-batch's
        global token/sequence counts and the most micro-batches any rank has for it; every rank then runs that
        many backward passes (zero-weight ones where it has run out of rows, e.g. when all its episodes errored)
        under ``no_sync`` except the last, whose bucketed all-reduce sums the gradients. A mini-batch empty on
        every rank gives no gradient, so the optimizer leaves the parameters alone (the scheduler still steps).
        """
        cfg = self.config
        model = self.model
        t0 = time.perf_counter()
        width = int(batch.input_ids.shape[1])
        # One optimizer step on fresh samples: every micro-batch's forward runs on the weights the samples came
        # from, so pi_old is that forward's own detached output and a separate no-grad pass over the whole batch
        # (a third of the update's compute) would only recompute it. Off-policy correction needs pi_old before
        # the update; dropout would make the training forward differ from pi_old.
        exact_forward = not cfg.corrects_off_policy and same_in_train_and_eval(model)
        old_from_forward = exact_forward and cfg.ppo_epochs == 1 and cfg.mini_batches == 1
        # Several optimizer steps: pi_old of the later mini-batches is the sampler's log-probs when those are this
        # model's own (HF sampling from these float32 weights: not a bfloat16 copy, vLLM or samples drawn while an
        # earlier update trained, whose pi_old is the current weights' by design). The first
        # mini-batch's forward runs on unchanged weights and so checks that on a quarter of the batch (or whatever
        # share it holds) before the first optimizer step; see _settle_pi_old.
        check_sampler = exact_forward and not old_from_forward and cfg.parallelism != "fsdp" and not cfg.max_staleness \
            and cfg.generation_backend == "hf" and getattr(self, "_sampling_model", None) is None
        batch.old_logprobs = None
        with torch.no_grad():  # the unwrapped model: no collectives, so ranks may differ in how many passes run
            model.eval()
            if not old_from_forward and not check_sampler:
                with self.sharding.full_weights(model):  # FSDP: gathered by every rank together first
                    batch.old_logprobs = _no_grad_logprobs(self._forward_logprobs, model, batch,
                                                           cfg.micro_batch_size, width)
            if self.reference is not None:
                with self.sharding.full_weights(self.reference), self._reference_context():
                    batch.ref_logprobs = _no_grad_logprobs(self._forward_logprobs, self.reference, batch,
                                                           cfg.micro_batch_size, width)
        if cfg.corrects_off_policy:  # stale samples: weight each token by pi_old / pi_behaviour, bounded by is_cap
            weights = alg.behaviour_weights(batch.old_logprobs, batch.sampler_logprobs, cap=cfg.is_cap,
                                            mode=cfg.behaviour_weight_mode)
            batch.advantages = batch.advantages * weights
            sampled = batch.loss_mask > 0  # the weight mean and how many tokens hit the bound (truncated or dropped)
            raw = alg.behaviour_weights(batch.old_logprobs, batch.sampler_logprobs, cap=float("inf"))[sampled]
            off_policy = {"train/is_weight_mean": float(weights[sampled].mean()) if sampled.any() else 1.0,
                          "train/is_bounded_frac": float((raw > cfg.is_cap).float().mean()) if sampled.any() else 0.0}
        else:
            off_policy = {}
        mask = batch.loss_mask
        mismatch_sums = torch.zeros(3, dtype=torch.float64)  # |pi_old - pi_sampler| summed and max over trained tokens,
        if batch.old_logprobs is not None:                    # and the tokens
            _add_mismatch(mismatch_sums, _mismatch(batch.old_logprobs, batch.sampler_logprobs, mask))
        plan = []  # per epoch, exactly mini_batches row sets (tensor_split: 5 rows into 4 gives 4, one may be empty)
        local = torch.zeros(cfg.ppo_epochs, cfg.mini_batches, 3, dtype=torch.float64)
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(mix_seed(cfg.seed, step, epoch)))
            chunks = [c.sort().values for c in torch.tensor_split(order, cfg.mini_batches)]
            plan.append(chunks)
            for k, rows in enumerate(chunks):
                tokens, seqs = alg.loss_denominators(mask[rows]) if len(rows) else (0.0, 0.0)
                local[epoch, k] = torch.tensor([tokens, seqs, -(-len(rows) // cfg.micro_batch_size)])
        everyone = self.world.gather(torch.cat([local.flatten(), torch.tensor([float(mask.sum())], dtype=torch.float64)]))
        counts = everyone[:, :-1].reshape(-1, cfg.ppo_epochs, cfg.mini_batches, 3)
        denominators, passes = counts[..., :2].sum(dim=0), counts[..., 2].amax(dim=0).long()
        trained_tokens = float(everyone[:, -1].sum())
        stats: dict[str, float] = {"train/tokens": trained_tokens, **off_policy}
        if trained_tokens == 0:  # the same decision on every rank: the count is global
            stats["train/skipped_update"] = 1.0
            if batch.old_logprobs is not None:
                stats["train/logprob_mismatch"] = float(mismatch_sums[0] / max(float(mismatch_sums[1]), 1.0))
            return stats
        trained = self._trained_module()
        no_sync = getattr(trained, "no_sync", contextlib.nullcontext)
        params = [p for p in model.parameters() if p.requires_grad]
        model.train()
        sums = torch.zeros(4, dtype=torch.float64)  # loss, kl, clipped fraction x passes, real passes
        norms = []
        for epoch, chunks in enumerate(plan):
            for k, rows in enumerate(chunks):
                tokens, seqs = (float(v) for v in denominators[epoch, k])
                agg = dict(mode=cfg.loss_agg, global_token_count=max(tokens, 1.0), global_seq_count=max(seqs, 1.0),
                           max_len_norm=cfg.max_context_tokens or width)
                micro = list(batch.select(longest_first(batch, rows)).micro_batches(cfg.micro_batch_size)) \
                    if len(rows) else []
                optimizer.zero_grad(set_to_none=True)
                count = int(passes[epoch, k])
                for j in range(count):
                    with no_sync() if j < count - 1 else contextlib.nullcontext():
                        if j < len(micro):
                            loss = self._micro_batch_loss(trained, micro[j], agg, sums,
                                                          None if batch.old_logprobs is not None else mismatch_sums)
                        else:  # this rank ran out of rows: a zero-weight pass so it joins the gradient all-reduce
                            loss = trained(_placeholder(int(self.tokenizer.pad_token_id or 0))).sum() * 0.0
                        loss.backward()
                if check_sampler and epoch == 0 and k == 0:  # still the weights the samples came from
                    stats["train/pi_old_from_sampler"] = float(self._settle_pi_old(batch, mismatch_sums, width))
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
                norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))  # FSDP: a DTensor
                optimizer.step()
                scheduler.step()
        model.eval()
        total = self.world.gather(sums).sum(dim=0).tolist()  # each rank's loss is its share of the global loss
        steps = cfg.ppo_epochs * cfg.mini_batches
        stats["train/logprob_mismatch"] = float(mismatch_sums[0] / max(float(mismatch_sums[1]), 1.0))
        stats.update({"train/loss": total[0] / steps, "train/clip_frac": total[2] / max(total[3], 1.0),
                      "train/grad_norm": sum(norms) / len(norms), "train/optimizer_steps": float(steps),
                      "time/update_s": time.perf_counter() - t0})
        if self.reference is not None:
            stats["train/kl"] = total[1] / steps
        return stats

    def _micro_batch_loss(self, trained: Any, mb: TrainingBatch, agg: dict[str, Any], sums: torch.Tensor,
                          mismatch_sums: torch.Tensor | None = None) -> torch.Tensor:
        """One micro-batch's share of the mini-batch loss (global denominators in ``agg``); adds to ``sums``.

        Without ``mb.old_logprobs`` (one optimizer step on fresh samples, see :meth:`_update`) pi_old is this
        forward's own output, detached, and its gap to the sampler's log-probs is added to ``mismatch_sums``."""
        cfg = self.config
        logp = trained(mb)
        m = mb.loss_mask.to(logp.device)
        if mb.old_logprobs is None:
            old = logp.detach()
            if mismatch_sums is not None:
                _add_mismatch(mismatch_sums, _mismatch(old.cpu(), mb.sampler_logprobs[:, :old.shape[1]],
                                                       mb.loss_mask[:, :old.shape[1]]))
        else:
            old = mb.old_logprobs.to(logp.device)
        per_token, metrics = alg.clipped_policy_loss(
            logp, old, mb.advantages.to(logp.device), eps_low=cfg.clip_eps_low,
            eps_high=cfg.clip_eps_high, dual_clip_c=cfg.dual_clip_c, loss_mask=m)
        loss = alg.aggregate_loss(per_token, m, **agg)
        if self.reference is not None:
            kl_loss = alg.aggregate_loss(alg.kl_penalty(logp, mb.ref_logprobs.to(logp.device),
                                                        estimator=cfg.kl_estimator), m, **agg)
            loss = loss + cfg.kl_coef * kl_loss
            sums[1] += float(kl_loss.detach())
        sums[0] += float(loss.detach())
        sums[2] += float(metrics["clip_frac"])
        sums[3] += 1.0
        return loss

    def _settle_pi_old(self, batch: TrainingBatch, mismatch_sums: torch.Tensor, width: int) -> bool:
        """After the first mini-batch's backward passes, before its optimizer step: set ``batch.old_logprobs`` for
        the rest of the update. Where the sampler's log-probs matched that mini-batch's own forward (mean gap at most
        :data:`SAMPLER_MEAN_GAP`, largest at most :data:`SAMPLER_MAX_GAP`, on every rank's rows together) they are
        pi_old, saving a no-grad pass over the whole batch (a quarter of an update's compute); else that pass runs
        now, on the weights the samples came from, and ``mismatch_sums`` becomes the whole batch's. Returns whether
        the sampler's were taken. Every rank calls it and all decide alike."""
        seen = self.world.gather(mismatch_sums.clone())
        gap, tokens, largest = float(seen[:, 0].sum()), float(seen[:, 1].sum()), float(seen[:, 2].max())
        if tokens > 0 and gap / tokens <= SAMPLER_MEAN_GAP and largest <= SAMPLER_MAX_GAP:
            batch.old_logprobs = batch.sampler_logprobs
            return True
        model = self.model
        with torch.no_grad():
            model.eval()
            batch.old_logprobs = _no_grad_logprobs(self._forward_logprobs, model, batch, self.config.micro_batch_size,
                                                   width)
            model.train()
        mismatch_sums.copy_(_mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask))
        return False

    def _trained_module(self) -> Any:
        """The module the update's forward and backward go through: :meth:`_forward_logprobs` on the model, in
        DistributedDataParallel (summing gradients) when data-parallel, or sharded by FSDP (built by
        :meth:`_parallelize`; no ``no_sync``: every pass reduce-scatters its gradients). Built once per model, on every
        rank."""
        cached = getattr(self, "_trained", None)
        if cached is not None and cached[0] is self.model:
            return cached[1]
        trained = data_parallel(ForwardWith(self.model, self._forward_logprobs), self.world)
        self._trained = (self.model, trained)
        return trained

    def _reference_context(self) -> Any:
        """Disables the LoRA adapters while the reference is the base under them; otherwise does nothing."""
        if getattr(self, "_reference_is_base", False):
            return self.reference.disable_adapter()
        return contextlib.nullcontext()


def _row_owners(batch: TrainingBatch) -> torch.Tensor:
    """``[N]`` the trajectory (position in the list the batch was built from) of each row."""
    return batch.episode_index if batch.episode_index is not None else torch.arange(len(batch))


def trained_episodes(batch: TrainingBatch, episodes: int) -> torch.Tensor:
    """``[episodes]`` bool: which of the batch's trajectories have a trained token in some row."""
    out = torch.zeros(episodes, dtype=torch.bool)
    if len(batch):
        out[_row_owners(batch)[(batch.loss_mask > 0).any(dim=1)]] = True
    return out


def trained_steps(batch: TrainingBatch, steps: list[int]) -> torch.Tensor:
    """``[sum(steps)]`` bool, trajectory by trajectory (``steps[i]`` steps each): which steps have a trained token."""
    offsets = torch.tensor([0, *steps[:-1]], dtype=torch.long).cumsum(0) if steps else torch.zeros(0, dtype=torch.long)
    out = torch.zeros(sum(steps), dtype=torch.bool)
    if len(batch) and batch.turn_index is not None:
        rows, cols = torch.nonzero((batch.loss_mask > 0) & (batch.turn_index >= 0), as_tuple=True)
        out[offsets[_row_owners(batch)[rows]] + batch.turn_index[rows, cols]] = True
    return out


@dataclass(frozen=True)
class ZeroSignal:
    """How many of a step's groups have all-zero advantages, and why (their members' outcomes)."""

    groups: int
    zero: int
    all_fail: int
    all_succeed: int
    other: int

    @property
    def share(self) -> float:
        """Zero-signal groups / groups (0 for no group)."""
        return self.zero / self.groups if self.groups else 0.0


def zero_signal_groups(group_ids: list[str | None], advantages: torch.Tensor, loss_mask: torch.Tensor,
                       success: list[bool]) -> ZeroSignal:
    """Count the groups (rows sharing a ``group_id``) whose advantages are zero on every trained token.

    Why: a group-relative advantage compares rollouts of one task, so a group whose rollouts all fail or all
    succeed contributes nothing to the gradient; when most groups are like that the step learns little, and the
    fix (a warm start, larger groups, easier tasks) is the user's to choose.
    """
    rows: dict[object, list[int]] = {}
    for i, gid in enumerate(group_ids):
        rows.setdefault(gid if gid is not None else ("row", i), []).append(i)
    trained = (advantages.abs() * (loss_mask > 0)).amax(dim=1) if advantages.numel() else torch.zeros(len(group_ids))
    zero = all_fail = all_succeed = 0
    for members in rows.values():
        if float(trained[members].max()) > 1e-8:
            continue
        zero += 1
        outcomes = {success[i] for i in members}
        all_fail += outcomes == {False}
        all_succeed += outcomes == {True}
    return ZeroSignal(len(rows), zero, all_fail, all_succeed, zero - all_fail - all_succeed)


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad ``[n, w]`` to ``[n, width]`` with zeros (micro-batches are trimmed to their own width)."""
    if t.shape[1] == width:
        return t
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def longest_first(batch: TrainingBatch, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` ordered by sequence length, longest first, ties in their given order.

    Why: a micro-batch is trimmed to its longest row, so rows of like length together pad far less than rows in
    trajectory order (multi-turn lengths are long-tailed); each row's values do not depend on its neighbours, and
    the loss uses global denominators, so only float rounding changes.
    """
    lengths = batch.attention_mask[rows].sum(dim=1)
    return rows[torch.argsort(lengths, descending=True, stable=True)]


def same_in_train_and_eval(model: Any) -> bool:
    """True when no dropout is active anywhere in ``model`` (an ``nn.Dropout`` with ``p > 0``, or a dropout rate
    in its config such as Llama's ``attention_dropout``): a forward in training mode then computes exactly what one
    in eval mode does."""
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop",
                 "hidden_dropout_prob", "attention_probs_dropout_prob"):
        value = getattr(config, name, 0)
        if isinstance(value, (int, float)) and value > 0:
            return False
    return not any(isinstance(module, torch.nn.Dropout) and module.p > 0 for module in model.modules())


SAMPLER_MEAN_GAP = 1e-4
"""Largest mean |log pi_sampler - log pi_train| per trained token for the sampler's log-probs to serve as pi_old:
float32 HF sampling with a KV cache differs from the training forward by about 1e-7; a bfloat16 sampler, another
engine or a context the sampler saw differently by 1e-3 and more."""
SAMPLER_MAX_GAP = 1e-2
"""Largest gap on any one trained token for the same (one turn scored on another context would show here)."""


def _mismatch(old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[sum, tokens, max]`` of |old - sampler| over the trained tokens (``mask`` > 0), float64."""
    gap = (old - sampler).abs() * mask
    return torch.tensor([float(gap.sum()), float(mask.sum()), float(gap.max()) if gap.numel() else 0.0],
                        dtype=torch.float64)


def _add_mismatch(sums: torch.Tensor, part: torch.Tensor) -> None:
    """Fold one :func:`_mismatch` into running ``sums`` in place (sums add, the maximum is a maximum)."""
    sums[:2] += part[:2]
    sums[2] = max(float(sums[2]), float(part[2]))


def _no_grad_logprobs(forward: Any, model: Any, batch: TrainingBatch, micro_batch_size: int, width: int) -> torch.Tensor:
    """``[N, width]`` log-probs of every row, micro-batch by micro-batch in :func:`longest_first` order (``[0, width]``
    for an empty batch)."""
    if len(batch) == 0:
        return torch.zeros((0, width))
    order = longest_first(batch, torch.arange(len(batch)))
    pieces = [_pad_to(forward(model, mb).cpu(), width) for mb in batch.select(order).micro_batches(micro_batch_size)]
    out = torch.empty((len(batch), width))
    out[order] = torch.cat(pieces)
    return out


def _placeholder(pad_id: int) -> TrainingBatch:
    """A two-token row with no trained tokens: the input of a zero-weight pass (it touches every parameter)."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long)
    zeros = torch.zeros((1, 2))
    return TrainingBatch(ids, torch.ones_like(ids), zeros, zeros.clone(), zeros.clone(), zeros.clone(), zeros.clone())
