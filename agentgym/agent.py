"""ChatAgent: the one place where messages become tokens.

The agent keeps the conversation of one episode (instructions, task, actions, observations) as chat
messages and, when a tokenizer is given, as the exact token sequence the policy has seen. Sampled action
ids are appended as they were sampled; each observation is encoded on its own, together with the chat
template's glue (the end of the assistant turn, the user/tool header, the next assistant header).

The glue is found once from the *tail* of a bridge conversation: the text between the end of the bridge
assistant's content and the observation, and after the observation up to the next generation prompt. We do
not require that a render with one more message starts with the previous render, because templates such
as Qwen3 and DeepSeek-R1 render an assistant turn differently once a later message exists (the reasoning
block is dropped). The training sequence is the *linear* sampled history (what the model actually
conditioned on); where the template's fresh render of the same messages differs, that turn is counted as a
"template fork" (``template_forks``) instead of being silently re-tokenised.

The end of a turn is decided on token ids, never on decoded text: when the last sampled id is the special
token that opens the template's close (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``</s>``...), the
close is not added again; otherwise (length cut, plain token) the full close is encoded, so the real special
id enters the sequence even when the action text ends in ``<|``.

Observations with images (GUI screenshots, :mod:`agentgym.utils.images`) become OpenAI-style content parts,
``[{"type": "text", "text": ...}, {"type": "image", "image": ImageRef}]``, for a policy that reads images
(``images=True``); each policy turns the parts into what its backend takes. Text observations stay plain strings,
so nothing changes for text envs. For a text-only policy an image observation is its text part only: the
conversation and token ids are exactly those of the text (the images are still recorded in the trajectory).
A vision-language model's ids come from its Hugging Face processor, which expands each image's placeholder
into the image tokens the model sees; they are part of the observation's (unsampled, loss-masked) ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.errors import AgentGymError
from agentgym.utils.images import ImageRef, image_parts
from agentgym.policy import Generation, GenerationRequest, SamplingParams
from agentgym.trajectory import utf8_safe

__all__ = ["ChatAgent", "Message"]


class Message(dict):  # type: ignore[type-arg]
    """One message of an agent's conversation: a ``dict`` (JSON, chat templates and ``dict(m)`` take it as one) that
    refuses changes.

    Why: every turn's :class:`GenerationRequest` shares the conversation's messages instead of copying each of them
    (a copy per message per turn was a measurable share of the engine's own cost), and a policy that edited one in
    place would rewrite the episode's history; it now gets an error that says how to work on a copy.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a conversation's messages are read-only (requests share them with the episode): copy one "
                        "with dict(message) and change the copy")

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = clear = setdefault = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and deepcopy rebuild it whole (item by item would be refused)
        return (Message, (dict(self),))


_BRIDGE_USER = "\u2063bridge-user\u2063"
_BRIDGE_ACTION = "\u2063bridge-action\u2063"


