"""Collecting episodes: the rollout engine, the multi-agent engine, branching rollouts, Ray env workers.

One idea per module:

* :mod:`~agentgym.rollout.specs`: what a run plays (:class:`RolloutConfig`, :class:`EpisodeSpec`);
* :mod:`~agentgym.rollout.engine`: :class:`RolloutEngine`, the one way single-agent episodes are run, for
  evaluation and for training;
* :mod:`~agentgym.rollout.turns`: the turn protocol every engine shares (apply an action, record the turn, end
  the episode);
* :mod:`~agentgym.rollout.batching`, :mod:`~agentgym.rollout.executor`, :mod:`~agentgym.rollout.env_reuse`: policy
  calls batched across episodes, env calls on worker threads under a timeout, envs reused between episodes;
* :mod:`~agentgym.rollout.context` and :mod:`~agentgym.rollout.segments`: what a long conversation becomes (a window,
  dropped tool outputs, a summary: each a plain function of the history) and the token budgets; a rewrite starts a
  new token-exact segment;
* :mod:`~agentgym.rollout.summaries`: aggregate metrics of a run; :mod:`~agentgym.rollout.reference`: an env
  played by its reference solver;
* :mod:`~agentgym.rollout.multi_agent`, :mod:`~agentgym.rollout.branching` and :mod:`~agentgym.rollout.ray_envs`
  build on them: whole multi-agent games, ARPO's branching sampler, envs in Ray actors.
"""

from __future__ import annotations

from agentgym.rollout.batching import PolicyBatcher, act_per_request
from agentgym.rollout.context import ContextConfig
from agentgym.rollout.engine import RolloutEngine
from agentgym.rollout.env_reuse import DISCARD_THREAD_NAME, IDLE_CHEAP_ENVS, IdleCheapEnvs, discard_env
from agentgym.rollout.executor import EnvExecutor, call_env, run_coroutine
from agentgym.rollout.multi_agent import (
    MultiAgentEpisode,
    MultiAgentEpisodeSpec,
    MultiAgentRolloutConfig,
    MultiAgentRolloutEngine,
)
from agentgym.rollout.reference import run_reference_episode
from agentgym.rollout.specs import EpisodeSpec, RolloutConfig, episodes_for_suite
from agentgym.rollout.summaries import error_reason, summarize
from agentgym.rollout.turns import (
    TurnResult,
    action_choices_of,
    apply_action,
    apply_action_inline,
    context_limit_outcome,
    context_limit_reached,
    episode_outcome,
    error_outcome,
    final_state,
    keyed_step,
    log_context_refusal,
    make_turn,
    open_conversation,
    read_state_key,
    turn_sampling,
)

__all__ = ["DISCARD_THREAD_NAME", "IDLE_CHEAP_ENVS", "act_per_request", "action_choices_of", "apply_action",
           "apply_action_inline", "call_env", "ContextConfig", "context_limit_outcome", "context_limit_reached", "discard_env",
           "EnvExecutor", "episode_outcome", "episodes_for_suite", "EpisodeSpec", "error_outcome", "error_reason",
           "final_state", "IdleCheapEnvs", "keyed_step", "log_context_refusal", "make_turn", "MultiAgentEpisode",
           "MultiAgentEpisodeSpec", "MultiAgentRolloutConfig", "MultiAgentRolloutEngine", "open_conversation",
           "PolicyBatcher", "read_state_key", "RolloutConfig", "RolloutEngine", "run_coroutine",
           "run_reference_episode", "summarize", "turn_sampling", "TurnResult"]
