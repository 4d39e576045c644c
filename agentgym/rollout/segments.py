"""One episode's context keeping and token budgets, shared by the samplers: when to rewrite the history, how a
summary turn is sampled, and how much each turn may still sample.

Why one place: a rewritten history is not what the model sampled from, so the episode must go on in a new
*segment* whose prompt is one fresh render of the rewritten conversation (:meth:`ChatAgent.restart`); every turn
after the rewrite records that segment's index, and :meth:`Trajectory.token_views` gives one token-exact
sequence per segment. The strategies themselves are plain functions (:mod:`agentgym.rollout.context`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError, ContextLengthExceeded
from agentgym.policies.base import Generation, GenerationRequest, Policy, SamplingParams
from agentgym.rollout.context import ContextConfig, resolve_strategy, summary_history
from agentgym.rollout.specs import RolloutConfig
from agentgym.rollout.turns import make_turn, record_action
from agentgym.trajectory import Turn

__all__ = ["EpisodeContext", "SummaryDidNotFit"]

logger = logging.getLogger(__name__)

Generate = Callable[[GenerationRequest], Awaitable[Generation]]

#: Room left for the summary request's own text and template glue when ``summarize`` derives its trigger.
_SUMMARY_GLUE_TOKENS = 32


class SummaryDidNotFit(ContextLengthExceeded):
    """The summary request of ``summarize`` does not fit the model's context (the model refused it as too long, or
    its prompt plus the summary's budget passes ``max_context_tokens``).

    The conversation outgrew the model before it could be compacted, so the episode ends as a ``context_limit``
    truncation, like any prompt the model cannot take; the message says which settings make the request fit.
    """


_summary_refusal_logged = False


def _log_summary_refusal(note: str) -> None:
    """Warn once per process (every episode of a run with this setting would hit it); later ones at DEBUG."""
    global _summary_refusal_logged
    if _summary_refusal_logged:
        logger.debug("%s", note)
        return
    _summary_refusal_logged = True
    logger.warning("%s (said once per run; each such trajectory has it in metadata['context_limit'])", note)


class EpisodeContext:
    """Context strategy and budgets of one episode (built per episode by the engine).

    Args:
        config: The engine's settings (``context``, ``max_context_tokens``, ``max_turn_tokens``,
            ``max_episode_tokens``).
        policy: The policy that acts (and, without a ``summarizer``, writes summaries).
        summarizer: Another policy that writes the summaries; its text enters the next segment's prompt (mask 0),
            and no turn of the trained policy records it.
    """

    def __init__(self, config: RolloutConfig, policy: Policy, summarizer: Policy | None = None) -> None:
        self.config = config
        self.context: ContextConfig = config.context
        self.policy = policy
        self.summarizer = summarizer
        self.rewrite = resolve_strategy(self.context)
        self.tokenized = policy.tokenizer is not None
        self.segment = 0
        self.turns_in_segment = 0
        self.sampled = 0
        self.summaries: list[str] = []
        self.note: str | None = None  # why the episode ended at the context limit, when a summary did not fit
        self.growth = 0  # most tokens one turn (action and observation) added to a segment so far
        self._last_tokens: int | None = None  # the segment's length at the previous check
        self.trigger = self._trigger_tokens()
        if self.context.rewrites and self.trigger is None and self.context.trigger_turns is None:
            raise ConfigError(f"context strategy {self.context.strategy!r} has nothing to trigger it: set "
                              "max_context_tokens (with a token-level policy), context.trigger_tokens or "
                              "context.trigger_turns.")

    def _summary_tokens(self) -> int:
        return self.context.summary_max_tokens or self.config.sampling.max_tokens

    def _trigger_tokens(self) -> int | None:
        if not self.tokenized:
            return None
        if self.context.trigger_tokens is not None:
            return self.context.trigger_tokens
        limit = self.config.max_context_tokens
        if limit is None:
            return None
        if self.context.strategy == "summarize":  # the request and the summary must still fit
            prompt = len(self.policy.tokenizer.encode(self.context.summary_prompt, add_special_tokens=False))
            return max(1, limit - self._summary_tokens() - prompt - _SUMMARY_GLUE_TOKENS)
        return limit

    # ---- budgets ----------------------------------------------------------------------------------
    def left(self) -> int | None:
        """Tokens the episode may still sample (``None``: no episode budget, or a policy that counts none)."""
        if self.config.max_episode_tokens is None or not self.tokenized:
            return None
        return self.config.max_episode_tokens - self.sampled

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def capped(self, sampling: SamplingParams, *, budget: int | None = None) -> SamplingParams:
        """``sampling`` with ``max_tokens`` capped by the turn and episode budgets (``budget``: the turn's own)."""
        cap = sampling.max_tokens if budget is None else min(sampling.max_tokens, budget)
        if self.config.max_turn_tokens is not None:
            cap = min(cap, self.config.max_turn_tokens)
        left = self.left()
        if left is not None:
            cap = min(cap, left)
        return sampling if cap == sampling.max_tokens else dataclasses.replace(sampling, max_tokens=max(1, cap))

    def count(self, generation: Generation) -> None:
        self.sampled += len(generation.token_ids or ())

    def cut(self, generation: Generation) -> bool:
        """Whether this action used all of ``max_turn_tokens`` (it is not stepped; the episode ends)."""
        limit = self.config.max_turn_tokens
        if limit is None or generation.token_ids is None:
            return False
        used = len(generation.token_ids)  # a policy that ignored the cap is cut too
        return used > limit or (used == limit and generation.finish_reason != "stop")

    def stamp(self, turn: Turn) -> Turn:
        """The turn with this segment's index (a new field only past the first segment)."""
        self.turns_in_segment += 1
        return turn if self.segment == 0 else dataclasses.replace(turn, segment_index=self.segment)

    # ---- rewrites ---------------------------------------------------------------------------------
    def due(self, agent: ChatAgent) -> bool:
        """Whether the history should be rewritten before the next action (never in a segment without a turn)."""
        if not self.context.rewrites:
            return False
        tokens = agent.num_tokens
        if self._last_tokens is not None and tokens > self._last_tokens:
            self.growth = max(self.growth, tokens - self._last_tokens)
        self._last_tokens = tokens
        if self.turns_in_segment == 0:
            return False
        if self.context.trigger_turns is not None and self.turns_in_segment >= self.context.trigger_turns:
            return True
        if self.trigger is None:
            return False
        ahead = self.config.sampling.max_tokens
        if self.context.strategy == "summarize" and self.context.trigger_tokens is None:
            # The summary is asked for after the next turn's observation has come in, so the derived trigger must
            # leave room for that whole turn: the largest one so far stands in for it. (A rewrite in place needs no
            # such room: it happens before the action it makes room for.)
            ahead = max(ahead, self.growth)
        return tokens + ahead > self.trigger

    def _new_segment(self, agent: ChatAgent, messages: list[dict[str, Any]]) -> None:
        agent.check_template_fork()  # the ending segment's fork check (its ids are left behind by the restart)
        agent.restart(messages)
        self.segment += 1
        self.turns_in_segment = 0
        self._last_tokens = None

    async def compact(self, agent: ChatAgent, observation: str, sampling: SamplingParams, episode_id: str,
                      generate: Generate, state_key: Callable[[], Awaitable[str | None]]) -> Turn | None:
        """Rewrite the history when it is due; returns the summary turn the policy sampled (``summarize`` with the
        policy as its own summarizer), which the episode records like any action, else ``None``."""
        if not self.due(agent):
            return None
        if self.context.strategy != "summarize":
            rewritten = self.rewrite(agent.conversation(), self.context) if self.rewrite is not None else None
            if rewritten is not None:
                self._new_segment(agent, [dict(m) for m in rewritten])
            return None
        before = agent.conversation()
        request_text = f"{observation}\n\n{self.context.summary_prompt}"
        summary_sampling = self.capped(sampling, budget=self._summary_tokens())
        if self.summarizer is not None:
            messages = [*before[:-1], {**before[-1], "content": request_text}]
            request = GenerationRequest(tuple(messages), None, summary_sampling, episode_id)
            try:
                generation = (await self.summarizer.act([request]))[0]
            except ContextLengthExceeded as exc:
                raise self._did_not_fit(f"the summarizer refused it as too long ({exc})") from exc
            self.summaries.append(generation.text)
            self._new_segment(agent, summary_history(before, generation.text))
            return None
        key = await state_key()
        agent.amend_observation(request_text)
        limit = self.config.max_context_tokens
        if self.tokenized and limit is not None and agent.num_tokens + summary_sampling.max_tokens > limit:
            raise self._did_not_fit(f"its prompt of {agent.num_tokens} tokens plus the summary's "
                                    f"{summary_sampling.max_tokens} passes max_context_tokens={limit}")
        try:
            generation = await generate(agent.request(summary_sampling, episode_id))
        except ContextLengthExceeded as exc:
            raise self._did_not_fit(f"the model refused it as too long ({exc})") from exc
        self.count(generation)
        prompt_ids, images, action_ids = record_action(self.policy, agent, generation)
        turn = self.stamp(make_turn(request_text, generation, 0.0, {"turn": {"kind": "summary", "calls": []}},
                                    prompt_ids, action_ids, f"summary:{key}", images))
        self.summaries.append(generation.text)
        self._new_segment(agent, summary_history(before, generation.text))
        return turn

    def _did_not_fit(self, why: str) -> SummaryDidNotFit:
        """The error that ends the episode as ``context_limit``, with the note its trajectory keeps."""
        trigger = ("context.trigger_tokens" if self.context.trigger_tokens is not None
                   else "context.trigger_tokens (derived from max_context_tokens now)")
        self.note = (f"the summary prompt did not fit: {why}; the episode ends as context_limit. Summarize earlier: "
                     f"lower {trigger} or set context.trigger_turns, or lower context.summary_max_tokens, shorten "
                     "context.summary_prompt, or serve the model with a longer context.")
        _log_summary_refusal(self.note)
        return SummaryDidNotFit(self.note)

    def fork(self) -> EpisodeContext:
        """An independent copy for a branch that continues this episode (its counts go on separately)."""
        other = copy.copy(self)
        other.summaries = list(self.summaries)
        return other

    def metadata(self) -> dict[str, Any]:
        """Trajectory metadata of the strategy (only when it rewrote something, or a summary did not fit)."""
        note = {"context_limit": self.note} if self.note is not None else {}
        if not self.segment:
            return note
        return {**note, "segments": self.segment + 1, "context_strategy": self.context.strategy,
                "summaries": list(self.summaries), "sampled_tokens": self.sampled}
