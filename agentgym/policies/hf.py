"""HFPolicy: a local Hugging Face causal LM as a token-level policy (CPU or GPU).

Why a sampling loop of our own instead of ``model.generate``: trainers need, for every sampled token, its
log-prob and the entropy of the distribution it was drawn from, computed exactly as the sampler saw them
(temperature applied), with per-request temperature, top-p, length and stop strings inside one batch.
``generate`` offers neither per-row sampling parameters nor entropies, and re-scoring afterwards would
cost a second forward pass. The loop here is plain batched decoding with a KV cache: prompts are left
padded (attention mask plus explicit position ids, so padding changes nothing), rows that finish are
dropped from the batch and its cache, and all per-token work is done with tensor ops over the batch.

Across the turns of an episode the KV cache is kept (:mod:`agentgym.policies.kv_cache`): a request that
carries an ``episode_id`` reuses the longest prefix of its prompt whose keys and values an earlier turn
computed, so each turn runs only its new tokens. Rows of one batch then have cached parts of different
lengths and suffixes of different lengths: each row's cache is left padded to the longest one and its
suffix is left padded too, so the padding sits between the cached part and the suffix. The attention mask
hides both gaps and position ids come from the mask, so every row sees exactly its own tokens at their own
positions, as if its whole prompt had been computed in one pass.

Vision-language models (given a ``processor``, e.g. from ``AutoProcessor``) sample the same way: the prompt ids
already hold each image's placeholder tokens, expanded by the processor in the
:class:`~agentgym.agent.ChatAgent`, and the first forward pass of a batch also gets the pixel values of the images
whose tokens it computes (the image processor's output, in row order). A reused cached prefix never ends inside
an image's tokens, so every image is encoded whole in exactly one pass. Models whose language model uses 1-D
positions (LLaVA-style, Idefics3/SmolVLM) get positions from the mask. Models with 3-D multimodal rotary positions
(M-RoPE: Qwen2-VL, Qwen2.5-VL) get each row's positions from the model's own ``get_rope_index`` over the row's
whole prompt, the part a pass computes sliced out of it; generated tokens continue after the prompt's largest
position, as the model's own ``generate`` does (:mod:`agentgym.models.geometry`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError, DependencyNotInstalled
from agentgym.models.geometry import mrope_positions, rope_position_ids  # noqa: F401 - old imports from here
from agentgym.models.geometry import mrope_suffix_positions, rope_index_fn, vocab_size
from agentgym.models.vision import image_token_id, image_token_spans, is_vision_model_dir, pixel_inputs
from agentgym.policies.base import (
    Generation,
    GenerationRequest,
    InProcessTokenPolicy,
    SamplingParams,
)
from agentgym.policies.choices import ChoiceTrees, allowed_mask
from agentgym.policies.continuous import ContinuousSampler
from agentgym.policies.decode_outputs import collect_generations, hit_stop_strings, top_logprobs
from agentgym.policies.kv_batch import batch_cache, plain_dynamic_layers, store_rows
from agentgym.policies.kv_cache import DEFAULT_KV_CACHE_TOKENS, EpisodeKVCache
from agentgym.policies.sampling_rules import SamplingRules
from agentgym.policies.seeding import row_seeds, row_uniforms
from agentgym.policies.slot_model import slot_model_support
from agentgym.utils.images import ImageRef, image_parts

__all__ = ["SAMPLERS", "HFPolicy", "request_images"]

#: ``HFPolicy(sampler=...)`` values: continuous batching (default) or the reference loop.
SAMPLERS = ("continuous", "reference")
# With continuous batching the policy takes every waiting request at once; the decode batch bounds the work.
_CONTINUOUS_CONCURRENCY = 1 << 16

# Old names of helpers that moved to agentgym.models.geometry and agentgym.policies.kv_batch, kept for one release.
_rope_index_fn = rope_index_fn
_plain_dynamic_layers = plain_dynamic_layers

logger = logging.getLogger(__name__)

_IM_END = "<|im_end|>"


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyNotInstalled("torch", "train", "HFPolicy") from exc
    return torch


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyNotInstalled("transformers", "train", "HFPolicy") from exc
    return transformers


class HFPolicy(InProcessTokenPolicy):
    """A transformers causal LM sampled in-process, returning token ids, log-probs and entropies.

    Args:
        model: A causal LM (``AutoModelForCausalLM``-style: called with ``input_ids``, ``attention_mask``,
            ``position_ids``, ``past_key_values`` (``cache`` in transformers 5), ``use_cache`` and returning
            ``logits`` and the cache under the same name).
        tokenizer: Its tokenizer, with a chat template (the :class:`~agentgym.agent.ChatAgent` reads it
            from ``policy.tokenizer`` to build exact prompt ids).
        device: Where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``); the model is moved there.
        max_batch_size: Most sequences decoded together; larger calls are split into batches of prompts
            of similar length.
        dtype: Optional torch dtype (or its name, e.g. ``"bfloat16"``) to cast the model to.
        name: Shown in eval tables and stored in trajectories (default: the model's path or class).
        kv_cache_episodes: Most episodes whose KV cache is kept between turns, or as many as are running when
            that is more (the rollout engine's episodes, begun with :meth:`begin_episode`, are kept while they run,
            within ``kv_cache_tokens``; least recently used ended ones are dropped first); 0 turns reuse across
            turns off. Requests reach the cache through their
            ``episode_id`` (the rollout engine sets it; ``generate(..., episode_ids=...)`` for direct calls).
        kv_cache_tokens: Most tokens kept over all episodes together: memory is this times the model's KV bytes
            per token (2 x layers x kv_heads x head_dim x dtype size); 0 turns reuse off.
        processor: The model's Hugging Face processor (``AutoProcessor``) for a vision-language model: the policy
            then ``accepts_images``, the ChatAgent expands image placeholders with it, and sampling passes pixel
            values. ``tokenizer`` may then be ``None`` (the processor's tokenizer is used).
        sampler: How :meth:`act` (the rollout engine's path) samples. ``"continuous"`` (default): continuous
            batching over a slot KV cache (:mod:`agentgym.policies.continuous`): each request joins the running
            decode batch at its next step and leaves it when it finishes, so the policy takes every waiting request
            at once (``max_concurrency`` is high); up to ``max_batch_size`` requests decode together, and each
            episode's keys and values stay in its slot between turns; the slots hold at most
            ``max(kv_cache_tokens, 65536)`` tokens together. Requests it cannot serve (images, a model outside the
            Llama family, a prompt plus reply longer than the model's context or than that
            budget over ``max_batch_size``) take the reference loop. ``"reference"``: every ``act`` call is one :meth:`generate` call, one batch from
            start to finish (the sampler before continuous batching, kept for comparison). :meth:`generate`
            itself is always the reference loop.

    Raises:
        ConfigError: If ``max_batch_size``, ``dtype``, ``sampler`` or a KV-cache limit is invalid, or the processor
            does not fit the model.
    """

    max_concurrency: int = 1
    supports_choices: bool = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        max_batch_size: int = 64,
        dtype: Any = None,
        name: str | None = None,
        kv_cache_episodes: int = 64,
        kv_cache_tokens: int = DEFAULT_KV_CACHE_TOKENS,
        processor: Any = None,
        sampler: str = "continuous",
    ) -> None:
        torch = _import_torch()
        if sampler not in SAMPLERS:
            raise ConfigError(f"sampler must be one of {SAMPLERS}, got {sampler!r}.")
        if processor is not None:
            tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
            self._image_token_id = image_token_id(processor, model)
        if tokenizer is None:
            raise ConfigError("HFPolicy needs a tokenizer (or a processor that has one).")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}.")
        if isinstance(dtype, str):
            resolved = getattr(torch, dtype, None)
            if not isinstance(resolved, torch.dtype):
                raise ConfigError(
                    f"Unknown dtype {dtype!r}; use a torch dtype name such as 'float32', 'bfloat16' or 'float16'."
                )
            dtype = resolved
        elif dtype is not None and not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype must be a torch.dtype, its name, or None; got {dtype!r}.")
        self._torch = torch
        self.device = torch.device(device)
        model = model.to(self.device)
        if dtype is not None:
            model = model.to(dtype)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.processor = processor
        self.accepts_images = processor is not None
        self.max_batch_size = max_batch_size
        self.max_concurrency = 1
        config = getattr(model, "config", None)
        self.name = name or getattr(config, "name_or_path", "") or type(model).__name__
        self._stop_ids = self._find_stop_ids(tokenizer, model)
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = int(pad if pad is not None else (self._stop_ids[0] if self._stop_ids else 0))
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover - exotic callables
            params = {}
        self._keep_last_logits = "logits_to_keep" in params
        # transformers 5 names the KV cache argument and output field ``cache``; before, ``past_key_values`` (the
        # old name still works there, but warns once a process through transformers' logger)
        self._cache_name = "cache" if "cache" in params else "past_key_values"
        self._lock = threading.Lock()
        self._choice_trees = ChoiceTrees(tokenizer, self._stop_ids)
        self.kv_cache = EpisodeKVCache(kv_cache_episodes, kv_cache_tokens)
        self._kv_reusable: bool | None = None  # unknown until a forward pass shows the model's cache type
        self._kv_weights: tuple[int, int, int] | None = None  # the weights the cached keys and values came from
        # Qwen2-VL style models place image tokens on a 3-D grid of rotary positions (M-RoPE).
        self._rope_index = rope_index_fn(model) if processor is not None else None
        self._grids: dict[tuple[int, int], Any] = {}
        self.sampler = sampler
        self._continuous: ContinuousSampler | None = None
        self._continuous_unsupported = slot_model_support(model) if processor is None else "a vision-language model"
        if sampler == "continuous" and self._continuous_unsupported is None:
            self.max_concurrency = _CONTINUOUS_CONCURRENCY

    @staticmethod
    def _find_stop_ids(tokenizer: Any, model: Any) -> list[int]:
        """Token ids that end a turn: the tokenizer's EOS, ``<|im_end|>`` and the generation config's EOS."""
        ids: set[int] = set()
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is not None:
            ids.add(int(eos))
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        if _IM_END in vocab:
            ids.add(int(vocab[_IM_END]))
        gen_config = getattr(model, "generation_config", None)
        gen_eos = getattr(gen_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(int(i) for i in gen_eos)
        return sorted(ids)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> HFPolicy:
        """Load a model directory (e.g. one written by :func:`agentgym.models.build_tiny_model`).

        Args:
            path: A local Hugging Face model directory (with ``config.json`` and tokenizer files), or a Hub id
                (``org/name[@revision]``) already in the local Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``).
                Nothing is downloaded.
            **kwargs: Passed to :class:`HFPolicy` (``device``, ``max_batch_size``, ``dtype``, ``name``).

        Raises:
            ConfigError: If ``path`` is neither a local model directory nor a cached Hub id (the message says
                how to get it).
        """
        from agentgym.models.loading import is_hub_id, resolve_model_dir

        directory = resolve_model_dir(path)
        hub_name = str(path) if is_hub_id(path) and not Path(str(path)).is_dir() else None
        transformers = _import_transformers()
        _import_torch()
        from agentgym.models.tiny import quiet_progress_bars

        with quiet_progress_bars():
            if is_vision_model_dir(directory):  # a VLM: its processor and its image-text-to-text model class
                processor = transformers.AutoProcessor.from_pretrained(directory, local_files_only=True)
                model = transformers.AutoModelForImageTextToText.from_pretrained(directory, local_files_only=True)
                kwargs.setdefault("processor", processor)
                tokenizer = processor.tokenizer
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
                tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        kwargs.setdefault("name", hub_name or directory.name)  # a Hub snapshot's directory name is a commit hash
        policy = cls(model, tokenizer, **kwargs)
        # The trainer's system prompt travels with the model, so a plain RolloutEngine reproduces its training.
        from agentgym.policies.rollout_defaults import load_rollout_defaults

        policy.default_system_prompt = load_rollout_defaults(directory).get("system_prompt")
        return policy

    # ---- Policy API (prompt_ids() comes from InProcessTokenPolicy) ----------------------------------
    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Like :meth:`InProcessTokenPolicy.act`, passing each request's ``episode_id`` on for KV-cache reuse."""
        if not requests:
            return []
        prompts = [self.prompt_ids(r) for r in requests]
        if self._continuous_fits(prompts, requests):
            if self.model is None:
                raise AgentGymError("This HFPolicy was closed; create a new one (HFPolicy.from_pretrained(path)).")
            params = [r.sampling for r in requests]
            episodes = [str(r.episode_id or "") for r in requests]
            if not self.kv_cache.enabled:
                episodes = [""] * len(requests)
            sampler = self._continuous_sampler()
            futures = sampler.submit(prompts, params, episodes, row_seeds([p.seed for p in params]))
            return [await asyncio.wrap_future(f) for f in futures]
        images = [request_images(r) for r in requests] if self.processor is not None else None
        return await asyncio.to_thread(self.generate, prompts, [r.sampling for r in requests],
                                       episode_ids=[r.episode_id for r in requests], images=images)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's exact ids; for a VLM request without ids, its messages rendered and images expanded as
        the ChatAgent does."""
        if self.processor is None or request.prompt_token_ids is not None:
            return super().prompt_ids(request)
        from agentgym.agent import ChatAgent

        agent = ChatAgent(self.tokenizer, images=True, processor=self.processor)
        agent.messages = [dict(m) for m in request.messages]
        return agent._encode_images(agent._render(agent.messages, add_generation_prompt=True), agent.all_images())

    def begin_episode(self, episode_id: str, env: Any) -> None:
        """A new episode never inherits a stale cache entry under a reused id, and its entry is kept while it runs."""
        self.kv_cache.begin(episode_id)
        if self._continuous is not None:
            self._continuous.end_episode(episode_id)

    def end_episode(self, episode_id: str) -> None:
        """Free the episode's KV cache."""
        self.kv_cache.drop(episode_id)
        if self._continuous is not None:
            self._continuous.end_episode(episode_id)

    def _continuous_fits(self, prompts: list[list[int]], requests: Sequence[GenerationRequest]) -> bool:
        """Whether this ``act`` call goes to the continuous sampler (see ``sampler`` in the class docs)."""
        return all(self._fits_slot(p, r.sampling) for p, r in zip(prompts, requests))

    def _fits_slot(self, prompt: Sequence[int], sampling: SamplingParams) -> bool:
        """Whether one sequence can run in the continuous sampler (its reply fits a slot of the cache)."""
        if self.sampler != "continuous" or self._continuous_unsupported is not None or not prompt:
            return False
        limit = int(getattr(getattr(self.model, "config", None), "max_position_embeddings", 0) or 1 << 20)
        limit = min(limit, self._slot_tokens() // self.max_batch_size)  # the slot cache's memory bound
        return len(prompt) + sampling.max_tokens <= limit

    def continuous_submit(self, prompt: Sequence[int], sampling: SamplingParams, *,
                          on_token: Callable[[int, float, Any], None] | None = None,
                          cancel: threading.Event | None = None,
                          reuse_prefix: bool = True) -> concurrent.futures.Future[Generation] | None:
        """Queue one sequence in the continuous sampler (it joins the running batch at the next decode step).

        What a server needs beyond :meth:`act`: ``on_token(token id, log-prob, top or None)`` is called from the
        decode thread with each token as it is sampled (streaming per step), ``cancel`` stops the row at the
        next step (``finish_reason="abort"``), and ``reuse_prefix`` keeps the sequence's keys and values after it
        ends (bounded by the slots, least recently used evicted first) so that a later prompt extending it, such
        as the next turn of a chat, computes only its new tokens.

        Returns:
            The future of the :class:`Generation`, or ``None`` when the sequence cannot run there (the reference
            sampler was chosen, a vision-language model, or prompt plus ``max_tokens`` exceed a slot); the caller
            then uses :meth:`generate`.
        """
        if self.model is None:
            raise AgentGymError("This HFPolicy was closed; create a new one (HFPolicy.from_pretrained(path)).")
        if not self._fits_slot(prompt, sampling):
            return None
        sampler = self._continuous_sampler()
        return sampler.submit([list(prompt)], [sampling], [""], row_seeds([sampling.seed]), on_token=[on_token],
                              cancel=[cancel], keep=reuse_prefix and self.kv_cache.enabled)[0]

    def continuous_load(self) -> tuple[int, int]:
        """``(sequences waiting for a slot, rows decoding)`` of the continuous sampler (0, 0 before it starts)."""
        sampler = self._continuous
        return (0, 0) if sampler is None else sampler.load()

    def _slot_tokens(self) -> int:
        """Most tokens the continuous sampler's slot cache may hold: the KV-cache budget (``kv_cache_tokens``, at
        least the default, since running requests need their keys and values even with reuse off)."""
        return max(self.kv_cache.max_tokens, DEFAULT_KV_CACHE_TOKENS)

    def _continuous_sampler(self) -> ContinuousSampler:
        if self._continuous is None:
            logger.debug("%s: continuous batching over %d slots", self.name, self.max_batch_size)
            # The decode thread holds the sampler (its slot cache: hundreds of MB to GBs). It must not hold the
            # policy too (hence a weak reference for the weights' version), and it ends once the policy is collected
            # and what was queued is served: a process that trained run after run without close() (a sweep, a
            # notebook, the studies) grew by a whole sampler per run until the OOM killer stopped it.
            method = weakref.WeakMethod(self._weights_version)

            def weights_version() -> tuple[int, int, int] | None:
                bound = method()
                return None if bound is None else bound()

            self._continuous = ContinuousSampler(self.model, self.tokenizer, self._stop_ids, self._pad_id,
                                                 self.max_batch_size, self._choice_trees, self.kv_cache,
                                                 weights_version, self._slot_tokens())
            weakref.finalize(self, self._continuous.release)
        return self._continuous

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams] | SamplingParams,
        *,
        cancelled: Sequence[threading.Event | None] | None = None,
        episode_ids: Sequence[str] | None = None,
        images: Sequence[Sequence[ImageRef]] | None = None,
    ) -> list[Generation]:
        """Continue each prompt; the synchronous core of :meth:`act`, also used directly by trainers.

        Sampling is per row: temperature (0 = greedy), top-p, ``max_tokens``, stop strings and vLLM's processing
        fields (``top_k``, ``min_p``, the penalties, ``min_tokens``, ``stop_token_ids``, ``logit_bias``;
        :mod:`agentgym.policies.sampling_rules`), exactly as the continuous sampler applies them. A row ends
        when it samples an end-of-turn token (kept as the last of its ``token_ids``), when a stop string
        appears in its decoded text (the text is cut right after the stop string; ``token_ids`` keep the
        whole last token), or after ``max_tokens``.

        ``logprobs`` and ``entropies`` are those of the temperature-scaled distribution (temperature 1
        for greedy rows), before top-p truncation, which is the distribution trainers recompute.
        Sampling is reproducible when a request carries a seed: each row draws from its own stream seeded by
        its seed (:func:`~agentgym.policies.seeding.row_seeds`), so a request samples the same tokens whatever else shares its batch, and
        rows that share one seed still sample independently.

        Args:
            prompts: Prompt token ids, one sequence per row (each non-empty).
            sampling: One :class:`SamplingParams` for all rows or one per row.
            cancelled: Optional, one event per prompt (or ``None``). A row whose event is set stops at the
                next decoding step with ``finish_reason="abort"`` and what it generated so far; a batch whose
                rows are all finished or cancelled ends at once. A server sets them when clients disconnect,
                so abandoned requests stop costing compute.
            episode_ids: Optional, one per prompt (``""`` for none). A row with an id reuses the keys and values
                that earlier calls computed for the longest prefix of its prompt that they cover token for
                token, and leaves its own (prompt plus sampled tokens) for the next turn. Results equal those
                of recomputing up to float rounding. Without ids (trainers scoring unrelated prompts) nothing
                is cached. :meth:`end_episode` frees an episode's entry.
            images: For a vision-language model, one list per prompt: the images whose placeholder tokens the
                prompt holds, in order (:func:`request_images` of its request).

        Returns:
            One :class:`Generation` per prompt, in order.

        Raises:
            ConfigError: If a prompt is empty or the number of sampling params does not match.
            AgentGymError: If the policy was closed.
        """
        if self.model is None:
            raise AgentGymError("This HFPolicy was closed; create a new one (HFPolicy.from_pretrained(path)).")
        rows, params = self.check_generate_inputs(prompts, sampling)
        if cancelled is not None and len(cancelled) != len(rows):
            raise ConfigError(f"Got {len(cancelled)} cancel events for {len(rows)} prompts; pass one per prompt "
                              "(None for rows that cannot be cancelled).")
        if episode_ids is not None and len(episode_ids) != len(rows):
            raise ConfigError(f"Got {len(episode_ids)} episode ids for {len(rows)} prompts; pass one per prompt "
                              "('' for rows outside any episode).")
        row_images = [list(i) for i in images] if images is not None else [[] for _ in rows]
        if len(row_images) != len(rows):
            raise ConfigError(f"Got {len(row_images)} image lists for {len(rows)} prompts; pass one per prompt.")
        if any(row_images) and self.processor is None:
            raise ConfigError("This HFPolicy has no processor, so it cannot read images; load a vision-language model "
                              "with HFPolicy.from_pretrained(dir) (it finds the processor) or pass processor=...")
        spans = [self._image_spans(r, imgs) for r, imgs in zip(rows, row_images)]
        events = list(cancelled) if cancelled is not None else [None] * len(rows)
        episodes = [str(e or "") for e in episode_ids] if episode_ids is not None else [""] * len(rows)
        if not self.kv_cache.enabled or self._kv_reusable is False:
            episodes = [""] * len(rows)
        results: list[Generation | None] = [None] * len(rows)
        # Batches of similar length waste less compute on padding. The order does not depend on what is cached,
        # so a seeded batch samples the same tokens with and without cache reuse.
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        self.kv_cache.begin_generation(episodes)
        try:
            with self._lock:
                if any(episodes):
                    weights = self._weights_version()
                    if weights != self._kv_weights:  # keys and values of other weights would give other results
                        self.kv_cache.clear()
                        self._kv_weights = weights
                # Streams are derived over the whole call, not per chunk: rows that share a seed in different
                # chunks (a large GRPO group) must not replay each other's random numbers.
                streams = row_seeds([p.seed for p in params])
                for start in range(0, len(order), self.max_batch_size):
                    chunk = order[start:start + self.max_batch_size]
                    outputs = self._generate_batch([rows[i] for i in chunk], [params[i] for i in chunk],
                                                   [events[i] for i in chunk], [episodes[i] for i in chunk],
                                                   [streams[i] for i in chunk],
                                                   [(row_images[i], spans[i]) for i in chunk])
                    for i, out in zip(chunk, outputs):
                        results[i] = out
        finally:
            self.kv_cache.end_generation(episodes)
        return [r for r in results if r is not None]

    # ---- the decoding loop -----------------------------------------------------------------------
    def _generate_batch(self, prompts: list[list[int]], params: list[SamplingParams],
                        events: list[threading.Event | None] | None = None,
                        episodes: list[str] | None = None,
                        streams: list[int | None] | None = None,
                        vision: list[tuple[list[ImageRef], list[tuple[int, int]]]] | None = None) -> list[Generation]:
        torch = self._torch
        watched = [(i, e) for i, e in enumerate(events or ()) if e is not None]
        aborted: set[int] = set()
        device = self.device
        batch = len(prompts)
        lengths = [len(p) for p in prompts]
        max_new = max(p.max_tokens for p in params)
        pad = self._pad_id
        episodes = episodes or [""] * batch
        keeping = any(episodes)

        # Row i reuses cached[i] tokens of its episode's cache and runs its suffix. Columns of the batch:
        # [left pad | cached part] (cached_width) then [middle pad | suffix] (suffix_width) then generated ones.
        found = [self.kv_cache.lookup(e, p) if e else (0, None) for e, p in zip(episodes, prompts)]
        vision = vision or [([], [])] * batch
        while True:  # one pass, or (images) until no reused prefix ends inside an image's tokens
            suffix_width = max(n - c for n, (c, _) in zip(lengths, found))
            # Never wider than recomputing: a row whose suffix is long (a new episode) sets suffix_width anyway, so
            # other rows may compute more of their prompt at no extra cost instead of widening every later step.
            cached_width = min(max(c for c, _ in found), max(lengths) - suffix_width)
            aligned = [_outside_spans(min(c, cached_width), row_spans) for (c, _), (_, row_spans) in zip(found, vision)]
            aligned_found = [(a, entry) if a else (0, None) for a, (_, entry) in zip(aligned, found)]
            if [c for c, _ in aligned_found] == [c for c, _ in found] or not any(s for _, s in vision):
                found = aligned_found
                break
            found = aligned_found
        cached = [c for c, _ in found]
        suffixes = [n - c for n, c in zip(lengths, cached)]
        width = cached_width + suffix_width
        if keeping:
            self.kv_cache.record_use([p for p, e in zip(prompts, episodes) if e],
                                     [c for c, e in zip(cached, episodes) if e])
        input_ids = torch.tensor([[pad] * (suffix_width - s) + p[c:] for p, c, s in zip(prompts, cached, suffixes)],
                                 device=device)
        # One mask for the whole run: the two gaps are 0, cached, suffix and generated parts are 1.
        full_mask = torch.ones((batch, width + max_new), dtype=torch.long, device=device)
        for i, (c, s) in enumerate(zip(cached, suffixes)):
            if c < cached_width:
                full_mask[i, : cached_width - c] = 0
            if s < suffix_width:
                full_mask[i, cached_width: width - s] = 0
        position_ids = (full_mask[:, :width].cumsum(-1) - 1).clamp_(min=0)[:, cached_width:]
        next_pos = torch.tensor(lengths, dtype=torch.long, device=device)
        if self._rope_index is not None and any(imgs for imgs, _ in vision):
            position_ids, next_pos = self._mrope_pass_positions(prompts, cached, suffix_width, vision)
        # The images whose tokens this pass computes (outside the reused prefix), in row order, as the model's
        # image merge consumes them.
        pass_images = [img for c, (imgs, row_spans) in zip(cached, vision)
                       for img, (start, _) in zip(imgs, row_spans) if start >= c]
        vision_inputs = self._pixel_inputs(pass_images) if pass_images else {}

        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        greedy = temperature == 0
        scale = torch.where(greedy, torch.ones_like(temperature), temperature)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        use_top_p = (top_p < 1) & ~greedy
        max_tokens = torch.tensor([p.max_tokens for p in params], dtype=torch.long, device=device)
        stop_ids = torch.tensor(self._stop_ids, dtype=torch.long, device=device)
        all_greedy = bool(greedy.all())
        # Inverse-CDF sampling with one pre-drawn uniform per row and step: a row's tokens depend on its seed only.
        if streams is None:
            streams = row_seeds([p.seed for p in params])
        uniforms = None if all_greedy else row_uniforms(streams, max_new, device)
        any_top_p = bool(use_top_p.any())

        # Outputs, indexed by original row.
        out_tokens = torch.full((batch, max_new), pad, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((batch, max_new), dtype=torch.float32, device=device)
        out_entropy = torch.zeros((batch, max_new), dtype=torch.float32, device=device)
        num_generated = torch.zeros(batch, dtype=torch.long, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)  # finish_reason "stop"
        # Top-k candidate log-probs per position, for rows that ask for them (entropy-based branching).
        top_k = min(max(p.top_logprobs for p in params), vocab_size(self.model))
        out_top = torch.zeros((batch, max_new, top_k), dtype=torch.float32, device=device) if top_k else None
        out_top_ids = torch.zeros((batch, max_new, top_k), dtype=torch.long, device=device) if top_k else None

        # Constrained rows (SamplingParams.choices) walk a prefix tree of the allowed replies.
        trees = {i: self._choice_trees.get(p.choices, p.max_tokens) for i, p in enumerate(params) if p.choices}
        nodes: dict[int, Any] = {i: tree.root for i, tree in trees.items()}
        out_forced = torch.zeros((batch, max_new), dtype=torch.bool, device=device) if trees else None
        # Rows under a TokenConstraint (structured output) keep [constraint, its state].
        constraints = {i: [p.constraint, p.constraint.start(p.max_tokens)] for i, p in enumerate(params)
                       if p.constraint is not None}

        # vLLM's processing fields (penalties, bias, top_k, min_p, min_tokens, stop_token_ids), by original row.
        rules = SamplingRules(batch, vocab_size(self.model), self._stop_ids, device)
        rules.set_rows(range(batch), params, prompts)
        ruled = rules.any()
        # Stop strings are checked on decoded text, only for rows that have them.
        stop_strings = {i: p.stop for i, p in enumerate(params) if p.stop}
        stop_ids_so_far: dict[int, list[int]] = {i: [] for i in stop_strings}

        # State of the rows still in the batch (compacted as rows finish).
        rows = torch.arange(batch, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        mask = full_mask
        past = batch_cache(self.model, found, cached_width) if cached_width else None
        step_input = input_ids
        step_pos = position_ids
        total = width

        with torch.inference_mode():
            for t in range(max_new):
                kwargs: dict[str, Any] = dict(vision_inputs) if t == 0 else {}
                if self._keep_last_logits:
                    kwargs["logits_to_keep"] = 1
                kwargs[self._cache_name] = past
                out = self.model(
                    input_ids=step_input,
                    attention_mask=mask[:, :total],
                    position_ids=step_pos,
                    use_cache=True,
                    **kwargs,
                )
                past = getattr(out, self._cache_name)
                logits = out.logits[:, -1, :].float()
                logp = torch.log_softmax(logits / scale[:, None], dim=-1)
                probs = logp.exp()
                entropy = -torch.where(probs > 0, probs * logp, torch.zeros_like(probs)).sum(-1)
                if ruled:  # recorded logp/entropy stay the model's; sampling uses the processed distribution
                    steps = torch.full_like(rows, t)
                    logits = rules.process(rows, logits, steps)
                    probs = torch.softmax(rules.truncate(rows, logits / scale[:, None]), dim=-1)
                # A VLM never draws its <image> token (it would be an image with no pixels); the recorded log-probs
                # stay the model's own, so the trainer's scoring reproduces them.
                image_token = getattr(self, "_image_token_id", None)
                if image_token is not None:
                    logits = logits.clone()
                    logits[:, image_token] = float("-inf")
                    probs = probs.clone()
                    probs[:, image_token] = 0.0
                forced = None
                if trees or constraints:  # renormalise over the allowed ids (the recorded logp stays the model's)
                    allow = allowed_mask(rows, nodes, trees, logits.shape[-1], device, constraints, self._stop_ids)
                    logits = logits.masked_fill(~allow, float("-inf"))
                    constrained = torch.log_softmax(logits / scale[:, None], dim=-1)
                    probs = constrained.exp()
                    entropy = -torch.where(probs > 0, probs * constrained, torch.zeros_like(probs)).sum(-1)
                    forced = allow.sum(-1) == 1
                if all_greedy:
                    token = logits.argmax(-1)
                else:
                    sample_probs = probs
                    if any_top_p:
                        sorted_p, sorted_idx = probs.sort(-1, descending=True)
                        cut = ((sorted_p.cumsum(-1) - sorted_p) > top_p[:, None]) & use_top_p[:, None]
                        sample_probs = torch.zeros_like(probs).scatter_(-1, sorted_idx, sorted_p.masked_fill(cut, 0.0))
                    cdf = sample_probs.double().cumsum(-1)
                    target = (uniforms[rows, t] * cdf[:, -1]).unsqueeze(-1)
                    sampled = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
                    token = torch.where(greedy, logits.argmax(-1), sampled)
                token = token.masked_fill(done, pad)
                token_logp = logp.gather(-1, token[:, None]).squeeze(-1)

                alive = ~done
                out_tokens[rows, t] = token
                out_logprobs[rows, t] = token_logp
                out_entropy[rows, t] = entropy
                if forced is not None:
                    if out_forced is not None:
                        out_forced[rows, t] = forced & alive
                    for row, tok in zip(rows.tolist(), token.tolist()):
                        if row in nodes:
                            nodes[row] = trees[row].advance(nodes[row], tok)
                        elif row in constraints:
                            constraints[row][1] = constraints[row][0].advance(constraints[row][1], tok)
                if top_k:
                    top_values, top_index = logp.topk(top_k, dim=-1)
                    out_top[rows, t] = top_values
                    out_top_ids[rows, t] = top_index
                num_generated[rows] += alive.long()
                hit_stop = torch.isin(token, stop_ids) & alive
                hit_len = (t + 1 >= max_tokens) & alive
                may_stop = alive
                if ruled:
                    rules.record(rows, token)
                    extra = rules.stopped(rows, token)
                    if extra is not None:
                        hit_stop |= extra & alive
                    may_stop = alive & rules.may_stop(rows, torch.full_like(rows, t + 1))
                if stop_strings:
                    hit_stop |= hit_stop_strings(self.tokenizer, token, rows, alive & ~hit_stop, stop_strings,
                                                 stop_ids_so_far) & may_stop
                stopped[rows[hit_stop]] = True
                done = done | hit_stop | hit_len
                if watched:
                    newly = {i for i, e in watched if e.is_set() and i not in aborted}
                    if newly:
                        aborted |= newly
                        done = done | torch.isin(rows, torch.tensor(sorted(newly), device=device))
                num_done = int(done.sum())  # the one host sync per step
                if num_done == done.numel():
                    break

                step_input = token[:, None]
                step_pos = next_pos[:, None]
                next_pos = next_pos + 1
                total = width + t + 1
                # Drop finished rows from the batch and its cache once they are an eighth of it: fewer rows
                # make every later step cheaper, and batching the removals bounds the copying.
                if num_done and num_done * 8 >= done.numel() and hasattr(past, "batch_select_indices"):
                    keep = (~done).nonzero().squeeze(-1)
                    if keeping:
                        self._keep_caches(past, done.nonzero().squeeze(-1).tolist(), rows, mask, width, t, prompts,
                                          out_tokens, num_generated, episodes)
                    past.batch_select_indices(keep)
                    rows, done = rows[keep], done[keep]
                    step_input, step_pos, next_pos = step_input[keep], step_pos[keep], next_pos[keep]
                    mask, scale, greedy, top_p, use_top_p, max_tokens = (
                        mask[keep], scale[keep], greedy[keep], top_p[keep], use_top_p[keep], max_tokens[keep]
                    )
            if keeping:
                self._keep_caches(past, list(range(len(rows))), rows, mask, width, t, prompts, out_tokens,
                                  num_generated, episodes)

        top = None
        if top_k:
            top = top_logprobs(out_top, out_top_ids, out_logprobs, out_tokens, [p.top_logprobs for p in params])
        return collect_generations(self.tokenizer, out_tokens, out_logprobs, out_entropy, num_generated, stopped,
                                   stop_strings, top, aborted, out_forced, set(trees))

    # ---- images (vision-language models) -------------------------------------------------------------
    def _image_spans(self, prompt: list[int], images: list[ImageRef]) -> list[tuple[int, int]]:
        """``[start, end)`` of each image's placeholder tokens in ``prompt``; checks they match ``images``."""
        if self.processor is None:
            return []
        return image_token_spans(prompt, self._image_token_id, len(images))

    def _mrope_pass_positions(self, prompts: list[list[int]], cached: list[int], suffix_width: int,
                              vision: list[tuple[list[ImageRef], list[tuple[int, int]]]]) -> tuple[Any, Any]:
        """``([3, B, suffix_width], [B])``: M-RoPE positions of the tokens this pass computes, and each row's first
        generated position (:func:`~agentgym.models.geometry.mrope_suffix_positions`)."""
        grids = [self._torch.stack([self._image_grid(image) for image in images]) if images else None
                 for images, _ in vision]
        return mrope_suffix_positions(self.model, prompts, cached, suffix_width, grids, self.device)

    def _image_grid(self, image: ImageRef) -> Any:
        """``image``'s ``(t, h, w)`` patch grid from the image processor, cached by size (it depends on nothing else)."""
        key = (image.width, image.height)
        grid = self._grids.get(key)
        if grid is None:
            grid = self._pixel_inputs([image])["image_grid_thw"][0].to(self.device)
            self._grids[key] = grid
        return grid

    def _pixel_inputs(self, images: list[ImageRef]) -> dict[str, Any]:
        """The image processor's tensors for ``images`` (``pixel_values`` and whatever else the model takes)."""
        return pixel_inputs(self.processor, images, self.device, dtype=next(self.model.parameters()).dtype)

    # ---- KV-cache reuse across turns -----------------------------------------------------------------
    def _weights_version(self) -> tuple[int, int, int]:
        """Changes whenever the weights may have: another model object, parameters added or removed (an adapter),
        or any in-place update (an optimizer step, ``load_state_dict``), which bumps a tensor's version counter."""
        params = list(self.model.parameters())
        return id(self.model), len(params), sum(p._version for p in params)

    def _keep_caches(self, past: Any, positions: list[int], rows: Any, mask: Any, width: int, step: int,
                     prompts: list[list[int]], out_tokens: Any, num_generated: Any, episodes: list[str]) -> None:
        """Store the keys and values of the rows at ``positions`` of the live batch for their episodes' next turns
        (:func:`~agentgym.policies.kv_batch.store_rows`), or turn reuse off for a cache that cannot be sliced."""
        layers = plain_dynamic_layers(past)
        if layers is None:
            if self._kv_reusable is None:
                logger.info("%s: this model's KV cache is not a plain DynamicCache (sliding window, hybrid or "
                            "quantized layers); turns of an episode are recomputed.", self.name)
            self._kv_reusable = False
            self.kv_cache.clear()
            return
        self._kv_reusable = True
        store_rows(self.kv_cache, layers, positions, rows, mask, width, step, prompts, out_tokens, num_generated,
                   episodes)

    def close(self) -> None:
        """Drop the model reference and the cached keys and values so their memory can be freed."""
        if self._continuous is not None:
            self._continuous.close()
            self._continuous = None
        self.model = None
        self.kv_cache.clear()


def request_images(request: GenerationRequest) -> list[ImageRef]:
    """The images of a request's messages, in order (the order of their placeholder tokens in the prompt)."""
    return [image for m in request.messages for image in image_parts(m.get("content"))]


def _outside_spans(cached: int, spans: Sequence[tuple[int, int]]) -> int:
    """``cached`` moved back to the start of the image span it falls inside, if any (images are encoded whole)."""
    for start, end in spans:
        if start < cached < end:
            return start
    return cached
