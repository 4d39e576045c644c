"""What the policy implementations share: the contract's names (from :mod:`agentgym.policy`), the check for
constrained decoding, exact prompt ids, and the base of in-process token-level policies.

Token-level policies (HF, vLLM, OpenAI completions) return the sampled ids with their log-probs, which is what
trainers need; text-only policies (OpenAI chat, scripted) return text.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from typing import Any

from agentgym.errors import ConfigError
from agentgym.policy import Generation, GenerationRequest, Policy, SamplingParams

__all__ = ["Generation", "GenerationRequest", "InProcessTokenPolicy", "Policy", "SamplingParams", "prompt_token_ids",
           "refuse_choices"]


def refuse_choices(policy: Policy, requests: Sequence[GenerationRequest]) -> None:
    """Raise when a request asks for ``SamplingParams.choices`` from a policy that cannot decode under them:
    ignoring them would return free text where the caller counts on one of its choices.

    Raises:
        ConfigError: Some request has choices and ``policy.supports_choices`` is False.
    """
    if not policy.supports_choices and any(r.sampling.choices for r in requests):
        raise ConfigError(f"{type(policy).__name__} cannot decode under SamplingParams.choices (constrained to whole "
                          "replies); use HFPolicy, or sample free text (no choices, constrain_actions off).")


def prompt_token_ids(request: GenerationRequest, tokenizer: Any) -> list[int]:
    """The request's exact prompt ids, or (an agent without a tokenizer sent only messages) the messages
    rendered with the chat template and encoded, exactly as the ChatAgent would."""
    if request.prompt_token_ids is not None:
        return [int(t) for t in request.prompt_token_ids]
    text = tokenizer.apply_chat_template([dict(m) for m in request.messages], tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


class InProcessTokenPolicy(Policy):
    """A policy that samples token ids in this process (HF, vLLM): ``act`` runs ``generate`` in a thread.

    Subclasses implement the synchronous :meth:`generate` over token-id prompts; this class turns requests
    into prompt ids (the ChatAgent's exact ids, or the chat template when a request has none) and keeps the
    event loop free while the model runs, so env steps of other episodes go on meanwhile.
    """

    tokenizer: Any

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        refuse_choices(self, requests)
        prompts = [self.prompt_ids(r) for r in requests]
        return await asyncio.to_thread(self.generate, prompts, [r.sampling for r in requests])

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        return prompt_token_ids(request, self.tokenizer)

    @staticmethod
    def check_generate_inputs(
        prompts: Sequence[Sequence[int]], sampling: Sequence[SamplingParams] | SamplingParams
    ) -> tuple[list[list[int]], list[SamplingParams]]:
        """Prompts as lists of ints and one SamplingParams per prompt; rejects empty prompts and count mismatches."""
        rows = [[int(t) for t in p] for p in prompts]
        if isinstance(sampling, SamplingParams):
            params = [sampling] * len(rows)
        else:
            params = list(sampling)
            if len(params) != len(rows):
                raise ConfigError(
                    f"Got {len(rows)} prompts but {len(params)} SamplingParams; pass one per prompt or a single one."
                )
        for i, row in enumerate(rows):
            if not row:
                raise ConfigError(f"Prompt {i} is empty; a prompt needs at least one token (e.g. the chat template).")
        return rows, params

    @abc.abstractmethod
    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: Sequence[SamplingParams] | SamplingParams
    ) -> list[Generation]:
        """Continue each prompt (token ids) with its sampling parameters."""