class ChatAgent:
    """Conversation state of one episode.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template, or ``None`` for text-only policies.
        system_prompt: Overrides the env's instructions (``None`` uses ``info["instructions"]``).
        observation_role: Role of observation messages after the first (``user`` or ``tool``).
        tools: Tool schemas (the env's ``info["tools"]``) passed to the chat template as ``tools=``, so each
            family renders them in its native format; ``None`` renders without tools.
        check_forks: After each observation, compare the linear ids with the ids of a fresh render of the
            messages and count differing turns in ``template_forks`` (measured about 13 ms per turn at 30k tokens
            with a byte-level tokenizer on a loaded 2-core CPU, against 0.4 ms without; off saves that, and
            :meth:`check_template_fork` checks once when asked).
        images: The policy reads images: observation images go into the messages as content parts. ``False``
            (text-only policies) keeps only the text of an image observation.
        processor: A Hugging Face processor of a vision-language model (``AutoProcessor``), needed with ``images``
            and a tokenizer: its chat template renders image parts and its call expands image placeholders.
    """

    def __init__(self, tokenizer: Any = None, *, system_prompt: str | None = None, observation_role: str = "user",
                 tools: Sequence[Mapping[str, Any]] | None = None, check_forks: bool = True, images: bool = False,
                 processor: Any = None) -> None:
        if observation_role not in ("user", "tool"):
            raise AgentGymError(f"observation_role must be 'user' or 'tool', got {observation_role!r}.")
        if images and tokenizer is not None and processor is None:
            raise AgentGymError(
                "ChatAgent(images=True) with a tokenizer needs processor=... (the model's AutoProcessor) to turn images "
                "into tokens; pass the processor, or images=False to show a text-only model the text part only."
            )
        if tools is not None and not all(isinstance(t, Mapping) for t in tools):
            raise AgentGymError("tools must be a list of JSON-schema dicts (the env's info['tools']) or None.")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.observation_role = observation_role
        self.tools: list[dict[str, Any]] | None = [dict(t) for t in tools] if tools else None
        self.check_forks = check_forks
        self.images = bool(images)
        self.processor = processor if images else None
        #: The images of the latest observation (recorded on the turn that acts on it, whatever the policy reads).
        self.observation_images: tuple[ImageRef, ...] = ()
        self.messages: list[dict[str, Any]] = []
        self.token_ids: list[int] = []
        self.pending_prompt_ids: list[int] = []
        self._last_action_ids: tuple[int, ...] = ()
        self._glue_cache: tuple[str, str, str] | None = None
        #: Turns whose linear sequence differs from a fresh render of the same messages (re-rendering templates).
        self.template_forks = 0
        #: Actions sampled by a backend whose reported prompt ids differ from this agent's sequence.
        self.prompt_mismatches = 0

    # ---- template helpers ----------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        # tools only when given: a template that ignores them renders the same text either way.
        extra: dict[str, Any] = {"tools": self.tools} if self.tools else {}
        template = getattr(self.processor, "chat_template", None)
        if template:  # a VLM's processor template renders image parts; the tokenizer's may not
            extra["chat_template"] = template
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )

    def _encode(self, text: str) -> list[int]:
        # A tokenizer cannot take lone surrogates (sandbox output, model text): the model sees them as "\udXXX".
        return list(self.tokenizer.encode(utf8_safe(text), add_special_tokens=False)) if text else []

    def _encode_images(self, text: str, images: Sequence[ImageRef]) -> list[int]:
        """Ids of ``text`` whose image placeholders the processor expands into each image's tokens."""
        if not images:
            return self._encode(text)
        out = self.processor(text=[utf8_safe(text)], images=[image.array() for image in images],
                             add_special_tokens=False)
        return [int(t) for t in out["input_ids"][0]]

    def _content(self, text: str, images: Sequence[ImageRef]) -> str | list[dict[str, Any]]:
        """A message's content: the plain text, or text and image parts for a policy that reads images."""
        if not (self.images and images):
            return text
        return [{"type": "text", "text": text}, *({"type": "image", "image": image} for image in images)]

    def all_images(self) -> list[ImageRef]:
        """Every image in the conversation's messages, in order (what a VLM's prompt ids hold tokens of)."""
        return [image for m in self.messages for image in image_parts(m.get("content"))]

    def _glue(self) -> tuple[str, str, str]:
        """(assistant close, observation prefix, observation suffix), read from the tail of a bridge render.

        ``close`` is what the template writes right after an assistant's content when it is the last message
        (e.g. ``<|im_end|>\\n``); ``prefix`` is the rest of the text up to the observation content and
        ``suffix`` what follows it up to the generation prompt. Cached per agent (tokenizer, role, tools
        are fixed for its life; :meth:`fork` shares it).
        """
        if self._glue_cache is None:
            base = [{"role": "user", "content": _BRIDGE_USER}, {"role": "assistant", "content": _BRIDGE_ACTION}]
            rendered_base = self._render(base, add_generation_prompt=False)
            marker = "\u2063OBS\u2063"
            full = self._render(base + [{"role": self.observation_role, "content": marker}], add_generation_prompt=True)
            if _BRIDGE_ACTION not in full or marker not in full.rsplit(_BRIDGE_ACTION, 1)[-1]:
                raise AgentGymError(
                    "The tokenizer's chat template drops the assistant's content or the observation, so turns "
                    f"cannot be appended as tokens. Check the template with observation_role={self.observation_role!r}."
                )
            between, suffix = full.rsplit(_BRIDGE_ACTION, 1)[1].split(marker, 1)
            close = rendered_base.rsplit(_BRIDGE_ACTION, 1)[1] if _BRIDGE_ACTION in rendered_base else ""
            if not between.startswith(close):
                close = ""  # the close is part of the glue anyway; nothing can be skipped on a sampled end token
            self._glue_cache = (close, between[len(close):], suffix)
        return self._glue_cache

    def _special_ids(self) -> set[int]:
        """Ids of the tokenizer's special tokens (a sampled one can end a turn; plain text never does)."""
        return {int(i) for i in getattr(self.tokenizer, "all_special_ids", ()) or ()} | {
            int(i) for i in getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
            if getattr(self.tokenizer.added_tokens_decoder[i], "special", False)
        }

    # ---- conversation --------------------------------------------------------------------------
    def start(self, instructions: str, observation: str, tools: Sequence[Mapping[str, Any]] | None = None,
              images: Sequence[ImageRef] = ()) -> None:
        """Begin an episode: system prompt plus the first observation and its ``images`` (``tools`` overrides the
        constructor's)."""
        if tools is not None:
            self.tools = [dict(t) for t in tools] or None
            self._glue_cache = None
        system = self.system_prompt if self.system_prompt is not None else instructions
        self.messages = []
        if system:
            self.messages.append(Message(role="system", content=system))
        self.observation_images = tuple(images)
        self.messages.append(Message(role="user", content=self._content(observation, self.observation_images)))
        self.token_ids = []
        self._last_action_ids = ()
        self.template_forks = 0
        self.prompt_mismatches = 0
        if self.tokenizer is not None:
            self.pending_prompt_ids = self._encode_images(self._render(self.messages, add_generation_prompt=True),
                                                          self.all_images())
            self.token_ids = list(self.pending_prompt_ids)
        else:
            self.pending_prompt_ids = []

    def request(self, sampling: SamplingParams, episode_id: str = "") -> GenerationRequest:
        """The generation request for the next action."""
        if not self.messages:
            raise AgentGymError("ChatAgent.request() before start(): begin the episode first.")
        ids = tuple(self.token_ids) if self.tokenizer is not None else None
        return GenerationRequest(tuple(self.messages), ids, sampling, episode_id)  # shared: read-only Messages

    def record_action(self, generation: Generation) -> tuple[int, ...] | None:
        """Append the sampled action; returns the action ids that went into the sequence."""
        self.messages.append(Message(role="assistant", content=generation.text))
        if self.tokenizer is None:
            return None
        ids = generation.token_ids
        if ids is None:
            raise AgentGymError(
                "The policy returned no token ids but the agent tokenises; use a token-level policy or no tokenizer."
            )
        reported = generation.prompt_token_ids
        if reported is not None and tuple(int(t) for t in reported) != tuple(self.token_ids):
            # Sampled from another prompt (a chat server re-rendered the conversation): training on these ids
            # under our prefix would be off-policy. Keep the text; continue the sequence with its encoding.
            self.prompt_mismatches += 1
            self._last_action_ids = tuple(self._encode(generation.text))
            self.token_ids.extend(self._last_action_ids)
            self.pending_prompt_ids = []
            return None
        self._last_action_ids = tuple(ids)
        self.token_ids.extend(ids)
        self.pending_prompt_ids = []
        return self._last_action_ids

    def add_observation(self, observation: str, images: Sequence[ImageRef] = ()) -> None:
        """Append an observation: end the assistant turn (unless the model did), then the new turn.

        A fork is counted when ``encode(render(messages))`` differs from the linear ids: the template
        re-renders history (Qwen3/R1 strip reasoning), or sampled ids do not re-encode from their text (an
        invalid UTF-8 byte run, a special token inside an action). The linear ids stay the training sequence.
        """
        self.observation_images = tuple(images)
        message = Message(role=self.observation_role, content=self._content(observation, self.observation_images))
        self.messages.append(message)
        if self.tokenizer is None:
            return
        close, prefix, suffix = self._glue()
        if isinstance(message["content"], str):
            ids = self._encode(close + prefix + observation + suffix)
        else:  # parts render per template (image placeholders): take the bridge render's tail, then expand images
            base = [{"role": "user", "content": _BRIDGE_USER}, {"role": "assistant", "content": _BRIDGE_ACTION}]
            tail = self._render(base + [message], add_generation_prompt=True).rsplit(_BRIDGE_ACTION, 1)[1]
            ids = self._encode_images(tail, self.observation_images)
        # End of turn on ids: the model's own end token (sampled) stands for the close's first token; after a
        # length cut or a plain token the whole close is added, its special id included.
        if ids and self._last_action_ids and self._last_action_ids[-1] == ids[0] and ids[0] in self._special_ids():
            ids = ids[1:]
        self.pending_prompt_ids = ids
        self.token_ids.extend(ids)
        if self.check_forks:
            self.check_template_fork()

    def check_template_fork(self) -> bool:
        """Compare the linear ids with the ids of a fresh render of the messages now; a difference is counted in
        ``template_forks`` and returned. It renders and encodes the whole conversation (O(context)), which is why
        the rollout engine asks once at the end of each segment rather than after every observation: a fork persists
        (the linear ids keep their differing prefix), so the end of the segment still shows it."""
        if self.tokenizer is None:
            return False
        forked = self.token_ids != self._encode_images(self._render(self.messages, add_generation_prompt=True),
                                                       self.all_images())
        self.template_forks += forked
        return forked

    def restart(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Continue from a rewritten conversation (a context strategy's window or summary): ``messages`` become the
        conversation and its prompt ids are one fresh render of them, which is exactly what the model sees next.

        The linear ids of the old history end here; a trainer keeps them as an earlier segment.
        """
        if not messages or messages[-1].get("role") == "assistant":
            raise AgentGymError("ChatAgent.restart() needs a conversation that ends with a user or tool message "
                                "(the model answers it next).")
        self.messages = [m if isinstance(m, Message) else Message(m) for m in messages]
        self._last_action_ids = ()
        if self.tokenizer is not None:
            self.pending_prompt_ids = self._encode_images(self._render(self.messages, add_generation_prompt=True),
                                                          self.all_images())
            self.token_ids = list(self.pending_prompt_ids)

    def amend_observation(self, text: str) -> None:
        """Replace the latest observation (not yet answered) by ``text``: a summary request appended to it, say.

        Its ids are taken off the end and the new text is encoded with the same glue, so the sequence stays the
        linear one the model samples from.
        """
        if len(self.messages) < 2 or self.messages[-1].get("role") != self.observation_role \
                or self.messages[-2].get("role") != "assistant":
            raise AgentGymError("ChatAgent.amend_observation() needs an observation that follows an action and has "
                                "not been answered yet.")
        if self.tokenizer is not None:
            del self.token_ids[len(self.token_ids) - len(self.pending_prompt_ids):]
        self.messages.pop()
        self.add_observation(text, images=self.observation_images)

    def fork(self) -> ChatAgent:
        """An independent copy of this conversation (same messages and token ids; the tokenizer is shared).

        Branching samplers continue the copy separately, so its future tokens never touch the original's.
        """
        other = ChatAgent.__new__(ChatAgent)
        other.tokenizer = self.tokenizer
        other.system_prompt = self.system_prompt
        other.observation_role = self.observation_role
        other.messages = list(self.messages)  # read-only Messages: shared, never changed in place
        other.token_ids = list(self.token_ids)
        other.pending_prompt_ids = list(self.pending_prompt_ids)
        other._last_action_ids = self._last_action_ids
        other._glue_cache = self._glue_cache
        other.tools = self.tools
        other.check_forks = self.check_forks
        other.images = self.images
        other.processor = self.processor
        other.observation_images = self.observation_images
        other.template_forks = self.template_forks
        other.prompt_mismatches = self.prompt_mismatches
        return other

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def conversation(self) -> list[Mapping[str, Any]]:
        return [dict(m) for m in self.messages]
