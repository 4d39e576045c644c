"""Where a finished run's held-out tool calls go: the mean over solved episodes and over failed ones.

The ARPO goal compares tool calls per episode, and on a task with a turn cap a failed episode spends every call it
is allowed. Mean calls then mostly count failures (on guess-the-number, a failure is always 8 guesses), so the
split says whether a method spends fewer calls where it succeeds, which is what branching could change. The final
policy plays the run's own held-out evaluation again (the same split, tasks, seeds and greedy decoding), so its
success rate is the one the run logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["tool_calls_by_outcome"]


def tool_calls_by_outcome(run_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """``{success, calls, calls_solved, calls_failed, episodes, split}`` of the run's final model on its held-out
    evaluation (``calls_solved`` / ``calls_failed`` are ``None`` when no episode solved / failed).

    Raises:
        FileNotFoundError: the run left no final model (it did not finish).
    """
    from agentgym.models import load_tiny_model
    from agentgym.policies import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.registration.suites import load_suite
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
    from agentgym.trainers.config import config_from_dict

    model_dir = run_dir / "model"
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir}: no final model; finish the run first")
    cfg = config_from_dict(config)
    model, tokenizer = load_tiny_model(model_dir)
    suite = load_suite(cfg.eval_suite or cfg.suite)
    specs = [EpisodeSpec(suite.env_id, task=task, seed=i, env_kwargs=dict(suite.env_kwargs))
             for i, task in enumerate(suite.split(cfg.eval_split)[:cfg.eval_tasks])]
    rollout = RolloutConfig(max_in_flight=256, system_prompt=cfg.system_prompt,
                            max_context_tokens=cfg.max_context_tokens, context=cfg.context, deterministic=True,
                            sampling=SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=0.0))
    policy = HFPolicy(model.eval(), tokenizer, max_batch_size=64, device=cfg.device)
    try:
        trajectories = RolloutEngine(policy, rollout).run(specs)
    finally:
        policy.close()

    def mean_calls(group: list[Any]) -> float | None:
        return sum(t.num_tool_calls for t in group) / len(group) if group else None

    solved = [t for t in trajectories if t.success]
    failed = [t for t in trajectories if not t.success]
    return {"success": len(solved) / len(trajectories), "calls": mean_calls(trajectories),
            "calls_solved": mean_calls(solved), "calls_failed": mean_calls(failed),
            "episodes": len(trajectories), "split": cfg.eval_split}
