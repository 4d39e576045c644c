"""Per-episode KV caches kept between the turns of multi-turn episodes (used by :class:`~agentgym.policies.HFPolicy`).

Why: turn t's prompt is turn t-1's prompt, the tokens sampled then and the observation glue, so all but a short
suffix was already run through the model. Keeping each episode's keys and values after a turn lets the next turn
compute only the new suffix. Reuse is by verified prefix, never by trust: an entry records the exact token ids its
keys and values cover, and a prompt reuses only the longest cached prefix equal to it token for token (a template
that re-renders history, a branch or a retried turn falls back to recomputing what differs).

Memory is bounded by a least-recently-used limit on episodes and on cached tokens; the rollout engine frees an
episode's entry when the episode ends (``Policy.end_episode``). This module only stores tensors: building batched
caches from entries and harvesting them after decoding is :mod:`agentgym.policies.kv_batch`'s job.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["DEFAULT_KV_CACHE_TOKENS", "CachedPrefix", "EpisodeKVCache", "kv_bytes_per_token"]

#: HFPolicy's default token budget (trainers raise it to hold every episode they run at once)
DEFAULT_KV_CACHE_TOKENS = 65536


@dataclass(frozen=True)
class CachedPrefix:
    """Keys and values of one episode's tokens.

    Attributes:
        ids: The token ids the tensors cover, in order (position ``i`` of every tensor is token ``ids[i]``).
        layers: Per layer ``(keys, values)``, each ``[kv_heads, len(ids), head_dim]``.
    """

    ids: tuple[int, ...]
    layers: tuple[tuple[Any, Any], ...]


def kv_bytes_per_token(model: Any) -> int | None:
    """Bytes the keys and values of one token take in ``model``'s cache (2 x layers x kv_heads x head_dim x dtype
    size), read from its config (a vision-language model's text config); ``None`` when the config does not say."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    try:
        element = next(model.parameters()).element_size()
    except (AttributeError, StopIteration, TypeError):
        element = 4
    return 2 * layers * kv_heads * head_dim * element


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # the usual case (a prompt extends the cached ids), compared at C speed
        return n
    lo, hi = 0, n  # the first mismatch lies in [lo, hi): bisect on slice equality, still at C speed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(a[lo:mid]) == tuple(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


def _check_limit(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0 (0 turns KV-cache reuse across turns off), got {value!r}.")
    return value


class EpisodeKVCache:
    """A thread-safe LRU store of :class:`CachedPrefix` entries keyed by episode id.

    Args:
        max_episodes: Most episodes kept, or as many as are live (begun with :meth:`begin`, not yet dropped) when
            that is more: a live episode is never evicted for this limit. 0 disables the store.
        max_tokens: Most tokens kept over all episodes together (memory is this times the model's KV bytes per
            token); an entry longer than this is not kept. 0 disables the store. Over it, entries of episodes
            that are not live go first, least recently used first; then the entry being stored is not kept.

    Attributes:
        stats: Counters since creation, as :meth:`record_use` and :meth:`store` saw them: ``hits`` / ``misses``
            (rows with an episode id that did / did not reuse a prefix), their ``prompt_tokens`` and
            ``reused_tokens``, ``evictions``, ``too_long`` (entries over the token limit).

    Raises:
        ConfigError: If a limit is not an integer >= 0.
    """

    def __init__(self, max_episodes: int, max_tokens: int) -> None:
        self.max_episodes = _check_limit("kv_cache_episodes", max_episodes)
        self.max_tokens = _check_limit("kv_cache_tokens", max_tokens)
        self._entries: OrderedDict[str, CachedPrefix] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        # Episodes with a generation in flight, and those of them that ended meanwhile: their results must not
        # bring back an entry that end_episode freed.
        self._in_flight: Counter[str] = Counter()
        self._ended: set[str] = set()
        self._live: set[str] = set()  # episodes begun and not yet ended (see store)
        self.stats: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return self.max_episodes > 0 and self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens held over all entries."""
        return self._tokens

    def lookup(self, episode_id: str, prompt: Sequence[int]) -> tuple[int, CachedPrefix | None]:
        """How many leading tokens of ``prompt`` the episode's entry covers, and the entry (``0, None`` if none).

        At most ``len(prompt) - 1`` tokens are reused: the last prompt token must run through the model to give
        the logits of the first sampled token.
        """
        if not episode_id or not self.enabled:
            return 0, None
        with self._lock:
            entry = self._entries.get(episode_id)
            if entry is not None:
                self._entries.move_to_end(episode_id)
        reused = 0 if entry is None else min(common_prefix_length(entry.ids, prompt), len(prompt) - 1)
        return (reused, entry) if reused else (0, None)

    def record_use(self, prompts: Sequence[Sequence[int]], reused: Sequence[int]) -> None:
        """Count what a batch actually reused (the policy may reuse less than :meth:`lookup` offered)."""
        with self._lock:
            for prompt, n in zip(prompts, reused):
                self.stats["hits" if n else "misses"] += 1
                self.stats["prompt_tokens"] += len(prompt)
                self.stats["reused_tokens"] += n

    def store(self, episode_id: str, entry: CachedPrefix) -> None:
        """Keep ``entry`` as the episode's cache (replacing the old one), then evict least recently used ones."""
        if not episode_id or not self.enabled:
            return
        size = len(entry.ids)
        with self._lock:
            if episode_id in self._ended:
                return
            old = self._entries.pop(episode_id, None)
            if old is not None:
                self._tokens -= len(old.ids)
            if size > self.max_tokens:
                self.stats["too_long"] += 1
                return
            self._entries[episode_id] = entry
            self._tokens += size
            # Live episodes (begun, not ended) come back for their next turn, so the episode limit never evicts
            # them: with more episodes in flight than kv_cache_episodes, least-recently-used eviction dropped each
            # entry just before its episode's next turn (128 Sokoban rollouts at once reused 25% of their prompt
            # tokens instead of 88%, and sampled 2.4x slower).
            limit = max(self.max_episodes, len(self._live))
            while len(self._entries) > limit or self._tokens > self.max_tokens:
                victim = self._victim(episode_id)
                evicted = self._entries.pop(victim)
                self._tokens -= len(evicted.ids)
                self.stats["evictions"] += 1

    def _victim(self, newest: str) -> str:
        """The entry to evict: the least recently used one of an episode that is not live, else the entry just
        stored. Live episodes take their turns round-robin, and there evicting the least recently used entry
        evicts the one needed next, every time; keeping the others gives a stable subset its hits."""
        for episode_id in self._entries:
            if episode_id not in self._live:
                return episode_id
        return newest if newest in self._entries else next(iter(self._entries))

    def begin(self, episode_id: str) -> None:
        """An episode starts: free any stale entry under its id, and count it live until :meth:`drop`."""
        self.drop(episode_id)
        if episode_id:
            with self._lock:
                self._live.add(episode_id)

    def drop(self, episode_id: str) -> None:
        """Free the episode's entry; results of a generation still in flight for it are not kept either."""
        with self._lock:
            self._live.discard(episode_id)
            old = self._entries.pop(episode_id, None)
            if old is not None:
                self._tokens -= len(old.ids)
            if episode_id in self._in_flight:
                self._ended.add(episode_id)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tokens = 0

    def begin_generation(self, episode_ids: Sequence[str]) -> None:
        """Mark episodes as having a generation in flight (pair with :meth:`end_generation`)."""
        with self._lock:
            self._in_flight.update(e for e in episode_ids if e)

    def end_generation(self, episode_ids: Sequence[str]) -> None:
        with self._lock:
            self._in_flight.subtract(e for e in episode_ids if e)
            for e in [e for e, n in self._in_flight.items() if n <= 0]:
                del self._in_flight[e]
                self._ended.discard(e)
