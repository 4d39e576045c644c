"""How much of the return variance a finished ArCHer run's critic explains on held-out trajectories.

The trainer logs ``critic/explained_variance`` on the replay batches it trains the critic on: turns of training
tasks the critic has fit, often several times. That says the regression converged, not that the critic ranks the
actor's choices on a maze it never saw, which is what ArCHer's advantage ``min(Q) - min(V)`` relies on. So after
training, the run's final policy plays fresh episodes of the held-out split at its training temperature (varied
returns, as in the replay buffer), each turn becomes the same transition the buffer would hold (the critic's
``critic_input`` view of the state, the decoded action, its Monte-Carlo return under the run's ``gamma``), and the
final critic's ``min(Q1, Q2)`` is compared with those returns: ``1 - Var(G - Q) / Var(G)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["archer_trainer", "held_out_explained_variance", "held_out_turns", "maze_oracles"]


def held_out_explained_variance(run_dir: Path, config: dict[str, Any], episodes: int,
                                chunk: int = 64) -> dict[str, Any]:
    """``{explained_variance, turns, episodes, success, split, ...}`` of the run's final critic on ``episodes``
    fresh episodes of the run's held-out split (its first tasks, one episode each, seeds 0..n-1), with
    ``archer_critic_fit.move_ranking``'s figures: does the critic prefer the maze's better moves at one state?

    Raises:
        FileNotFoundError: the run left no final model or no checkpoint with the critic (it did not finish).
    """
    import torch
    from archer_critic_fit import move_ranking

    from agentgym.trainers.algorithms.archer import explained_variance
    from agentgym.trainers.checkpoint import latest_checkpoint

    model_dir, checkpoint = run_dir / "model", latest_checkpoint(run_dir / "checkpoints")
    if not (model_dir / "config.json").is_file() or checkpoint is None or not (checkpoint / "critic.pt").is_file():
        raise FileNotFoundError(f"{run_dir}: no final model and critic checkpoint; finish the ArCHer run first")
    trainer = archer_trainer(config, model_dir)
    trainer.critic = trainer._build_critic()
    trainer.critic.load_state_dict(torch.load(checkpoint / "critic.pt", weights_only=False)["critic"])
    trainer.critic.eval()
    trajectories, turns, actions = held_out_turns(trainer, episodes)
    fitted: list[float] = []
    with torch.no_grad():
        for i in range(0, len(turns), chunk):
            q, _ = trainer.critic([t.state for t in turns[i:i + chunk]], actions[i:i + chunk])
            fitted += q.min(dim=0).values.cpu().tolist()
    returns = [t.mc_return for t in turns]
    value = explained_variance(torch.tensor(fitted), torch.tensor(returns)) if turns else float("nan")
    return {"explained_variance": None if value != value else float(value), "turns": len(turns),
            "episodes": len(trajectories), "split": trainer.config.eval_split,
            "critic_input": trainer.config.critic_input,
            "success": sum(t.success for t in trajectories) / max(len(trajectories), 1),
            **maze_oracles(turns), **move_ranking(trainer.critic, turns, actions, chunk)}


def archer_trainer(config: dict[str, Any], model_dir: Path) -> Any:
    """An ArCHer trainer of the run's ``config`` holding the policy in ``model_dir`` in eval mode: what turns
    played episodes into the critic's transitions (its ``critic_input`` view of each state, Monte-Carlo returns
    under the run's ``gamma``)."""
    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict

    trainer = make_trainer(config_from_dict(config))
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.model.eval()
    return trainer


def held_out_turns(trainer: Any, episodes: int, per_task: int = 1) -> tuple[list[Any], list[Any], list[str]]:
    """``(trajectories, turns, actions)``: the trainer's policy plays ``per_task`` episodes of each of the first
    ``episodes`` tasks of the run's held-out split at its training temperature (task ``i``'s ``j``-th episode
    samples with seed ``i + j * episodes``, so episode ``k`` plays task ``k % episodes``), each turn as the
    transition the replay buffer would hold, and each action's decoded text."""
    from agentgym.policies import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.registration.suites import load_suite
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    cfg = trainer.config
    suite = load_suite(cfg.eval_suite or cfg.suite)
    env_kwargs = {**suite.env_kwargs, **cfg.env_kwargs}
    tasks = suite.split(cfg.eval_split)[:episodes]
    specs = [EpisodeSpec(suite.env_id, task=task, seed=i, env_kwargs=dict(env_kwargs),
                         sampling_seed=i + j * len(tasks))
             for j in range(per_task) for i, task in enumerate(tasks)]
    rollout = RolloutConfig(max_in_flight=256, system_prompt=cfg.system_prompt,
                            max_context_tokens=cfg.max_context_tokens, context=cfg.context,
                            sampling=SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature,
                                                    top_p=cfg.top_p))
    policy = HFPolicy(trainer.model, trainer.tokenizer, max_batch_size=64, device=cfg.device)
    try:
        trajectories = RolloutEngine(policy, rollout).run(specs)
    finally:
        policy.close()  # its slot cache now, not whenever the collector finds it
    turns = trainer._transitions(0, trajectories, cfg.gamma)
    actions = [trainer._decode(t.action_ids) if t.action_ids else t.action for t in turns]
    return trajectories, turns, actions


def maze_oracles(turns: list[Any]) -> dict[str, float | None]:
    """How much of the same returns two text-free predictors explain (``None`` off the maze), each turn predicted by
    the mean return of all these turns that share its key: ``distance_explained_variance`` keys on the state's
    shortest-path distance to the exit, ``move_explained_variance`` on that distance and whether the turn's move
    heads for the exit. A state that shows no grid (the error after a malformed call, when the critic reads the
    observation alone) is its own group.

    Fit on the very turns they score, over a few dozen keys, these are what a critic that knew each state's
    distance (and each move's direction) and the policy's success from there would reach. What the second leaves
    is mostly the coin flips of sampling at temperature 1, which no critic can predict; the gap between the two is
    what Q(s, a) can explain and V(s) cannot. They put the critic's figure on a scale.
    """
    from archer_critic_fit import explained, heads_for_exit, maze_distance, tabulated

    if len(turns) < 2 or all(maze_distance(t.state) is None for t in turns):
        return {"distance_explained_variance": None, "move_explained_variance": None}
    returns = [t.mc_return for t in turns]
    out: dict[str, float | None] = {}
    for name, key in (("distance_explained_variance", lambda t: maze_distance(t.state)),
                      ("move_explained_variance", lambda t: (maze_distance(t.state), heads_for_exit(t)))):
        predict = tabulated(turns, key)
        value = explained([predict(t) for t in turns], returns)
        out[name] = None if value != value else float(value)
    return out
