"""The turn protocol every rollout engine shares: open the conversation, apply an action, end the episode.

The engine (:mod:`agentgym.rollout.engine`), the branching sampler (:mod:`agentgym.rollout.branching`) and the
multi-agent engine (:mod:`agentgym.rollout.multi_agent`) take every turn through these functions, so a trajectory
records the same fields whichever sampler made it. The step primitives that the reference episode needs too
(:func:`keyed_step`, :func:`read_state_key`, :func:`episode_outcome`) are defined with it in :mod:`agentgym.reference`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError, ContextLengthExceeded
from agentgym.policies.base import Generation, Policy, SamplingParams
from agentgym.reference import episode_outcome, keyed_step, read_state_key
from agentgym.rollout.executor import call_env
from agentgym.rollout.specs import RolloutConfig
from agentgym.trajectory import Turn, jsonable
from agentgym.utils.fast_records import quick_init
from agentgym.utils.images import ImageRef, observation_parts

__all__ = ["TurnResult", "action_choices_of", "apply_action", "apply_action_inline", "context_limit_outcome",
           "pay_due_reward", "truncation_outcome",
           "context_limit_reached", "episode_outcome", "error_outcome", "final_state", "keyed_step",
           "log_context_refusal", "make_turn", "open_conversation", "read_state_key", "record_action", "text_of",
           "turn_sampling"]

logger = logging.getLogger(__name__)


def open_conversation(policy: Policy, config: RolloutConfig, reset_info: Mapping[str, Any],
                      observation: Any) -> ChatAgent:
    """The agent's conversation after ``env.reset``: system prompt (the config's, else the policy's default), the
    env's instructions and first observation (a ``str``, or ``{"text", "image"}`` whose image the agent shows a
    policy that ``accepts_images``), and the env's tool schemas for chat templates that render tools natively
    (``template_tools: auto``; templates without tools ignore them). Shared by the engine and the branching
    sampler, so a branched group is prompted exactly as independent rollouts are."""
    system_prompt = config.system_prompt if config.system_prompt is not None else policy.default_system_prompt
    # Template forks are checked once per segment, at its end (final_state, and before a context rewrite), not after
    # every observation: each check renders and encodes the whole conversation, which on Sokoban rollouts of the
    # tiny model was a quarter of the sampling time.
    agent = ChatAgent(policy.tokenizer, system_prompt=system_prompt, observation_role=config.observation_role,
                      images=policy.accepts_images, processor=policy.processor, check_forks=False)
    tools = reset_info.get("tools") if config.template_tools == "auto" else None
    text, images = observation_parts(observation)
    agent.start(str(reset_info.get("instructions", "")), text, tools=tools or None, images=images)
    return agent


def context_limit_reached(agent: ChatAgent, policy: Policy, config: RolloutConfig) -> bool:
    """Whether the next turn could overflow ``config.max_context_tokens`` (prompt so far plus a full turn).

    Checked before every generation, by the engine and the branching sampler alike: the episode then ends
    as a truncation (:func:`context_limit_outcome`) instead of sending the model a prompt it cannot take.
    Policies without a tokenizer count no tokens, so the limit does not apply to them.
    """
    return (config.max_context_tokens is not None and policy.tokenizer is not None
            and agent.num_tokens + config.sampling.max_tokens > config.max_context_tokens)


def context_limit_outcome() -> dict[str, Any]:
    """The default outcome of an episode stopped by the context limit: a truncation that failed, score 0 (what
    :func:`truncation_outcome` gives for an env that does not say otherwise)."""
    return {"success": False, "score": 0.0, "end_reason": "context_limit"}


def truncation_outcome(env: Any, reason: str = "context_limit") -> tuple[dict[str, Any], float]:
    """``(outcome, reward still due)`` of an episode the engine ends between steps (its context limit or token
    budgets).

    The env says what a truncation is worth (``AgentEnv.truncate_episode``: its own truncation rule, e.g.
    TextWorld's points earned so far, and the remainder the reward rule still owes). An env that cannot say (a plain
    Gymnasium env, a remote one) gets the default: failed, score 0, nothing due.
    """
    method = getattr(getattr(env, "unwrapped", env), "truncate_episode", None)
    answer = None
    if method is not None:
        try:
            answer = method(reason)
        except Exception as exc:  # noqa: BLE001 - the episode is over either way; its turns must not be lost
            logger.warning("truncate_episode() failed (%s: %s); the episode ends with score 0", type(exc).__name__,
                           exc)
    if answer is None:  # no such method, a proxy whose env has none, or a failure
        return {**context_limit_outcome(), "end_reason": reason}, 0.0
    outcome, due = answer
    return dict(outcome), float(due)


def pay_due_reward(turns: list[Turn], due: float) -> None:
    """Add the reward a truncation still owes to the episode's last turn (component ``"outcome"``, as a last step
    would pay it), so the turns' rewards sum to the outcome score."""
    if not due or not turns:
        return
    last = turns[-1]
    rewards = dict(last.info.get("rewards") or {})
    rewards["outcome"] = rewards.get("outcome", 0.0) + due
    turns[-1] = dataclasses.replace(last, reward=last.reward + due, info={**last.info, "rewards": rewards})


