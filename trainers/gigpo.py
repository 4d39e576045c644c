"""GiGPO: GRPO plus a critic-free step-level advantage from anchor-state groups (Feng et al., 2025, arXiv 2505.10978).

``GigpoTrainer(config).train()`` is the GRPO loop with one part swapped: the advantage estimate. Within each task
group, every visit to the same environment state (the env's ``state_key()``, recorded by the rollout engine on
each turn before the action, so trajectories from any policy, ``OpenAIPolicy`` included, carry it) forms an
anchor group, and each visit's discounted return-to-go is compared with the group's mean. A token of step ``t``
of trajectory ``i`` gets ``A^E(tau_i) + omega * A^S(i, t)``; everything after (masks, the clipped loss with exact
token counts, KL, packing, checkpoints) is GRPO's. Rewards are each turn's share of the episode's return
(:func:`agentgym.trainers.returns.step_rewards`), so ``A^E`` compares the same returns GRPO does.

Each step logs ``gigpo/anchor_groups``, ``gigpo/anchor_group_size_mean``/``_max`` and
``gigpo/steps_in_shared_anchor`` (the share of steps whose state some other visit shares: 0 means GiGPO
reduced to GRPO on that batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentgym.trainers import algorithms as alg
from agentgym.trainers.algorithms.advantages import group_advantages, match_mean_abs
from agentgym.trainers.algorithms.gigpo import advantage_agreement
from agentgym.trainers.batch import TrainingBatch, per_row
from agentgym.trainers.gigpo_config import GigpoConfig
from agentgym.trainers.grpo import GrpoTrainer, trained_steps
from agentgym.trainers.returns import episode_return, step_rewards
from agentgym.trajectory import Trajectory

UNPARSED_KINDS = frozenset({"invalid", "void"})
"""Turn kinds whose action did not parse into a valid action, so GiGPO's invalid-action penalty applies: ``void``
(no tool call found) as well as ``invalid`` (a call that could not be read or run). The reference code's
``is_action_valid`` is false for both; penalising only ``invalid`` let a policy drift into void turns unpunished."""

__all__ = ["GigpoConfig", "GigpoTrainer", "anchor_keys", "compare_with_grpo", "step_advantages"]


class GigpoTrainer(GrpoTrainer):
    """``GigpoTrainer(config).train()``; see the module docstring."""

    config: GigpoConfig

    def _token_advantages(self, trajectories: list[Trajectory], scores: torch.Tensor, stats_mask: torch.Tensor,
                          usable: list[int], batch: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Each step's ``A^E + omega * A^S`` on that step's tokens. Trajectories left out of the group statistics
        (errors, and masked ones when ``exclude_masked_from_group_stats``) neither join a group nor get an
        advantage."""
        counted = [i for i, keep in enumerate(stats_mask.tolist()) if keep and trajectories[i].turns]
        result = step_advantages([trajectories[i] for i in counted], self.config)
        per_step = dict(zip(counted, result.advantages)) if result is not None else {}
        stats = dict(result.stats) if result is not None else {}
        own = [per_step.get(i, torch.zeros(len(trajectories[i].turns))) for i in usable]
        if self.config.advantage_control == "shuffle":  # the control deals steps' values, not whole episodes'
            lengths = [len(a) for a in own]
            flat = torch.cat(own) if own else torch.zeros(0)
            shuffled = alg.shuffle_advantages(flat, trained_steps(batch, lengths), self._control_generator())
            own = list(torch.split(shuffled, lengths)) if own else []
        steps = per_row(batch, own)
        turn_index = batch.turn_index if batch.turn_index is not None else torch.zeros_like(batch.input_ids) - 1
        rows = alg.broadcast_steps_to_tokens(steps, turn_index)
        if self.config.advantage_scale == "grpo":  # GRPO's scale on this very batch (see GigpoConfig.advantage_scale)
            reference = self._episode_rows(self._episode_advantages(trajectories, scores, stats_mask, usable), batch)
            trained = (batch.loss_mask > 0) & (turn_index >= 0)
            rows, factor = match_mean_abs(rows, reference.to(rows.dtype), trained)
            stats["gigpo/scale_factor"] = factor
        return rows, stats


