"""ArCHer: an utterance-level off-policy critic and a token-level actor (spec section 2).

``ArcherTrainer(config).train()`` reads top to bottom in execution order: load or resume (actor, actor
optimizer, critic, target critic, critic optimizer, replay buffer, RNG), optional behaviour-cloning warm
start, held-out evaluation, then for each iteration:

1. collect ``episodes_per_iteration`` episodes with the current policy and append their turns to the replay
   buffer (``(s, a, r, s', terminated, truncated)``, persisted to ``replay.jsonl``);
2. ``critic_steps`` critic updates: TD targets from the target V heads (bootstrapping through truncation,
   stopping at termination), V targets from the target Q heads at a fresh policy sample, the four-MSE loss,
   then a Polyak update of the target critic after every step;
3. after ``warmup_iterations``: ``actor_steps`` actor updates at buffer states with fresh utterances, whose
   every token gets ``A = min(Q1, Q2)(s, a_pi) - min(V1, V2)(s)`` from the online critic.

Gradients are averaged over ``grad_accum_steps`` micro-batches (project decision; the reference code sums
them, so its ``lr`` equals ours divided by ``grad_accum_steps``). The math lives in
:mod:`agentgym.trainers.algorithms.archer`. :class:`OnlineTrainerBase` holds what ArCHer shares with the
filtered-BC baseline (:mod:`agentgym.trainers.filtered_bc`): rollouts, evaluation, checkpoints and resume.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from agentgym.policies import SamplingParams
from agentgym.progress import track
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.suite import Task
from agentgym.trainers.algorithms import archer as alg
from agentgym.trainers.batch import sequence_logprobs
from agentgym.trainers.bc import behaviour_clone, collect_demonstrations
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.config import TrainerConfig
from agentgym.trainers.metrics import MetricsLogger, plot_learning_curve
from agentgym.trainers.replay import ReplayBuffer, Transition, transitions_from_trajectory
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["ArcherConfig", "ArcherTrainer", "OnlinePolicyConfig", "OnlineTrainerBase"]

logger = logging.getLogger(__name__)


# ---- configuration --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OnlinePolicyConfig(TrainerConfig):
    """What ArCHer and online filtered BC add to the shared trainer fields: iterations of collect-then-update,
    the actor's optimizer, and their (smaller) defaults for turns, context, evaluation and checkpoints."""

    output_dir: str = "runs/archer"
    """Checkpoints, replay buffer, metrics (JSONL + TensorBoard), learning curve and final model."""
    max_tokens_per_turn: int = 32
    """Most tokens per utterance (spec default 32)."""
    max_context_tokens: int | None = 1024
    """Episodes whose context would exceed this end with context_limit (a truncation)."""
    eval_every: int = 5
    """Evaluate on the held-out split every N iterations (and before the first and after the last)."""
    eval_tasks: int = 50
    """Held-out tasks per evaluation."""
    checkpoint_every: int = 5
    """Checkpoint every N iterations (0: only at the end)."""
    iterations: int = 20
    """Collect-then-update iterations."""
    episodes_per_iteration: int = 16
    """Episodes collected per iteration (``rollouts / iter`` in spec 2.5; 128 there)."""
    actor_learning_rate: float = 1e-4
    """Adam learning rate of the actor (per averaged micro-batch gradient)."""
    actor_steps: int = 3
    """Actor optimizer steps per iteration (``actor_epochs``)."""
    warmup_iterations: int = 2
    """Iterations before the first actor update (the critic, if any, trains from the start)."""
    batch_size: int = 16
    """Transitions per micro-batch."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; their gradients are averaged (spec 2.6: the reference code sums, so
    its lr equals this lr divided by grad_accum_steps)."""

    trainer_name: ClassVar[str] = "online"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("iterations", "episodes_per_iteration", "actor_steps", "batch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
        if self.warmup_iterations < 0:
            raise self._fail("warmup_iterations", f"must be >= 0, got {self.warmup_iterations}.")
        if not self.actor_learning_rate > 0:
            raise self._fail("actor_learning_rate", f"must be > 0 (typical for the tiny model: 1e-4), "
                                                    f"got {self.actor_learning_rate}.")
        if self.lora is not None:
            raise self._fail("lora", f"LoRA is supported by the GRPO and ARPO trainers only for now, not by "
                                     f"{self.trainer_name}: remove lora (dtype: bfloat16 and gradient_checkpointing: "
                                     "true also save memory here), or train with trainer: grpo.")
        if self.warmup_iterations >= self.iterations:
            raise self._fail("warmup_iterations", f"is {self.warmup_iterations} but there are only {self.iterations} "
                                                  "iterations, so the actor would never be updated; lower it.")


@dataclass(frozen=True)
class ArcherConfig(OnlinePolicyConfig):
    """ArCHer (spec 2): replay buffer + double-Q/V utterance critic with Polyak targets + token-level actor."""

    output_dir: str = "runs/archer"
    """Checkpoints, replay buffer, metrics, learning curve and final model."""
    gamma: float = 0.95
    """Discount between turns."""
    tau: float = 0.1
    """Polyak rate of the target critic (after every critic step)."""
    critic_learning_rate: float = 1e-4
    """Adam learning rate of the critic (encoder and heads)."""
    critic_steps: int = 10
    """Critic optimizer steps per iteration (``epochs``; 50 in the reference configs)."""
    replay_capacity: int = 100_000
    """Transitions kept for sampling (FIFO); the JSONL file keeps them all."""
    bootstrap_truncated: bool = True
    """TD targets bootstrap through truncations (turn/context limit) and stop only at termination; False
    restores the reference code, which treats a time limit as terminal."""
    critic_encoder: Literal["policy", "minilm"] = "policy"
    """Critic text encoder: a copy of the policy backbone, or the offline pretrained all-MiniLM-L6-v2."""
    critic_hidden_size: int | None = None
    """Width of the Q/V head MLPs (None: the encoder's width)."""
    critic_max_tokens: int = 256
    """Tokens the critic reads per state or utterance (left truncation keeps the latest turns)."""
    critic_pooling: Literal["mean", "last"] = "mean"
    """How the critic turns token states into one vector: their mean, or the last real token (the only
    position where a causal backbone such as ``critic_encoder: policy`` has read the whole text)."""

    trainer_name: ClassVar[str] = "archer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.gamma <= 1:
            raise self._fail("gamma", f"must be in [0, 1], got {self.gamma}.")
        if not 0 < self.tau <= 1:
            raise self._fail("tau", f"must be in (0, 1] (0 would freeze the target critic), got {self.tau}.")
        if not self.critic_learning_rate > 0:
            raise self._fail("critic_learning_rate", f"must be > 0, got {self.critic_learning_rate}.")
        for name in ("critic_steps", "replay_capacity"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
        if self.critic_hidden_size is not None and self.critic_hidden_size < 1:
            raise self._fail("critic_hidden_size", "must be >= 1 or null.")
        if self.critic_max_tokens < 8:
            raise self._fail("critic_max_tokens", f"must be >= 8, got {self.critic_max_tokens}.")
        if self.critic_pooling not in ("mean", "last"):
            raise self._fail("critic_pooling", f"must be mean or last, got {self.critic_pooling!r}.")


# ---- shared trainer machinery --------------------------------------------------------------------------
class OnlineTrainerBase:
    """Rollouts, the actor, evaluation, checkpoints and resume for iteration-based online trainers.

    Subclasses implement :meth:`_setup_extra` (their extra modules, called after the actor is ready),
    :meth:`_update` (one iteration's learning from the new trajectories), and the ``_extra_state`` pair that
    saves and restores those modules inside each checkpoint.
    """

    config: OnlinePolicyConfig

    def __init__(self, config: OnlinePolicyConfig) -> None:
        self.config = config
        self.suite, self.eval_suite = config.load_suites()
        self.model_dir = config.check_model_dir()
        config.check_runtime()
        self.output_dir = Path(config.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.train_tasks = self.suite.split(config.train_split)
        self.eval_tasks = self.eval_suite.split(config.eval_split)[: config.eval_tasks]
        self.episodes = 0

    # ---- hooks -------------------------------------------------------------------------------------
    def _setup_extra(self, resume_from: Path | None) -> None:
        raise NotImplementedError

    def _update(self, iteration: int, trajectories: list[Trajectory]) -> dict[str, float]:
        raise NotImplementedError

    def _save_extra_state(self, directory: Path) -> None:
        raise NotImplementedError

    def _checkpoint_state(self) -> dict[str, Any]:
        return {}

    # ---- the run -----------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run (or resume) training; returns the summary also written to ``summary.json``."""
        from agentgym.models.loading import load_model
        from agentgym.policies.hf import HFPolicy

        cfg = self.config
        torch.manual_seed(cfg.seed)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLogger.from_config(self.output_dir, cfg)
        resume_from = latest_checkpoint(self.checkpoint_dir)
        source = resume_from / "model" if resume_from else self.model_dir
        self.model, self.tokenizer = load_model(source, cfg.load_options())
        summary: dict[str, Any] = {"config": cfg.to_dict(), "trainer": cfg.trainer_name}
        if resume_from is None:
            (self.output_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")
            if cfg.warmstart == "bc":
                demos = collect_demonstrations(self.suite, cfg.train_split, cfg.bc_demos, self.tokenizer,
                                               shortcut_fraction=cfg.bc_shortcut_fraction, seed=cfg.seed,
                                               system_prompt=cfg.system_prompt)
                summary["bc"] = behaviour_clone(self.model, self.tokenizer, demos, steps=cfg.bc_steps,
                                                learning_rate=cfg.bc_learning_rate, batch_size=cfg.bc_batch_size,
                                                seed=cfg.seed, device=cfg.device,
                                                log=lambda s, m: self.metrics.log(0, {**m, "bc/step": s}))
        self.actor_optimizer = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad],
                                                lr=cfg.actor_learning_rate)
        self.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(self.actor_optimizer, lambda _: 1.0)
        self.policy = HFPolicy(self.model, self.tokenizer, device=cfg.device, max_batch_size=cfg.max_in_flight,
                               name=cfg.trainer_name)
        start = 0
        self._setup_extra(resume_from)  # before the RNG restore, so module init does not shift it
        if resume_from is not None:
            state = load_checkpoint(resume_from, self.actor_optimizer, self.actor_scheduler)
            start, self.episodes = int(state["step"]), int(state.get("episodes", 0))
            self._restore_state(state)
            summary["resumed_from"] = str(resume_from)
        if start == 0:
            summary["eval_before"] = self._evaluate(0)
        for iteration in track(range(start, cfg.iterations), f"{cfg.trainer_name} iterations", completed=start,
                               unit="it", enabled=cfg.progress):
            t0 = time.perf_counter()
            trajectories = self._rollout(iteration)
            self.episodes += len(trajectories)
            t_rollout = time.perf_counter() - t0
            stats = self._update(iteration, trajectories)
            rollout = summarize(trajectories)
            done = iteration + 1
            self._log(done, {"train/success_rate": rollout.get("success_rate", 0.0),
                             "train/mean_turns": rollout.get("mean_turns", 0.0),
                             "train/return_mean": sum(t.total_reward for t in trajectories) / max(len(trajectories), 1),
                             "train/episodes": float(self.episodes), **stats,
                             "time/rollout_s": t_rollout, "time/step_s": time.perf_counter() - t0})
            if cfg.eval_every and done % cfg.eval_every == 0 and done != cfg.iterations:
                self._evaluate(done)
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done != cfg.iterations:
                self._save(done)
        summary["eval_after"] = self._evaluate(cfg.iterations)
        summary["episodes"] = self.episodes
        self.model.save_pretrained(self.output_dir / "model")
        self.tokenizer.save_pretrained(self.output_dir / "model")
        self._save_defaults(self.output_dir / "model")
        self._save(cfg.iterations)
        plot_learning_curve(self.metrics.path, self.output_dir / "learning_curve.png")
        (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        self.metrics.close()
        return summary

    def _restore_state(self, state: dict[str, Any]) -> None:
        """Subclass hook: restore extra modules/buffers from a checkpoint's state dict."""

    def _save(self, done: int) -> None:
        def extra(model_dir: Path) -> None:
            self._save_defaults(model_dir)
            self._save_extra_state(model_dir.parent)

        save_checkpoint(self.checkpoint_dir, done, self.model, self.tokenizer, self.actor_optimizer,
                        self.actor_scheduler, {"episodes": self.episodes, **self._checkpoint_state()},
                        self.config.keep_checkpoints, extra)

    def _save_defaults(self, model_dir: Path) -> None:
        from agentgym.policies.rollout_defaults import save_rollout_defaults

        save_rollout_defaults(model_dir, system_prompt=self.config.system_prompt,
                              max_tokens=self.config.max_tokens_per_turn, suite=self.config.suite)

    def _log(self, step: int, metrics: dict[str, Any]) -> None:
        self.metrics.log(step, metrics)
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()
                 if k in ("train/success_rate", "eval/success_rate", "critic/loss", "actor/loss", "time/step_s",
                          "train/errors")}  # errored episodes are dropped from the update: show how many
        logger.info("iteration %d %s", step, shown)

    # ---- data --------------------------------------------------------------------------------------
    def _rollout_config(self, sampling: SamplingParams) -> RolloutConfig:
        return RolloutConfig(max_in_flight=self.config.max_in_flight, sampling=sampling,
                             system_prompt=self.config.system_prompt,
                             max_context_tokens=self.config.max_context_tokens, deterministic=True)

    def _tasks_for_iteration(self, iteration: int) -> list[Task]:
        """The data cursor: a seeded permutation of the train split per epoch over it, read in order."""
        cfg = self.config
        n, chosen = len(self.train_tasks), []
        for k in range(iteration * cfg.episodes_per_iteration, (iteration + 1) * cfg.episodes_per_iteration):
            epoch, offset = divmod(k, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(cfg.seed, epoch)))
            chosen.append(self.train_tasks[int(order[offset])])
        return chosen

    def _rollout(self, iteration: int) -> list[Trajectory]:
        cfg = self.config
        specs = [EpisodeSpec(self.suite.env_id, task=task, seed=mix_seed(cfg.seed, iteration, k) % (2**31),
                             group_id=f"{iteration}/{k}", env_kwargs=dict(self.suite.env_kwargs))
                 for k, task in enumerate(self._tasks_for_iteration(iteration))]
        sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature,
                                  seed=mix_seed(cfg.seed, iteration, 1))
        self.model.eval()
        return RolloutEngine(self.policy, self._rollout_config(sampling)).run(specs)

    def _decode(self, ids: tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _transitions(self, trajectories: list[Trajectory], gamma: float) -> list[Transition]:
        out: list[Transition] = []
        for t in trajectories:
            out.extend(transitions_from_trajectory(t, self._decode, gamma=gamma, episode=t.group_id or None))
        return out

    # ---- the actor ---------------------------------------------------------------------------------
    def _sample_utterances(self, states: list[tuple[int, ...]], seed: int) -> list[tuple[int, ...]]:
        """Fresh utterances ``a_pi ~ pi(. | s)`` at buffer states (no gradient)."""
        cfg = self.config
        self.model.eval()
        params = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, seed=seed)
        generations = self.policy.generate([list(s) for s in states], params)
        return [tuple(g.token_ids or ()) for g in generations]

    def _utterance_logprobs(self, states: list[tuple[int, ...]], actions: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B, L] log-probs, [B, L] mask)`` of each utterance given its state (right-padded, exact ids)."""
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
        logp = sequence_logprobs(self.model, ids.to(cfg.device), attention.to(cfg.device), cfg.temperature)
        return logp, mask.to(cfg.device)

    def _clip_and_step(self, parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> float:
        limit = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(parameters, limit)
        optimizer.step()
        return float(norm)

    # ---- evaluation --------------------------------------------------------------------------------
    def _evaluate(self, step: int) -> dict[str, Any]:
        cfg = self.config
        sampling = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.eval_temperature,
                                  seed=mix_seed(cfg.seed, 999))
        specs = [EpisodeSpec(self.eval_suite.env_id, task=t, seed=i, env_kwargs=dict(self.eval_suite.env_kwargs))
                 for i, t in enumerate(self.eval_tasks)]
        started = time.perf_counter()
        self.model.eval()
        result = summarize(RolloutEngine(self.policy, self._rollout_config(sampling)).run(specs))
        result["wall_s"] = time.perf_counter() - started
        self._log(step, {**{f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))},
                         "eval/episodes_seen": float(self.episodes)})
        return result


# ---- ArCHer -------------------------------------------------------------------------------------------
class ArcherTrainer(OnlineTrainerBase):
    """``ArcherTrainer(config).train()``; see the module docstring for the order of work."""

    config: ArcherConfig

    def __init__(self, config: ArcherConfig) -> None:
        super().__init__(config)

    def _build_critic(self) -> Any:
        from agentgym.trainers.critic import UtteranceCritic

        cfg = self.config
        kwargs: dict[str, Any] = dict(hidden_size=cfg.critic_hidden_size, max_tokens=cfg.critic_max_tokens,
                                      pooling=cfg.critic_pooling, device=cfg.device)
        if cfg.critic_encoder == "minilm":
            return UtteranceCritic.from_minilm(**kwargs)
        return UtteranceCritic.from_policy(self.model, self.tokenizer, **kwargs)

    def _setup_extra(self, resume_from: Path | None) -> None:
        import copy

        cfg = self.config
        torch.manual_seed(mix_seed(cfg.seed, 17))  # critic heads start the same whether or not we resume
        self.critic = self._build_critic()
        self.target_critic = copy.deepcopy(self.critic)  # hard copy at init (tau = 1)
        for p in self.target_critic.parameters():
            p.requires_grad_(False)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_learning_rate)
        self.replay = ReplayBuffer(self.output_dir / "replay.jsonl", capacity=cfg.replay_capacity)
        if resume_from is not None:
            blob = torch.load(resume_from / "critic.pt", weights_only=False)
            self.critic.load_state_dict(blob["critic"])
            self.target_critic.load_state_dict(blob["target_critic"])
            self.critic_optimizer.load_state_dict(blob["critic_optimizer"])
        elif self.replay.total:
            self.replay.truncate(0)  # a fresh run must not inherit a stale buffer from a run that never checkpointed

    def _restore_state(self, state: dict[str, Any]) -> None:
        self.replay.truncate(int(state["replay_total"]))

    def _checkpoint_state(self) -> dict[str, Any]:
        return {"replay_total": self.replay.total}

    def _save_extra_state(self, directory: Path) -> None:
        torch.save({"critic": self.critic.state_dict(), "target_critic": self.target_critic.state_dict(),
                    "critic_optimizer": self.critic_optimizer.state_dict()}, directory / "critic.pt")

    def _update(self, iteration: int, trajectories: list[Trajectory]) -> dict[str, float]:
        cfg = self.config
        self.replay.extend(self._transitions(trajectories, cfg.gamma))
        stats: dict[str, float] = {"replay/size": float(len(self.replay)),
                                   "train/errors": float(sum(t.error is not None for t in trajectories))}
        if len(self.replay) == 0:
            return {**stats, "train/skipped_update": 1.0}
        generator = torch.Generator().manual_seed(mix_seed(cfg.seed, iteration, 2))
        t0 = time.perf_counter()
        stats.update(self._critic_phase(iteration, generator))
        stats["time/critic_s"] = time.perf_counter() - t0
        if iteration >= cfg.warmup_iterations:
            t0 = time.perf_counter()
            stats.update(self._actor_phase(iteration, generator))
            stats["time/actor_s"] = time.perf_counter() - t0
        return stats

    def _critic_phase(self, iteration: int, generator: torch.Generator) -> dict[str, float]:
        cfg = self.config
        losses, norms, q_means, v_means = [], [], [], []
        fitted, returns = [], []  # min(Q1, Q2) at buffer actions vs their Monte-Carlo returns (diagnostic)
        self.critic.train()
        params = [p for p in self.critic.parameters() if p.requires_grad]
        for step in range(cfg.critic_steps):
            self.critic_optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in range(cfg.grad_accum_steps):
                b = self.replay.sample(cfg.batch_size, generator)
                fresh = self._sample_utterances([t.state_ids for t in b], mix_seed(cfg.seed, iteration, 3, step, micro))
                fresh_text = [self._decode(a) for a in fresh]
                with torch.no_grad():
                    h_next = self.target_critic.encode([t.next_state for t in b])
                    h_s_bar = self.target_critic.encode([t.state for t in b])
                    y_q = alg.td_targets(torch.tensor([t.reward for t in b]), self.target_critic.v_values(h_next),
                                         torch.tensor([t.terminated for t in b]), torch.tensor([t.truncated for t in b]),
                                         gamma=cfg.gamma, bootstrap_truncated=cfg.bootstrap_truncated)
                    y_v = self.target_critic.q_values(h_s_bar, self.target_critic.encode(fresh_text))
                # Buffer and fresh actions reach the critic as the same kind of text: decoded from their ids
                # (special tokens kept), as the states are; Q fit on stripped text but read on raw text
                # would judge fresh samples on inputs it never saw.
                actions = [self._decode(t.action_ids) if t.action_ids else t.action for t in b]
                q, v = self.critic([t.state for t in b], actions)
                loss = alg.archer_critic_loss(q, v, y_q.to(q.device), y_v.to(q.device)) / cfg.grad_accum_steps
                loss.backward()
                total += float(loss.detach())
                q_means.append(float(q.detach().mean()))
                v_means.append(float(v.detach().mean()))
                fitted.append(q.detach().min(dim=0).values.cpu())
                returns.append(torch.tensor([t.mc_return for t in b], dtype=torch.float32))
            norms.append(self._clip_and_step(params, self.critic_optimizer))
            alg.polyak_update(self.target_critic, self.critic, cfg.tau)
            losses.append(total)
        self.critic.eval()
        return {"critic/loss": sum(losses) / len(losses), "critic/grad_norm": sum(norms) / len(norms),
                "critic/q_mean": sum(q_means) / len(q_means), "critic/v_mean": sum(v_means) / len(v_means),
                "critic/explained_variance": alg.explained_variance(torch.cat(fitted), torch.cat(returns))}

    def _actor_phase(self, iteration: int, generator: torch.Generator) -> dict[str, float]:
        cfg = self.config
        losses, norms, advantages = [], [], []
        params = [p for p in self.model.parameters() if p.requires_grad]
        for step in range(cfg.actor_steps):
            self.actor_optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for micro in range(cfg.grad_accum_steps):
                b = self.replay.sample(cfg.batch_size, generator)
                states = [t.state_ids for t in b]
                fresh = self._sample_utterances(states, mix_seed(cfg.seed, iteration, 4, step, micro))
                with torch.no_grad():
                    q, v = self.critic([t.state for t in b], [self._decode(a) for a in fresh])
                    adv = alg.utterance_advantage(q, v)
                self.model.train()
                logp, mask = self._utterance_logprobs(states, fresh)
                loss = alg.archer_actor_loss(adv.to(logp.device), logp, mask) / cfg.grad_accum_steps
                loss.backward()
                total += float(loss.detach())
                advantages.extend(adv.tolist())
            norms.append(self._clip_and_step(params, self.actor_optimizer))
            losses.append(total)
        self.model.eval()
        adv = torch.tensor(advantages, dtype=torch.float64)
        return {"actor/loss": sum(losses) / len(losses), "actor/grad_norm": sum(norms) / len(norms),
                "actor/advantage_mean": float(adv.mean()), "actor/advantage_abs": float(adv.abs().mean()),
                "actor/advantage_std": float(adv.std(unbiased=False))}