_first_prompt_refusal_logged = False


def log_context_refusal(exc: ContextLengthExceeded, *, turns_taken: int) -> None:
    """Log that the model refused an episode's prompt as too long (the episode ends as ``context_limit``).

    A refused first prompt is a warning, logged once per process: no turn fitted at all, which is a setting (a
    system prompt or ``max_tokens`` too large for the model's context) rather than an episode that grew too long,
    and every episode would otherwise end quietly with no turns.
    """
    global _first_prompt_refusal_logged
    if turns_taken or _first_prompt_refusal_logged:
        logger.debug("prompt refused as too long after %d turns: %s", turns_taken, exc)
        return
    _first_prompt_refusal_logged = True
    logger.warning("The model refused an episode's first prompt as too long (%s). Such episodes end with "
                   "end_reason='context_limit' and no turns: shorten the system prompt, lower sampling.max_tokens, or "
                   "serve the model with a longer context.", exc)


def error_outcome() -> dict[str, Any]:
    """The outcome of an episode that failed (env error, timeout, policy error): not a success, score 0."""
    return {"success": False, "score": 0.0, "end_reason": "error"}


def make_turn(observation: str, generation: Generation, reward: float, step_info: Mapping[str, Any],
              prompt_ids: tuple[int, ...] | None, action_ids: tuple[int, ...] | None,
              state_key: str | None = None, images: tuple[ImageRef, ...] = ()) -> Turn:
    """The :class:`Turn` record of one generated action and the env's answer to it."""
    return Turn(
        images=images,
        observation=observation, action=generation.text, reward=float(reward),
        info=jsonable(step_info.get("turn", {})), prompt_token_ids=prompt_ids, action_token_ids=action_ids,
        action_logprobs=generation.logprobs if action_ids is not None else None,
        action_entropies=generation.entropies if action_ids is not None else None,
        action_forced=generation.forced if action_ids is not None else None,
        finish_reason=generation.finish_reason, state_key=state_key,
    )


@quick_init
@dataclass(frozen=True)
class TurnResult:
    """What one applied action produced: its :class:`Turn`, the next observation's text, and the episode's
    outcome when this action ended it (``None`` while it goes on)."""

    turn: Turn
    observation: str
    outcome: dict[str, Any] | None
    env_s: float


async def apply_action(policy: Policy, agent: ChatAgent, env: Any, observation: str, generation: Generation,
                       executor: concurrent.futures.Executor, timeout_s: float, *, inline: bool) -> TurnResult:
    """One turn after the policy answered: record the action in the conversation, read the env's anchor state
    and step the env with it (one env call, see :func:`keyed_step`), then add the env's answer to the
    conversation. The engine and the branching sampler both take every turn through here (or, for an env that
    steps inline, through :func:`apply_action_inline`, its synchronous form), so a trajectory records the same
    fields whichever sampler made it.

    Raises:
        TimeoutError: The env call ran past ``timeout_s``; any error the env's ``step`` raised.
    """
    if inline:
        return apply_action_inline(policy, agent, env, observation, generation)
    prompt_ids, images, action_ids = record_action(policy, agent, generation)
    started = time.perf_counter()
    state_key, result = await call_env(executor, timeout_s, keyed_step, env, generation.text)
    return _finish_turn(agent, observation, generation, result, state_key, prompt_ids, action_ids, images,
                        time.perf_counter() - started)


