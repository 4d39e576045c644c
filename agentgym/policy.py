"""The policy contract: the interface every policy implements and the records it exchanges.

A policy receives a batch of :class:`GenerationRequest` (chat messages, and the exact prompt token ids when the
:class:`~agentgym.agent.ChatAgent` tokenises) and returns one :class:`Generation` each. The contract lives below
the conversation, the envs that run opponents or simulated tools, and the implementations in
:mod:`agentgym.policies`, so that none of them depends on another.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.errors import ConfigError
from agentgym.utils.fast_records import quick_init

__all__ = ["Generation", "GenerationRequest", "Policy", "SamplingParams", "TokenConstraint"]


@runtime_checkable
class TokenConstraint(Protocol):
    """A per-row constraint on which tokens may be sampled (``SamplingParams.constraint``), built for one tokenizer.

    The sampler keeps one state per row: :meth:`start` when the row starts, :meth:`allowed` before each draw (the
    ids that may come next, and whether the reply may end here: then the policy's end-of-turn ids are allowed too),
    :meth:`advance` with the sampled id. Structured output (a JSON schema) is one
    (:class:`agentgym.policies.json_constraint.JsonConstraint`).
    """

    def start(self, max_tokens: int) -> Any: ...

    def allowed(self, state: Any) -> tuple[Sequence[int], bool]: ...

    def advance(self, state: Any, token: int) -> Any: ...


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn.

    Attributes:
        max_tokens: Most tokens generated for the turn.
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass (1.0 disables it).
        stop: Extra stop strings; the generation ends after the first one (it is kept in the text).
        seed: Seed for reproducible sampling where the backend supports it.
        top_logprobs: Also return, per generated position, the log-probs of this many most likely tokens
            (``Generation.top_logprobs``); 0 returns none. Entropy-based branching (ARPO) measures its
            truncated segment entropy from them.
        choices: When non-empty, the reply is exactly one of these strings followed by the end-of-turn token
            (constrained decoding, like vLLM's guided choice): each choice's tokens (the tokenizer's own encoding)
            form a prefix tree, and each step samples among the tokens that continue a choice, renormalised.
            Tokens with a single continuation are forced; the policy marks them
            (``Generation.forced``) so trainers leave them out of the loss. Set per turn by the rollout engine
            from the env's :meth:`~agentgym.env.AgentEnv.action_choices` when ``RolloutConfig.constrain_actions``.
        top_k: Sample among the k most likely tokens (ties kept); 0 or -1 disables it.
        min_p: Drop tokens less likely than ``min_p`` times the most likely one (0 disables it).
        repetition_penalty: Divides the positive logits and multiplies the negative ones of every token already in
            the prompt or the output (1 disables it).
        presence_penalty: Subtracted once from the logit of every token the output already holds.
        frequency_penalty: Subtracted from a token's logit once per time the output holds it.
        min_tokens: End-of-turn ids and ``stop_token_ids`` are masked (and stop strings ignored) until this many
            tokens are generated.
        stop_token_ids: Extra ids that end the turn (kept as the last of ``Generation.token_ids``).
        logit_bias: ``(token id, bias)`` pairs added to the raw logits (a mapping is accepted and stored sorted).
        The eight fields above follow vLLM's sampler, in its order; :mod:`agentgym.policies.sampling_rules` says
        how. Recorded log-probs stay the model's temperature-scaled distribution, whatever they change.
        constraint: A :class:`TokenConstraint` each step's draw is restricted to (renormalised over its allowed
            ids, like ``choices``; the recorded log-probs stay the model's); ``None`` for free text. Not with
            ``choices``.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    choices: tuple[str, ...] = ()
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: TokenConstraint | None = None

    def __post_init__(self) -> None:
        self._check_rules()
        if self.constraint is not None and not isinstance(self.constraint, TokenConstraint):
            raise ConfigError(f"constraint must have start(), allowed() and advance() (a TokenConstraint such as "
                              f"JsonConstraint), got {self.constraint!r}.")
        if self.constraint is not None and self.choices:
            raise ConfigError("Give either choices or constraint, not both: each restricts every token on its own.")
        if isinstance(self.choices, str) or not all(isinstance(c, str) and c for c in self.choices):
            raise ConfigError("choices must be a tuple of non-empty strings (the whole replies allowed), e.g. "
                              f"('forward()', 'turn_left()'), or () for free text; got {self.choices!r}.")
        if len(set(self.choices)) != len(self.choices):
            raise ConfigError(f"choices holds duplicates: {self.choices!r}; list each allowed reply once.")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}.")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_logprobs, int) or isinstance(self.top_logprobs, bool) or self.top_logprobs < 0:
            raise ConfigError(f"top_logprobs must be an integer >= 0 (0 = none; ARPO uses 10), got {self.top_logprobs!r}.")

    def _check_rules(self) -> None:
        """Validate (and normalise) the vLLM-style processing fields; every message names the fix."""
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias", tuple(sorted((int(k), float(v)) for k, v in self.logit_bias.items())))
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise ConfigError(f"top_k must be an integer >= 1, or 0 / -1 to disable it; got {self.top_k!r}.")
        if not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}.")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty}.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ConfigError(f"{name} must be in [-2, 2] (0 disables it), got {getattr(self, name)}.")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise ConfigError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}.")
        if self.min_tokens > self.max_tokens:
            raise ConfigError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens}).")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise ConfigError(f"stop_token_ids must be token ids (integers >= 0), got {self.stop_token_ids!r}.")
        if not all(len(pair) == 2 for pair in self.logit_bias):
            raise ConfigError(f"logit_bias must be (token id, bias) pairs or a mapping, got {self.logit_bias!r}.")


@quick_init
@dataclass(frozen=True)
class GenerationRequest:
    """One conversation to continue.

    Attributes:
        messages: OpenAI-style chat messages so far (system, user, assistant, ...); for a policy that
            ``accepts_images``, an image observation's content is parts: ``[{"type": "text", "text": ...},
            {"type": "image", "image": ImageRef}]``. Read-only: they are the episode's own messages, shared rather
            than copied per turn, so changing one raises ``TypeError``; work on ``dict(message)`` instead.
        prompt_token_ids: The exact prompt tokens, when the agent tokenised it (token-level policies use
            these and never re-tokenise the messages).
        sampling: Sampling parameters.
        episode_id: Which episode asks (lets stateful policies such as the reference solver keep state).
    """

    messages: tuple[Mapping[str, Any], ...]
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    episode_id: str = ""


@quick_init
@dataclass(frozen=True)
class Generation:
    """One generated turn.

    Attributes:
        text: The action text (special tokens removed).
        token_ids: Sampled ids, including the token that ended the turn (EOS / end-of-turn).
        logprobs: Log-probs of the sampled ids under the sampling distribution.
        entropies: Entropy of the sampling distribution at each step.
        finish_reason: ``stop``, ``length``, or ``abort`` (a caller cancelled the row, e.g. its client left).
        top_logprobs: When ``SamplingParams.top_logprobs = k > 0`` and the policy supports it: per generated
            position, the log-probs of the k most likely tokens in descending order, followed by the sampled
            token's log-prob when it is not among them (vLLM's convention). ``None`` otherwise.
        top_token_ids: The token ids of ``top_logprobs``, entry for entry (what a server needs to name the
            alternatives); ``None`` when the backend did not say which tokens they were.
        prompt_token_ids: The prompt ids the backend actually conditioned on, when it reports them (a chat
            server re-renders the conversation itself; vLLM's ``return_token_ids``). The agent compares them
            with its own rendering and never records action ids sampled from a different prompt.
        forced: Under ``SamplingParams.choices``, per generated token whether it was the only token that could
            follow (its constrained probability is 1, so it carries no learning signal and trainers mask it);
            ``None`` for free-text sampling.
    """

    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    entropies: tuple[float, ...] | None = None
    finish_reason: str = "stop"
    top_logprobs: tuple[tuple[float, ...], ...] | None = None
    top_token_ids: tuple[tuple[int, ...], ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    forced: tuple[bool, ...] | None = None


class Policy(abc.ABC):
    """Base class of all policies.

    Attributes:
        name: Shown in eval tables and stored in trajectories.
        tokenizer: A Hugging Face tokenizer when the policy works at token level, else ``None``; the
            ChatAgent uses it to build exact prompt ids.
        max_batch_size: Most requests the engine puts in one ``act`` call.
        max_concurrency: Most ``act`` calls the engine keeps in flight at once (1 for an in-process model
            that uses all cores; more for a server that batches on its own).
        default_system_prompt: The system prompt the model was trained with (read from the ``agentgym.json``
            its trainer saved), used by the rollout engine when ``RolloutConfig.system_prompt`` is ``None``;
            ``None`` keeps each env's instructions. A model evaluated with a prompt it never saw scores 0.
        accepts_images: The policy reads images: the ChatAgent then sends observation images as message content
            parts (``{"type": "image", "image": ImageRef}``); otherwise it shows the text part only.
        processor: A Hugging Face processor (``AutoProcessor``) when the policy is an in-process vision-language
            model: the ChatAgent expands image placeholders with it into the exact ids the model sees.
        supports_choices: The policy decodes under ``SamplingParams.choices`` (constrained to whole replies) and
            marks forced tokens; the rollout engine refuses ``constrain_actions`` for one that does not.
    """

    name: str = "policy"
    supports_choices: bool = False
    default_system_prompt: str | None = None
    accepts_images: bool = False
    processor: Any = None
    tokenizer: Any = None
    max_batch_size: int = 64
    max_concurrency: int = 1

    @abc.abstractmethod
    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate one turn for each request, in order."""

    def begin_episode(self, episode_id: str, env: Any) -> None:
        """Called by the rollout engine when an episode starts (default: nothing)."""

    def end_episode(self, episode_id: str) -> None:
        """Called by the rollout engine when an episode ends (default: nothing)."""

    def close(self) -> None:
        """Release resources (threads, HTTP clients, models)."""
