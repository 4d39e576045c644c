"""The one definition of an episode's return, shared by every trainer.

An episode's **return** is its outcome score (``Trajectory.score``): what the env's grader paid, what evaluation
reports, and what GRPO compares within a group. Step-level methods (GiGPO's step returns, ArCHer's TD targets,
filtered BC's episode returns) need it split over turns; the env contract says the step rewards of an episode sum
to its score (the last step pays the remainder). An episode cut from outside before the env could pay it (the
context limit, or a wrapper's time limit) breaks that sum, so :func:`step_rewards` books the difference on the last
turn. Every trainer reads rewards through here, so GRPO, GiGPO, ARPO, ArCHer and filtered BC optimise the same
quantity. Reward shaping (GRPO's ``reward: dra|gra``) is applied on top, by the trainer that asks for it.
"""

from __future__ import annotations

from agentgym.trajectory import Trajectory

__all__ = ["episode_return", "step_rewards"]


def episode_return(trajectory: Trajectory) -> float:
    """The episode's return: its outcome score (0 for an episode that ended in an error)."""
    return trajectory.score


def step_rewards(trajectory: Trajectory) -> list[float]:
    """Per-turn rewards that sum to :func:`episode_return`: the env's step rewards, the shortfall on the last turn."""
    rewards = [float(turn.reward) for turn in trajectory.turns]
    if rewards:
        rewards[-1] += episode_return(trajectory) - sum(rewards)
    return rewards
