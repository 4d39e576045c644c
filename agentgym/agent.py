"""ChatAgent: the one place where messages become tokens.

The agent keeps the conversation of one episode (instructions, task, actions, observations) as chat
messages and, when a tokenizer is given, as the exact token sequence the policy has seen. Sampled action
ids are appended as they were sampled; each observation is encoded on its own, together with the chat
template's glue (the end of the assistant turn, the user/tool header, the next assistant header). The
glue is found once by rendering a fixed bridge conversation through the tokenizer's chat template, so
any HF chat template works and nothing already sampled is re-tokenised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym.errors import AgentGymError
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.trajectory import utf8_safe

__all__ = ["ChatAgent"]

_BRIDGE_USER = "\u2063bridge-user\u2063"
_BRIDGE_ACTION = "\u2063bridge-action\u2063"


class ChatAgent:
    """Conversation state of one episode.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template, or ``None`` for text-only policies.
        system_prompt: Overrides the env's instructions (``None`` uses ``info["instructions"]``).
        observation_role: Role of observation messages after the first (``user`` or ``tool``).
    """

    def __init__(self, tokenizer: Any = None, *, system_prompt: str | None = None, observation_role: str = "user") -> None:
        if observation_role not in ("user", "tool"):
            raise AgentGymError(f"observation_role must be 'user' or 'tool', got {observation_role!r}.")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.observation_role = observation_role
        self.messages: list[dict[str, Any]] = []
        self.token_ids: list[int] = []
        self.pending_prompt_ids: list[int] = []
        self._last_action_ids: tuple[int, ...] = ()
        self._glue_cache: tuple[str, str, str] | None = None

    # ---- template helpers ----------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        # A tokenizer cannot take lone surrogates (sandbox output, model text): the model sees them as "\udXXX".
        return list(self.tokenizer.encode(utf8_safe(text), add_special_tokens=False)) if text else []

    def _glue(self) -> tuple[str, str, str]:
        """(assistant close, observation prefix, observation suffix) as the template renders them."""
        if self._glue_cache is None:
            base = [{"role": "user", "content": _BRIDGE_USER}, {"role": "assistant", "content": _BRIDGE_ACTION}]
            rendered_base = self._render(base, add_generation_prompt=False)
            close = rendered_base.split(_BRIDGE_ACTION, 1)[1] if _BRIDGE_ACTION in rendered_base else ""
            marker = "\u2063OBS\u2063"
            full = self._render(base + [{"role": self.observation_role, "content": marker}], add_generation_prompt=True)
            if not full.startswith(rendered_base) or marker not in full:
                raise AgentGymError(
                    "The tokenizer's chat template re-renders earlier turns when a message is added, so observation "
                    "tokens cannot be appended exactly. Use a template that appends turns (e.g. ChatML)."
                )
            prefix, suffix = full[len(rendered_base):].split(marker, 1)
            self._glue_cache = (close, prefix, suffix)
        return self._glue_cache

    # ---- conversation --------------------------------------------------------------------------
    def start(self, instructions: str, observation: str) -> None:
        """Begin an episode: system prompt plus the first observation."""
        system = self.system_prompt if self.system_prompt is not None else instructions
        self.messages = []
        if system:
            self.messages.append({"role": "system", "content": system})
        self.messages.append({"role": "user", "content": observation})
        self.token_ids = []
        self._last_action_ids = ()
        if self.tokenizer is not None:
            self.pending_prompt_ids = self._encode(self._render(self.messages, add_generation_prompt=True))
            self.token_ids = list(self.pending_prompt_ids)
        else:
            self.pending_prompt_ids = []

    def request(self, sampling: SamplingParams, episode_id: str = "") -> GenerationRequest:
        """The generation request for the next action."""
        if not self.messages:
            raise AgentGymError("ChatAgent.request() before start(): begin the episode first.")
        ids = tuple(self.token_ids) if self.tokenizer is not None else None
        return GenerationRequest(tuple(dict(m) for m in self.messages), ids, sampling, episode_id)

    def record_action(self, generation: Generation) -> tuple[int, ...] | None:
        """Append the sampled action; returns the action ids that went into the sequence."""
        self.messages.append({"role": "assistant", "content": generation.text})
        if self.tokenizer is None:
            return None
        ids = generation.token_ids
        if ids is None:
            raise AgentGymError(
                "The policy returned no token ids but the agent tokenises; use a token-level policy or no tokenizer."
            )
        self._last_action_ids = tuple(ids)
        self.token_ids.extend(ids)
        self.pending_prompt_ids = []
        return self._last_action_ids

    def add_observation(self, observation: str) -> None:
        """Append an observation: end the assistant turn (unless the model did), then the new turn."""
        self.messages.append({"role": self.observation_role, "content": observation})
        if self.tokenizer is None:
            return
        close, prefix, suffix = self._glue()
        if self._last_action_ids and close:
            sampled_tail = self.tokenizer.decode(list(self._last_action_ids[-4:]), skip_special_tokens=False)
            # The model usually samples the end-of-turn token itself; only add what it did not.
            for cut in range(len(close), 0, -1):
                if sampled_tail.endswith(close[:cut]):
                    close = close[cut:]
                    break
        ids = self._encode(close + prefix + observation + suffix)
        self.pending_prompt_ids = ids
        self.token_ids.extend(ids)

    def fork(self) -> ChatAgent:
        """An independent copy of this conversation (same messages and token ids; the tokenizer is shared).

        Branching samplers continue the copy separately, so its future tokens never touch the original's.
        """
        other = ChatAgent.__new__(ChatAgent)
        other.tokenizer = self.tokenizer
        other.system_prompt = self.system_prompt
        other.observation_role = self.observation_role
        other.messages = [dict(m) for m in self.messages]
        other.token_ids = list(self.token_ids)
        other.pending_prompt_ids = list(self.pending_prompt_ids)
        other._last_action_ids = self._last_action_ids
        other._glue_cache = self._glue_cache
        return other

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def conversation(self) -> list[Mapping[str, Any]]:
        return [dict(m) for m in self.messages]
