"""What ArCHer and online filtered BC share: a policy trained on stored turns, one utterance at a time.

Both run the one online loop (:class:`~agentgym.trainers.loop.OnlineTrainer`) and keep every turn they sample
(``(s, a, r, s')`` transitions, :mod:`agentgym.trainers.replay`); their update trains the actor on turns drawn
from that store, each as ``log pi(a | s)`` of an utterance given its exact prompt ids. This module holds those
shared pieces (their shared config fields are in :mod:`agentgym.trainers.replay_actor_config`);
:mod:`agentgym.trainers.archer` adds the critic, and :mod:`agentgym.trainers.filtered_bc` the return filter.

Data parallelism (``torchrun``; see :mod:`agentgym.trainers.distributed`) gives exactly the single-process update,
by two choices:

* **the store is the same on every rank.** Each rank rolls out its share of the step's episodes; their turns are
  then gathered (one ``all_gather_object``) and appended in rank order, which is the single-process episode
  order (ranks hold contiguous shares of the step's tasks), each episode named by its index in the whole step.
  Every rank therefore holds the single-process buffer, and the same seeded generator draws the same
  micro-batches from it on every rank. Sampling from per-rank buffers instead would draw each rank's rows from
  its own episodes only, a different distribution from the single-process one, and no reduction can undo that.
  The gather is cheap (one step's turns as text and ids); what costs is the update, and that is split:
* **each micro-batch's rows are split across ranks** (contiguous shares, :meth:`World.shard`). A rank samples
  fresh utterances for its rows only, each row from its own seed (iteration, phase, optimizer step,
  micro-batch, row), so a row draws the same tokens whichever rank runs it (as the rollout engine's episodes do,
  up to float rounding of batched logits at a sampling boundary); its loss is its rows' share of the
  micro-batch mean (divided by the whole micro-batch's size), and DDP sums the gradients, so the summed shares
  are the single-process gradient. Every rank makes the same passes (``grad_accum_steps`` per optimizer step,
  a zero-weight pass where a micro-batch has fewer rows than there are ranks), hence the same collectives; a
  rank whose episodes all errored contributes no turns but still trains on its share of the rows. Clipping,
  optimizer steps and the Polyak update then run on identical gradients and weights on every rank.

Only the first rank writes the store's file and the checkpoints; the others read the file on resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

from agentgym.policies import SamplingParams
from agentgym.rollout import EpisodeSpec, RolloutEngine
from agentgym.trainers.batch import sequence_logprobs
from agentgym.trainers.distributed import ForwardWith, data_parallel
from agentgym.trainers.loop import OnlineTrainer
from agentgym.trainers.replay import ReplayBuffer, Transition, transitions_from_trajectory
from agentgym.trainers.replay_actor_config import ReplayActorConfig
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["ReplayActorConfig", "ReplayActorTrainer"]

logger = logging.getLogger(__name__)


class ReplayActorTrainer(OnlineTrainer):
    """The loop plus the actor pieces ArCHer and filtered BC share (see the module docstring)."""

    config: ReplayActorConfig
    supports_distributed = True

    def _decode(self, ids: tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _store(self, name: str, capacity: int) -> ReplayBuffer:
        """The turn store ``output_dir/name``; only the first rank writes its file (the module docstring)."""
        return ReplayBuffer(Path(self.output_dir) / name, capacity=capacity, persist=self.world.is_main)

    def _transitions(self, step: int | str, trajectories: list[Trajectory], gamma: float) -> list[Transition]:
        """The turns of this step's episodes on every rank, in rank order, each episode named ``step:index`` by
        its index among the whole step's episodes (not its random ``traj_id``), so a resumed run and a
        data-parallel run store exactly the buffer of an uninterrupted single-process one. Every rank calls this
        (one gather), also one whose episodes all errored (they give no turns but keep their indices)."""
        local = [transitions_from_trajectory(t, self._decode, gamma=gamma, episode="") for t in trajectories]
        episodes = [turns for part in self.world.gather_objects(local) for turns in part]
        return [dataclasses.replace(turn, episode=f"{step}:{k}") for k, turns in enumerate(episodes) for turn in turns]

    def _prior_transitions(self, gamma: float) -> list[Transition]:
        """The turns of the ``prior_episodes`` the starting policy plays before the first step, named ``prior:k``
        (``[]`` without them). Episode ``k`` plays the ``k``-th task of a seeded permutation of the training split
        (cycled) from its own seeds, so the episodes depend on the seed alone, not on the method or the number of
        ranks; each rank plays a contiguous share and the turns are gathered in rank order, as a step's are. Every
        rank calls this. The episodes count among the run's, and their success and time go to the metrics at
        step 0 (``prior/*``, ``time/prior_s``)."""
        cfg = self.config
        if not cfg.prior_episodes:
            return []
        started = time.perf_counter()
        if self.world.is_main:
            logger.info("playing %d episodes of the starting policy before the first step (prior_episodes)",
                        cfg.prior_episodes)
        n = len(self.train_tasks)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(cfg.seed, 23))).tolist()
        specs = [EpisodeSpec(self.suite.env_id, task=self.train_tasks[order[k % n]],
                             seed=mix_seed(cfg.seed, 23, k) % (2**31), group_id=f"prior/{k}",
                             env_kwargs=dict(self.suite.env_kwargs), sampling_seed=mix_seed(cfg.seed, 23, k, 1))
                 for k in self.world.shard(list(range(cfg.prior_episodes)))]
        sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, top_p=cfg.top_p,
                                  seed=mix_seed(cfg.seed, 23, self.world.rank))
        self.model.eval()
        trajectories = RolloutEngine(self.policy, self._rollout_config(sampling)).run(specs)
        transitions = self._transitions("prior", trajectories, gamma)
        self.episodes += int(self.world.sum(float(len(trajectories))))
        played = self._episode_metrics(trajectories)
        self._log(0, {**{key.replace("train/", "prior/"): value for key, value in played.items()},
                      "prior/turns": float(len(transitions)), "time/prior_s": time.perf_counter() - started})
        if self.world.is_main:
            logger.info("prior episodes: %d played in %.0f s, success %.3f, %d turns stored",
                        int(played["train/episodes"]), time.perf_counter() - started, played["train/success_rate"],
                        len(transitions))
        return transitions

    def _sample_utterances(self, states: list[tuple[int, ...]], seeds: list[int]) -> list[tuple[int, ...]]:
        """Fresh utterances ``a_pi ~ pi(. | s)`` at buffer states (no gradient), row ``i`` from ``seeds[i]`` alone,
        so a row samples the same tokens in any batch, on any rank."""
        cfg = self.config
        self.model.eval()
        params = [SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, top_p=cfg.top_p,
                                 seed=seed) for seed in seeds]
        generations = self.policy.generate([list(s) for s in states], params)
        return [tuple(g.token_ids or ()) for g in generations]

    def _forward_logprobs(self, model: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        with self._forward_precision():
            return sequence_logprobs(model, ids, attention, self.config.temperature)

    def _actor_module(self) -> Any:
        """What the actor's trained passes go through: :meth:`_forward_logprobs` on the model, in
        DistributedDataParallel (gradients summed) when data-parallel. Built once per model, at the first trained
        pass, which every rank reaches at the same point (the store, hence every skip decision, is shared)."""
        cached = getattr(self, "_trained_actor", None)
        if cached is None or cached[0] is not self.model:
            cached = (self.model, data_parallel(ForwardWith(self.model, self._forward_logprobs), self.world))
            self._trained_actor = cached
        return cached[1]

    def _zero_weight_actor_loss(self) -> torch.Tensor:
        """A pass with no weight through the actor, for a rank with no rows in a micro-batch: it joins the
        gradient all-reduce (every parameter is reached by a two-token row) and adds nothing."""
        pad = int(self.tokenizer.pad_token_id or 0)
        logp, _ = self._utterance_logprobs([(pad,)], [(pad,)])
        return logp.sum() * 0.0

    def _utterance_logprobs(self, states: list[tuple[int, ...]],
                            actions: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B, L] log-probs, [B, L] mask)`` of each utterance given its state (right-padded, exact ids), through
        the data-parallel actor (:meth:`_actor_module`)."""
        cfg = self.config
        width = max(len(s) + len(a) for s, a in zip(states, actions))
        pad = int(self.tokenizer.pad_token_id or 0)
        ids = torch.full((len(states), width), pad, dtype=torch.long)
        attention = torch.zeros((len(states), width), dtype=torch.long)
        mask = torch.zeros((len(states), width), dtype=torch.float32)
        for i, (s, a) in enumerate(zip(states, actions)):
            ids[i, : len(s) + len(a)] = torch.tensor(list(s) + list(a), dtype=torch.long)
            attention[i, : len(s) + len(a)] = 1
            mask[i, len(s): len(s) + len(a)] = 1.0
        logp = self._actor_module()(ids.to(cfg.device), attention.to(cfg.device))
        return logp, mask.to(cfg.device)

    def _clip_and_step(self, parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                       scheduler: Any = None) -> float:
        limit = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(parameters, limit)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return float(norm)


def sync_on_last(module: Any, micro: int, passes: int) -> Any:
    """The context of micro-batch pass ``micro`` of ``passes``: DDP's ``no_sync`` except the last, so gradients
    accumulate locally and one bucketed all-reduce per optimizer step sums them (nothing without DDP)."""
    if micro < passes - 1 and hasattr(module, "no_sync"):
        return module.no_sync()
    return contextlib.nullcontext()


def gather_rows(world: Any, values: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every rank's per-row values (``values``: name -> this rank's 1-d tensors, possibly none), concatenated in
    rank order, from one gather: a data-parallel phase reports the metrics of all its rows, not of one share."""
    local = {k: torch.cat(v) if v else torch.zeros(0) for k, v in values.items()}
    parts = world.gather_objects(local)
    return {k: torch.cat([p[k] for p in parts]) for k in values}
