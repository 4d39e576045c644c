"""Online filtered behaviour cloning: ArCHer's baseline (Zhou et al., 2024, arXiv 2402.19446).

The one online loop (:class:`~agentgym.trainers.loop.OnlineTrainer`): every step collects episodes with the current
policy and adds them to a cumulative pool (persisted as turns in ``pool.jsonl``, so a resumed run has the same
pool; ``prior_episodes`` of the starting policy join it before the first step). After ``actor_warmup_steps``, it
keeps the episodes whose return reaches the pool's ``quantile`` (0.9, numpy's linear interpolation), and runs
``actor_steps`` steps of behaviour cloning on their turns: ``L = -mean_b sum_tokens log pi(a | s)``, each
step averaging ``grad_accum_steps`` micro-batches of ``batch_size`` turns drawn with replacement. When every
return in the pool is equal (no success yet) the update is skipped instead of cloning the policy's own
samples (the reference code would clone them all). There is no critic.

Under ``torchrun`` every rank holds the same pool (each rank's new episodes are gathered), so every rank makes the
same selection and draws the same micro-batches; each rank trains on its share of every micro-batch's rows and DDP
sums the gradients (:mod:`agentgym.trainers.replay_actor` says why this is the single-process update).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from agentgym.trainers.algorithms.archer import filtered_bc_selection
from agentgym.trainers.filtered_bc_config import FilteredBCConfig
from agentgym.trainers.replay_actor import ReplayActorTrainer, gather_rows, sync_on_last
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["FilteredBCConfig", "FilteredBCTrainer"]


class FilteredBCTrainer(ReplayActorTrainer):
    """``FilteredBCTrainer(config).train()``; see the module docstring."""

    config: FilteredBCConfig

    def _setup(self, resume_from: Path | None) -> None:
        self.pool = self._store("pool.jsonl", 10**9)
        if resume_from is None:
            if self.pool.total:
                self.pool.truncate(0)
            self.pool.extend(self._prior_transitions(1.0))

    def _restore_state(self, state: dict[str, Any], directory: Path) -> None:
        self.pool.truncate(int(state["pool_total"]))

    def _checkpoint_state(self) -> dict[str, Any]:
        return {"pool_total": self.pool.total}

    def _learn(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        cfg = self.config
        self.pool.extend(self._transitions(step, trajectories, 1.0))
        stats: dict[str, float] = {"pool/turns": float(len(self.pool))}
        if step < cfg.actor_warmup_steps or len(self.pool) == 0:
            return {**stats, "train/skipped_update": 1.0}
        episodes: dict[str, list[Any]] = defaultdict(list)
        for t in self.pool:
            episodes[t.episode].append(t)
        names = list(episodes)
        returns = torch.tensor([sum(t.reward for t in episodes[n]) for n in names], dtype=torch.float64)
        cutoff, keep = filtered_bc_selection(returns, cfg.quantile, skip_if_uniform=cfg.skip_if_uniform)
        kept = [t for n, k in zip(names, keep.tolist()) if k for t in episodes[n]]
        stats.update({"filter/cutoff": cutoff, "filter/episodes_kept": float(keep.sum()),
                      "filter/pool_episodes": float(len(names))})
        if not kept:
            return {**stats, "train/skipped_update": 1.0}
        generator = torch.Generator().manual_seed(mix_seed(cfg.seed, step, 5))
        params = [p for p in self.model.parameters() if p.requires_grad]
        losses, norms = [], []
        actor = self._actor_module()
        self.model.train()
        for _ in range(cfg.actor_steps):
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in range(cfg.grad_accum_steps):
                # the whole micro-batch is drawn on every rank (the same draws); each trains on its share of it
                index = torch.randint(len(kept), (cfg.batch_size,), generator=generator).tolist()
                mine = [kept[i] for i in self.world.shard(index)]
                with sync_on_last(actor, micro, cfg.grad_accum_steps):
                    if not mine:  # fewer rows than ranks: a zero-weight pass joins the gradient all-reduce
                        self._zero_weight_actor_loss().backward()
                        continue
                    logp, mask = self._utterance_logprobs([t.state_ids for t in mine], [t.action_ids for t in mine])
                    # these rows' share of the micro-batch mean (the shares of all ranks sum to it)
                    loss = -(logp * mask).sum(dim=1).sum() / (cfg.batch_size * cfg.grad_accum_steps)
                    loss.backward()
                total += float(loss.detach())
            norms.append(self._clip_and_step(params, self.optimizer, self.scheduler))
            losses.append(torch.tensor([total], dtype=torch.float64))
        self.model.eval()
        every = gather_rows(self.world, {"loss": losses})
        return {**stats, "actor/loss": float(every["loss"].sum()) / cfg.actor_steps,
                "actor/grad_norm": sum(norms) / len(norms)}
