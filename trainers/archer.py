"""ArCHer: an utterance-level off-policy critic and a token-level actor (Zhou et al., 2024, arXiv 2402.19446).

``ArcherTrainer(config).train()`` is the one online loop (:class:`~agentgym.trainers.loop.OnlineTrainer`). A fresh
run may start from ``prior_episodes`` of the starting policy in its buffer and a critic regressed onto their
Monte-Carlo returns for ``critic_prior_steps`` (its target a copy). Its learning step, in execution order, is:

1. append the step's turns to the replay buffer (``(s, a, r, s', terminated, truncated)``, persisted to
   ``replay.jsonl``; ``r`` is each turn's share of the episode's return, :mod:`agentgym.trainers.returns`);
2. ``critic_steps`` critic updates: TD targets from the target V heads (bootstrapping through truncation,
   stopping at termination), V targets from the target Q heads at a fresh policy sample, the four-MSE loss,
   then a Polyak update of the target critic after every step;
3. after ``actor_warmup_steps``: ``actor_steps`` actor updates at buffer states with fresh utterances, whose
   every token gets ``A = min(Q1, Q2)(s, a_pi) - min(V1, V2)(s)`` from the online critic (with
   ``actor_baseline: sampled``, several utterances a state and the others' mean ``min(Q1, Q2)`` in place of V).

Every critic input is text decoded from token ids with special tokens kept, for buffer and fresh actions and
states alike, so Q is read on the same kind of text it was fit on. Gradients are averaged over
``grad_accum_steps`` micro-batches, so ``lr`` means the same whatever the accumulation (the reference code sums
them, so its ``lr`` equals ours divided by ``grad_accum_steps``). The math lives in
:mod:`agentgym.trainers.algorithms.archer`.

Under ``torchrun`` every rank holds the same buffer and splits each micro-batch's rows with the others, the critic
and the actor both in DistributedDataParallel with summed gradients (:mod:`agentgym.trainers.replay_actor` says
why this is the single-process update); the target critic is never trained, so each rank Polyak-averages its own
copy towards identical online weights.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentgym.trainers.algorithms import archer as alg
from agentgym.errors import ConfigError
from agentgym.trainers.archer_config import ArcherConfig
from agentgym.trainers.checkpoint import latest_checkpoint
from agentgym.trainers.distributed import data_parallel
from agentgym.trainers.loop import CONFIG_FILE
from agentgym.trainers.replay_actor import ReplayActorTrainer, gather_rows, sync_on_last
from agentgym.trainers.replay import Transition
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["ArcherConfig", "ArcherTrainer", "critic_views"]

logger = logging.getLogger(__name__)


def critic_views(trajectory: Trajectory, critic_input: str) -> list[tuple[str, str]]:
    """Per turn, the ``(state, next_state)`` texts the critic reads under ``critic_input`` (``observation`` or
    ``state_key``; ``history`` is the replay buffer's own text). The last turn's next state is the final
    observation (``observation``), or, since no key is recorded after the last action, the last key followed by
    the action (``state_key``): a terminated turn's target never reads it, a truncated one bootstraps from it.

    Raises:
        ConfigError: ``state_key`` on a trajectory whose env records no ``state_key()``, or an unknown mode.
    """
    turns = trajectory.turns
    if critic_input == "observation":
        states = [turn.observation for turn in turns]
        final = trajectory.final_observation
        last = final if final is not None else (f"{states[-1]} {turns[-1].action}" if turns else "")
    elif critic_input == "state_key":
        missing = [i for i, turn in enumerate(turns) if turn.state_key is None]
        if missing:
            raise ConfigError(f"critic_input: state_key, but {trajectory.env_id} recorded no state_key() on turn "
                              f"{missing[0]} of task {trajectory.task_id!r}; use critic_input: observation (or "
                              "history), or give the env a state_key() method.")
        states = [str(turn.state_key) for turn in turns]
        last = f"{states[-1]} {turns[-1].action}" if turns else ""
    else:
        raise ConfigError(f"critic_input {critic_input!r} has no per-turn view; use observation or state_key.")
    return [(states[i], states[i + 1] if i + 1 < len(states) else last) for i in range(len(states))]


# ---- ArCHer -------------------------------------------------------------------------------------------
class ArcherTrainer(ReplayActorTrainer):
    """``ArcherTrainer(config).train()``; see the module docstring for the order of work."""

    config: ArcherConfig

    def _transitions(self, step: int | str, trajectories: list[Trajectory], gamma: float) -> list[Transition]:
        """The buffer's turns with the critic's view of each state (``critic_input``); the actor keeps reading
        ``state_ids``, the full prompt. Views are gathered in the same rank order as the turns, whose episode
        name ``step:k`` gives each turn's episode ``k``."""
        transitions = super()._transitions(step, trajectories, gamma)
        mode = self.config.critic_input
        if mode == "history":
            return transitions
        local = [critic_views(t, mode) if t.turns and t.error is None else [] for t in trajectories]
        views: Sequence[list[tuple[str, str]]] = [v for part in self.world.gather_objects(local) for v in part]
        out = []
        for t in transitions:
            state, next_state = views[int(t.episode.rsplit(":", 1)[1])][t.turn]
            out.append(dataclasses.replace(t, state=state, next_state=next_state))
        return out

    def _build_critic(self) -> Any:
        from agentgym.trainers.critic import UtteranceCritic

        cfg = self.config
        kwargs: dict[str, Any] = dict(hidden_size=cfg.critic_hidden_size, max_tokens=cfg.critic_max_tokens,
                                      pooling=cfg.critic_pooling, action_view=cfg.critic_action_view,
                                      device=cfg.device)
        if cfg.critic_encoder == "minilm":
            return UtteranceCritic.from_minilm(**kwargs)
        if cfg.critic_encoder == "bytes":
            return UtteranceCritic.from_bytes(seed=cfg.seed, **kwargs)
        if cfg.critic_encoder == "grid":
            del kwargs["pooling"]
            return UtteranceCritic.from_grid(seed=cfg.seed, **kwargs)
        return UtteranceCritic.from_policy(self.model, self.tokenizer, **kwargs)

    def _check_resume(self, force: bool) -> None:
        """Refuse, even with ``--force``, to resume a checkpoint under another ``actor_optimizer``: the checkpoint
        holds the other optimizer's state (AdamW's moments, or SGD's nothing), which this one cannot take up."""
        stored_path = self.output_dir / CONFIG_FILE
        if self.world.is_main and latest_checkpoint(self.checkpoint_dir) is not None and stored_path.is_file():
            try:
                stored = json.loads(stored_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                stored = None  # the loop's own check reports an unreadable file
            before = stored.get("actor_optimizer", "adamw") if isinstance(stored, dict) else None
            if before is not None and before != self.config.actor_optimizer:
                raise ConfigError(
                    f"{self.output_dir} was trained with actor_optimizer: {before}, and its checkpoint holds that "
                    f"optimizer's state, which {self.config.actor_optimizer} cannot resume (not even with --force). "
                    f"Set actor_optimizer: {before} to resume it, or train into a new output directory "
                    "(--output-dir DIR) from its model (model: <its checkpoint's model/ folder>).")
        super()._check_resume(force)

    def _make_optimizer(self) -> None:
        """The actor's optimizer: the loop's AdamW, or plain SGD (``actor_optimizer: sgd``), whose step scales with
        the advantages the critic gives."""
        if self.config.actor_optimizer == "adamw":
            super()._make_optimizer()
            return
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(trainable, lr=self.config.learning_rate, weight_decay=self.config.weight_decay)
        self.scheduler = self._schedule(self.optimizer)

    def _setup(self, resume_from: Path | None) -> None:
        cfg = self.config
        self.critic = self._build_critic()
        self.target_critic = copy.deepcopy(self.critic)  # hard copy at init (tau = 1)
        for p in self.target_critic.parameters():
            p.requires_grad_(False)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_learning_rate)
        self.replay = self._store("replay.jsonl", cfg.replay_capacity)
        if resume_from is not None:
            blob = torch.load(resume_from / "critic.pt", weights_only=False)
            self.critic.load_state_dict(blob["critic"])
            self.target_critic.load_state_dict(blob["target_critic"])
            self.critic_optimizer.load_state_dict(blob["critic_optimizer"])
            for group in self.critic_optimizer.param_groups:  # this config's rate, not the stored run's (--force)
                group["lr"] = cfg.critic_learning_rate
        else:
            if self.replay.total:  # a fresh run must not inherit a stale buffer from a run that never checkpointed
                self.replay.truncate(0)
            self.replay.extend(self._prior_transitions(cfg.gamma))
            if cfg.critic_prior_steps:
                self._critic_prior_fit()

    def _restore_state(self, state: dict[str, Any], directory: Path) -> None:
        self.replay.truncate(int(state["replay_total"]))

    def _checkpoint_state(self) -> dict[str, Any]:
        return {"replay_total": self.replay.total}

    def _save_extra_state(self, directory: Path) -> None:
        torch.save({"critic": self.critic.state_dict(), "target_critic": self.target_critic.state_dict(),
                    "critic_optimizer": self.critic_optimizer.state_dict()}, directory / "critic.pt")

    def _learn(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        cfg = self.config
        self.replay.extend(self._transitions(step, trajectories, cfg.gamma))
        stats: dict[str, float] = {"replay/size": float(len(self.replay))}
        if len(self.replay) == 0:
            return {**stats, "train/skipped_update": 1.0}
        generator = torch.Generator().manual_seed(mix_seed(cfg.seed, step, 2))
        t0 = time.perf_counter()
        stats.update(self._critic_phase(step, generator))
        stats["time/critic_s"] = time.perf_counter() - t0
        if step >= cfg.actor_warmup_steps:
            t0 = time.perf_counter()
            stats.update(self._actor_phase(step, generator))
            stats["time/actor_s"] = time.perf_counter() - t0
        return stats

    def _critic_module(self) -> Any:
        """The online critic in DistributedDataParallel (gradients summed) when data-parallel; built once per
        critic, at the first critic pass, which every rank reaches at the same point."""
        cached = getattr(self, "_trained_critic", None)
        if cached is None or cached[0] is not self.critic:
            cached = (self.critic, data_parallel(self.critic, self.world))
            self._trained_critic = cached
        return cached[1]

    @staticmethod
    def _zero_weight_critic_pass(critic: Any, turn: Transition) -> None:
        """A pass with no weight through the critic, for a rank with no rows in a micro-batch (fewer rows than
        ranks): it joins the gradient all-reduce and adds nothing."""
        q, v = critic([turn.state], [turn.action])
        (q.sum() + v.sum()).mul(0.0).backward()

    def _buffer_actions(self, turns: Sequence[Transition]) -> list[str]:
        """The buffer actions as the critic reads them: decoded from their ids (special tokens kept), as the states
        and fresh samples are; Q fit on stripped text but read on raw text would judge fresh samples on inputs it
        never saw."""
        return [self._decode(t.action_ids) if t.action_ids else t.action for t in turns]

    def _critic_update(self, critic: Any, generator: torch.Generator, params: list[torch.nn.Parameter],
                       rows_loss: Callable[[int, list[int], list[Transition]], torch.Tensor]) -> tuple[float, float]:
        """One critic optimizer step: ``grad_accum_steps`` micro-batches of ``batch_size`` buffer turns (the whole
        micro-batch drawn on every rank, each rank training on its share of the rows), ``rows_loss(micro, mine,
        own)`` the mean loss of this rank's rows ``own`` (indices ``mine`` in the micro-batch), weighted here by
        their share of the micro-batch mean so that the shares of all ranks sum to it. Returns ``(this rank's
        summed weighted loss, the gradient norm before clipping)``."""
        cfg = self.config
        self.critic_optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in range(cfg.grad_accum_steps):
            b = self.replay.sample(cfg.batch_size, generator)
            mine = self.world.shard(range(len(b)))
            with sync_on_last(critic, micro, cfg.grad_accum_steps):
                if not mine:
                    self._zero_weight_critic_pass(critic, b[0])
                    continue
                share = len(mine) / (len(b) * cfg.grad_accum_steps)
                loss = rows_loss(micro, list(mine), [b[i] for i in mine]) * share
                loss.backward()
            total += float(loss.detach())
        return total, self._clip_and_step(params, self.critic_optimizer)

    def _critic_prior_fit(self) -> None:
        """``critic_prior_steps`` regressions of the Q and V heads onto the Monte-Carlo returns of the buffer's turns
        (the prior episodes: all it holds now), then the target critic becomes a copy. Logged at step 0: the loss
        and the explained variance over the last ten steps' turns (a fit on training turns), and the time."""
        cfg = self.config
        started = time.perf_counter()
        generator = torch.Generator().manual_seed(mix_seed(cfg.seed, 29))
        critic = self._critic_module()
        params = [p for p in self.critic.parameters() if p.requires_grad]
        steps = cfg.critic_prior_steps if len(self.replay) else 0
        rows: dict[str, list[torch.Tensor]] = {"fitted": [], "returns": [], "loss": []}
        recording = False
        if self.world.is_main:
            logger.info("fitting the critic to the prior episodes' returns: %d steps of %d turns (critic_prior_steps)",
                        steps, cfg.batch_size * cfg.grad_accum_steps)

        def regression(micro: int, mine: list[int], own: list[Transition]) -> torch.Tensor:
            q, v = critic([t.state for t in own], self._buffer_actions(own))
            target = torch.tensor([t.mc_return for t in own], dtype=q.dtype, device=q.device).expand_as(q)
            if recording:
                rows["fitted"].append(q.detach().min(dim=0).values.cpu())
                rows["returns"].append(target[0].detach().cpu())
            return alg.archer_critic_loss(q, v, target, target)

        self.critic.train()
        for step in range(steps):
            recording = step >= steps - 10
            total, _ = self._critic_update(critic, generator, params, regression)
            if recording:
                rows["loss"].append(torch.tensor([total], dtype=torch.float64))
        self.critic.eval()
        self.target_critic.load_state_dict(self.critic.state_dict())
        every = gather_rows(self.world, rows)
        fit = alg.explained_variance(every["fitted"], every["returns"]) if every["returns"].numel() else float("nan")
        self._log(0, {"critic/prior_steps": float(steps),
                      "critic/prior_loss": float(every["loss"].sum()) / max(min(steps, 10), 1),
                      "critic/prior_explained_variance": fit, "time/critic_prior_s": time.perf_counter() - started})
        if self.world.is_main:
            logger.info("critic fit in %.0f s: %s", time.perf_counter() - started,
                        f"it explains {fit:.3f} of its last ten batches' returns" if fit == fit
                        else "its last ten batches' returns were all equal, nothing to explain")

    def _critic_phase(self, iteration: int, generator: torch.Generator) -> dict[str, float]:
        cfg = self.config
        norms, losses = [], []
        rows: dict[str, list[torch.Tensor]] = {"q": [], "v": [], "fitted": [], "returns": []}
        critic = self._critic_module()
        params = [p for p in self.critic.parameters() if p.requires_grad]
        step = 0

        def td(micro: int, mine: list[int], own: list[Transition]) -> torch.Tensor:
            seeds = [mix_seed(cfg.seed, iteration, 3, step, micro, i) for i in mine]
            fresh_text = [self._decode(a) for a in self._sample_utterances([t.state_ids for t in own], seeds)]
            with torch.no_grad():
                h_next = self.target_critic.encode([t.next_state for t in own])
                h_s_bar = self.target_critic.encode([t.state for t in own])
                y_q = alg.td_targets(torch.tensor([t.reward for t in own]), self.target_critic.v_values(h_next),
                                     torch.tensor([t.terminated for t in own]),
                                     torch.tensor([t.truncated for t in own]),
                                     gamma=cfg.gamma, bootstrap_truncated=cfg.bootstrap_truncated)
                y_v = self.target_critic.q_values(h_s_bar,
                                                  self.target_critic.encode_actions([t.state for t in own], fresh_text))
            q, v = critic([t.state for t in own], self._buffer_actions(own))
            rows["q"].append(q.detach().mean(dim=0).cpu())
            rows["v"].append(v.detach().mean(dim=0).cpu())
            rows["fitted"].append(q.detach().min(dim=0).values.cpu())
            rows["returns"].append(torch.tensor([t.mc_return for t in own], dtype=torch.float32))
            return alg.archer_critic_loss(q, v, y_q.to(q.device), y_v.to(q.device))

        self.critic.train()
        for step in range(cfg.critic_steps):
            total, norm = self._critic_update(critic, generator, params, td)
            norms.append(norm)
            alg.polyak_update(self.target_critic, self.critic, cfg.tau)
            losses.append(torch.tensor([total], dtype=torch.float64))
        self.critic.eval()
        every = gather_rows(self.world, {**rows, "loss": losses})
        return {"critic/loss": float(every["loss"].sum()) / cfg.critic_steps,
                "critic/grad_norm": sum(norms) / len(norms),
                "critic/q_mean": float(every["q"].mean()), "critic/v_mean": float(every["v"].mean()),
                "critic/explained_variance": alg.explained_variance(every["fitted"], every["returns"])}

    def _actor_phase(self, iteration: int, generator: torch.Generator) -> dict[str, float]:
        cfg = self.config
        norms, losses, advantages = [], [], []
        per_state = cfg.actor_samples_per_state if cfg.actor_baseline == "sampled" else 1
        actor = self._actor_module()
        params = [p for p in self.model.parameters() if p.requires_grad]
        for step in range(cfg.actor_steps):
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in range(cfg.grad_accum_steps):
                b = self.replay.sample(cfg.batch_size // per_state, generator)
                # a state's utterances stay on one rank: its baseline is the mean of the others
                mine = [i for i in self.world.shard(range(len(b))) for _ in range(per_state)]
                with sync_on_last(actor, micro, cfg.grad_accum_steps):
                    if not mine:
                        self.model.train()
                        self._zero_weight_actor_loss().backward()
                        continue
                    states = [b[i].state_ids for i in mine]
                    seeds = ([mix_seed(cfg.seed, iteration, 4, step, micro, i) for i in mine] if per_state == 1 else
                             [mix_seed(cfg.seed, iteration, 4, step, micro, i, n % per_state)
                              for n, i in enumerate(mine)])
                    fresh = self._sample_utterances(states, seeds)
                    with torch.no_grad():  # the plain critic: no gradient, no collective
                        q, v = self.critic([b[i].state for i in mine], [self._decode(a) for a in fresh])
                        adv = (alg.sampled_baseline_advantage(q, per_state) if per_state > 1
                               else alg.utterance_advantage(q, v))
                    self.model.train()
                    logp, mask = self._utterance_logprobs(states, fresh)
                    share = len(mine) / (len(b) * per_state * cfg.grad_accum_steps)
                    loss = alg.archer_actor_loss(adv.to(logp.device), logp, mask) * share
                    loss.backward()
                total += float(loss.detach())
                advantages.append(adv.double().cpu())
            norms.append(self._clip_and_step(params, self.optimizer, self.scheduler))
            losses.append(torch.tensor([total], dtype=torch.float64))
        self.model.eval()
        every = gather_rows(self.world, {"advantage": advantages, "loss": losses})
        adv = every["advantage"]
        return {"actor/loss": float(every["loss"].sum()) / cfg.actor_steps, "actor/grad_norm": sum(norms) / len(norms),
                "actor/advantage_mean": float(adv.mean()), "actor/advantage_abs": float(adv.abs().mean()),
                "actor/advantage_std": float(adv.std(unbiased=False))}