def apply_action_inline(policy: Policy, agent: ChatAgent, env: Any, observation: str,
                        generation: Generation) -> TurnResult:
    """:func:`apply_action` for a ``cheap_steps`` env, stepped right here: no coroutine to create and resume per
    turn, which the engine's hot loop would otherwise pay on every turn of every inline env."""
    prompt_ids, images, action_ids = record_action(policy, agent, generation)
    started = time.perf_counter()
    state_key, result = keyed_step(env, generation.text)
    return _finish_turn(agent, observation, generation, result, state_key, prompt_ids, action_ids, images,
                        time.perf_counter() - started)


def record_action(policy: Policy, agent: ChatAgent, generation: Generation
                  ) -> tuple[tuple[int, ...] | None, tuple[ImageRef, ...], tuple[int, ...] | None]:
    """Put the action into the conversation; returns the prompt ids and images the turn records, and the action's
    ids (``None`` without a tokenizer). Every engine records an action through here, the multi-agent one included,
    so the prompt a turn records is always the one the action was sampled from."""
    prompt_ids = tuple(agent.pending_prompt_ids) if policy.tokenizer is not None else None
    images = agent.observation_images
    return prompt_ids, images, agent.record_action(generation)


def _finish_turn(agent: ChatAgent, observation: str, generation: Generation, result: tuple[Any, ...],
                 state_key: str | None, prompt_ids: tuple[int, ...] | None, action_ids: tuple[int, ...] | None,
                 images: tuple[ImageRef, ...], env_s: float) -> TurnResult:
    """The turn's record from the env's answer, which goes into the conversation."""
    next_obs, reward, terminated, truncated, info = result
    turn = make_turn(observation, generation, reward, info, prompt_ids, action_ids, state_key, images)
    next_text, next_images = observation_parts(next_obs)
    agent.add_observation(next_text, images=next_images)
    outcome = episode_outcome(info, truncated) if terminated or truncated else None
    return TurnResult(turn=turn, observation=next_text, outcome=outcome, env_s=env_s)


def final_state(agent: ChatAgent, observation: str) -> dict[str, Any]:
    """Trajectory metadata for the observation after the last action, which no turn records.

    A critic bootstraps from it when an episode is truncated (``V(s')`` of the state the time limit cut off: the
    episode did not end there, so its return goes on past the last reward), and a report shows it (the env's last word: "Correct!", the final page). ``observation`` must
    already be in ``agent``'s conversation (its last message); its rendered token ids come with it.
    """
    out: dict[str, Any] = {"final_observation": observation}
    if agent.observation_images:  # saved beside the JSONL like every turn's images
        out["final_images"] = list(agent.observation_images)
    if agent.tokenizer is not None:
        out["final_prompt_token_ids"] = list(agent.pending_prompt_ids)
        # Segments whose linear sampled sequence differs from a fresh template render at their end, and actions
        # sampled from a prompt other than the agent's (their ids are not recorded): see ChatAgent.
        agent.check_template_fork()
        out["template_forks"] = agent.template_forks
        out["prompt_mismatches"] = agent.prompt_mismatches
    return out


def text_of(observation: Any) -> str:
    """The text part of an observation (GUI envs return ``{"text", "image"}``)."""
    if isinstance(observation, Mapping):
        return str(observation.get("text", ""))
    return str(observation)


def action_choices_of(env: Any) -> tuple[str, ...]:
    """The env's valid replies for this turn (``env.unwrapped.action_choices()``), for ``constrain_actions``.

    Raises:
        ConfigError: The env has no finite action set to decode into.
    """
    ask = getattr(getattr(env, "unwrapped", env), "action_choices", None)
    choices = ask() if callable(ask) else None
    if not choices:
        name = getattr(getattr(env, "spec", None), "id", None) or type(getattr(env, "unwrapped", env)).__name__
        raise ConfigError(f"constrain_actions is on but {name} lists no action choices (its actions take free "
                          "text); turn constrain_actions off for this env.")
    return tuple(choices)


def turn_sampling(sampling: SamplingParams, episode_index: int, turn: int) -> SamplingParams:
    """Deterministic runs: each (episode, turn) request gets its own seed derived from ``sampling.seed``."""
    if sampling.seed is None:
        return sampling
    seed = (sampling.seed * 1_000_003 + episode_index * 1009 + turn) % (2**63 - 1)
    return dataclasses.replace(sampling, seed=seed)