def step_advantages(trajectories: Sequence[Trajectory], config: GigpoConfig) -> alg.GigpoAdvantages | None:
    """GiGPO's per-step advantages of ``trajectories`` (grouped by ``group_id``) as ``config`` says; ``None`` for
    none. Works on any recorded trajectories, token ids or not (e.g. from ``OpenAIPolicy`` in chat mode), since
    anchors and rewards come from the turns."""
    if not trajectories:
        return None
    return alg.gigpo_advantages(
        [t.group_id for t in trajectories], [anchor_keys(t) for t in trajectories],
        [step_rewards(t) for t in trajectories], [[turn.kind not in UNPARSED_KINDS for turn in t.turns] for t in trajectories],
        gamma=config.gamma, omega=config.omega, mode=config.gigpo_mode, episode_stats=config.episode_stats,
        invalid_penalty=config.invalid_penalty, similarity_thresh=config.similarity_thresh,
        singleton=config.singleton_advantage)


def anchor_keys(trajectory: Trajectory) -> list[str]:
    """Per turn, the anchor state GiGPO groups by: the env's ``state_key()`` recorded before the action, or, for
    trajectories recorded without one, the raw observation the action answered (no history: with it no two states
    would ever match, and GiGPO would reduce to GRPO)."""
    return [turn.state_key if turn.state_key is not None else f"observation:{turn.observation}"
            for turn in trajectory.turns]


def compare_with_grpo(trajectories: Sequence[Trajectory], config: GigpoConfig) -> dict[str, float | None]:
    """:func:`~agentgym.trainers.algorithms.gigpo.advantage_agreement` of GRPO's and GiGPO's advantages on recorded
    trajectories, each computed as its trainer would (GRPO: the ``advantage`` estimator on episode returns per task
    group; GiGPO: ``config``'s settings), weighted by each step's sampled tokens. Trajectories that errored or have
    no turns are left out, as both trainers leave them out of their statistics. Also returns GiGPO's
    ``steps_in_shared_anchor`` (0: every state is visited once, and GiGPO is GRPO on this batch), each method's
    :func:`~agentgym.trainers.algorithms.advantage_drift` (GRPO's under ``token-mean`` and ``seq-mean-token-mean``,
    GiGPO's under ``token-mean``) and the mean sampled tokens of a solved and of a failed trajectory."""
    kept = [t for t in trajectories if t.turns and t.error is None and t.end_reason != "error"]
    result = step_advantages(kept, config)
    if result is None:
        return {**advantage_agreement([], alg.GigpoAdvantages([], [], [], [], [], [], []), []),
                "steps_in_shared_anchor": None, "trajectories": 0.0}
    scores = torch.tensor([episode_return(t) for t in kept], dtype=torch.float32)
    grpo = group_advantages(scores, [t.group_id for t in kept], mode=config.advantage,
                            singleton=config.singleton_advantage)
    episode_level = [torch.full((len(t.turns),), float(grpo[i])) for i, t in enumerate(kept)]
    tokens = [[len(turn.action_token_ids) if turn.action_token_ids is not None else max(1, len(turn.action.split()))
               for turn in t.turns] for t in kept]
    solved = [sum(n) for t, n in zip(kept, tokens) if t.success]
    failed = [sum(n) for t, n in zip(kept, tokens) if not t.success]
    return {**advantage_agreement(episode_level, result, tokens),
            "steps_in_shared_anchor": result.stats.get("gigpo/steps_in_shared_anchor"),
            # the net advantage each loss weighting puts on the batch's tokens (alg.advantage_drift: why it matters)
            "grpo_drift_token_mean": alg.advantage_drift(episode_level, tokens, mode="token-mean"),
            "grpo_drift_seq_mean_token_mean": alg.advantage_drift(episode_level, tokens, mode="seq-mean-token-mean"),
            "gigpo_drift_token_mean": alg.advantage_drift(result.advantages, tokens, mode="token-mean"),
            "tokens_solved_mean": sum(solved) / len(solved) if solved else None,
            "tokens_failed_mean": sum(failed) / len(failed) if failed else None,
            "trajectories": float(len(kept))}
