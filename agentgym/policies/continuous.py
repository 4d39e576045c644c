"""Continuous batching for :class:`~agentgym.policies.hf.HFPolicy`: every live request's next token in one forward.

Why: the reference loop (``HFPolicy.generate``) decodes one batch of requests from start to finish. In a rollout the
engine hands it whatever turns are waiting, so a batch starts short of rows (the others are still stepping their
envs), ends at the speed of its longest reply, and the turns that arrive meanwhile wait for the next one; and each
batch rebuilds its KV cache from per-episode copies and grows it by ``torch.cat`` every step. Here a single decode
thread owns a slot KV cache (:class:`~agentgym.policies.slot_model.SlotModel`): a request is admitted at the next
step (its prompt's new suffix prefilled into its episode's slot), joins the one decode forward all live rows share,
and leaves the batch the step it finishes, its future resolved; its episode keeps the slot for the next turn.

Per step the Python work is a fixed number of tensor ops over all rows: sampling, log-probs and entropies as the
reference computes them, choice constraints and stop-string prefilters as table lookups
(:mod:`agentgym.policies.token_tables`), and one host sync to learn which rows finished. Per-row Python runs once
per turn (admission and the finished :class:`~agentgym.policies.base.Generation`), and for the rare row whose newest
token could end a stop string.

Sampling is the reference's, row for row: the same temperature, top-p and inverse-CDF draw from the row's own
seeded stream (:mod:`agentgym.policies.seeding`), so a seeded request samples the ids the reference sampler does
(up to float rounding of the logits at a CDF boundary) and greedy decoding is identical.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.policies.base import Generation, SamplingParams
from agentgym.policies.choices import ChoiceTrees, constraint_row
from agentgym.policies.decode_outputs import top_logprobs
from agentgym.policies.kv_cache import EpisodeKVCache, common_prefix_length
from agentgym.policies.sampling_rules import SamplingRules
from agentgym.policies.seeding import row_uniforms
from agentgym.policies.slot_model import SlotModel
from agentgym.policies.token_tables import ChoiceAutomaton, StopCandidates

__all__ = ["ContinuousSampler"]

logger = logging.getLogger(__name__)

_RUNNING: weakref.WeakSet[ContinuousSampler] = weakref.WeakSet()
"""Samplers whose decode thread is running (the thread holds its sampler until the thread ends)."""
_DECODE_THREADS: set[threading.Thread] = set()
"""Every decode thread started and not yet seen finished."""


@atexit.register
def _end_decode_threads() -> None:
    """Close every running sampler and wait for its decode thread before the interpreter tears down.

    Why: a decode thread ends by dropping its sampler, which frees the slot cache's tensors one by one, each
    dealloc releasing and retaking the GIL. A policy dropped just before the script ended left that thread still
    freeing tensors when the interpreter began to finalize; a daemon thread retaking the GIL then is unwound
    through torch's C++ frames, and the process aborted ("terminate called without an active exception", exit
    status 134) after the script had done its work.
    """
    for sampler in list(_RUNNING):
        sampler.close()
    for thread in list(_DECODE_THREADS):
        thread.join(timeout=60)

# Prefill chunks: most new tokens run in one forward (bounds the activations, [tokens, intermediate] per layer).
_PREFILL_TOKENS = 8192


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    episode: str
    stream: int | None
    future: concurrent.futures.Future[Generation]
    slot: int = -1
    reused: int = 0
    node: int = 0
    stops: tuple[str, ...] = ()
    stop_ids: list[int] = field(default_factory=list)
    #: Called from the decode thread with each new token: ``(token id, log-prob, top (log-probs, ids) or None)``.
    on_token: Callable[[int, float, tuple[tuple[float, ...], tuple[int, ...]] | None], None] | None = None
    #: Set by the caller when nobody waits any more; the row leaves the batch at the next step (``abort``).
    cancel: threading.Event | None = None
    #: Without an episode: keep the slot's keys and values after the request, for a later prompt that extends it.
    keep: bool = False


class ContinuousSampler:
    """The decode thread and its slots (one per live episode or request).

    Args:
        model: A causal LM :class:`SlotModel` supports.
        tokenizer: Decodes replies and stop-string tails.
        stop_ids: End-of-turn ids.
        pad_id: Written to unused output positions (never returned).
        slots: Most rows decoded at once (and episodes whose keys and values are kept).
        choice_trees: The policy's choice-tree cache (constrained decoding).
        kv_stats: The policy's :class:`EpisodeKVCache`, whose ``stats`` get this sampler's reuse counts too.
        weights_version: Returns a value that changes whenever the weights may have: cached keys and values of
            other weights are never reused.
        max_tokens: Most tokens the slot cache holds over all slots (:class:`SlotModel`).
    """

    def __init__(self, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int, slots: int,
                 choice_trees: ChoiceTrees, kv_stats: EpisodeKVCache, weights_version: Callable[[], Any],
                 max_tokens: int | None = None) -> None:
        import torch

        self.torch = torch
        self.tokenizer = tokenizer
        self.pad = pad_id
        self.slots = slots
        self.net = SlotModel(model, slots, max_tokens=max_tokens)
        self.device = self.net.device
        self.vocab = int(model.lm_head.out_features)
        self.stop_tensor = torch.tensor(list(stop_ids), dtype=torch.long, device=self.device)
        self.choice_trees = choice_trees
        self.automaton = ChoiceAutomaton(self.vocab, self.device)
        self.stop_table: StopCandidates | None = None
        self.kv_stats = kv_stats
        self.weights_version = weights_version
        self._weights: Any = None
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._closed = False
        self._draining = False  # release(): serve what is queued, then end the thread
        self._thread: threading.Thread | None = None
        # Slot ownership: which episode holds each slot, the ids its columns hold, and idle episodes by last use.
        self._owner: list[str | None] = [None] * slots
        self._ids: list[list[int]] = [[] for _ in range(slots)]
        self._busy: list[_Request | None] = [None] * slots
        self._of_episode: dict[str, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # owned, not decoding: evictable, oldest first
        self._ended: set[str] = set()  # episodes ended while their request was running
        self._bound: dict[int, int] = {}  # live slot -> one past the last column it can write
        self._steps_cap = 0
        self.rules = SamplingRules(slots, self.vocab, list(stop_ids), self.device)
        #: Tokens sampled so far, over all rows (what a caller measures cancellation by).
        self.tokens_sampled = 0
        #: Rows under a TokenConstraint (structured output): slot -> [constraint, its state].
        self._constraints: dict[int, list[Any]] = {}
        self._stop_list = [int(t) for t in stop_ids]
        #: Prompt tokens whose keys and values requests without an episode took from an earlier request (prefix reuse).
        self.prefix_tokens_reused = 0
        self._alloc_state(16)

    # ---- state tensors ------------------------------------------------------------------------------------------
    def _alloc_state(self, steps: int) -> None:
        """Per-slot sampling state and outputs, for replies of up to ``steps`` tokens (grown on demand)."""
        torch, n, dev = self.torch, self.slots, self.device
        old = self.__dict__.get("out_tokens")
        keep = self._steps_cap
        self._steps_cap = steps
        self.out_tokens = torch.full((n, steps), self.pad, dtype=torch.long, device=dev)
        self.out_logprobs = torch.zeros((n, steps), dtype=torch.float32, device=dev)
        self.out_entropy = torch.zeros((n, steps), dtype=torch.float32, device=dev)
        self.out_forced = torch.zeros((n, steps), dtype=torch.bool, device=dev)
        self.uniforms = torch.zeros((n, steps), dtype=torch.float64, device=dev)
        if old is not None:
            for name in ("out_tokens", "out_logprobs", "out_entropy", "out_forced", "uniforms"):
                getattr(self, name)[:, :keep] = getattr(self, "_old_" + name)
        if old is None:
            self.scale = torch.ones(n, dtype=torch.float32, device=dev)
            self.greedy = torch.ones(n, dtype=torch.bool, device=dev)
            self.top_p = torch.ones(n, dtype=torch.float32, device=dev)
            self.use_top_p = torch.zeros(n, dtype=torch.bool, device=dev)
            self.max_tokens = torch.ones(n, dtype=torch.long, device=dev)
            self.count = torch.zeros(n, dtype=torch.long, device=dev)  # tokens sampled this turn
            self.column = torch.zeros(n, dtype=torch.long, device=dev)  # where the next fed token goes
            self.last = torch.zeros(n, dtype=torch.long, device=dev)  # the token to feed next
            self.live = torch.zeros(n, dtype=torch.bool, device=dev)
            self.node = torch.zeros(n, dtype=torch.long, device=dev)
            self.has_stops = torch.zeros(n, dtype=torch.bool, device=dev)
            self.want_top = torch.zeros(n, dtype=torch.long, device=dev)  # top_logprobs asked for
        self._top_buffers(self.__dict__.get("top_cap", 0))

    def _top_buffers(self, k: int) -> None:
        """``[slots, steps, k]`` buffers of each step's k best log-probs and their ids (kept as far as they fit)."""
        torch = self.torch
        old = (self.__dict__.get("out_top"), self.__dict__.get("out_top_ids"))
        self.top_cap = k
        shape = (self.slots, self._steps_cap, k)
        self.out_top = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.out_top_ids = torch.zeros(shape, dtype=torch.long, device=self.device)
        if old[0] is not None and old[0].numel():
            steps, width = min(old[0].shape[1], shape[1]), min(old[0].shape[2], k)
            self.out_top[:, :steps, :width] = old[0][:, :steps, :width]
            self.out_top_ids[:, :steps, :width] = old[1][:, :steps, :width]

    def _grow_steps(self, steps: int) -> None:
        if steps <= self._steps_cap:
            return
        for name in ("out_tokens", "out_logprobs", "out_entropy", "out_forced", "uniforms"):
            setattr(self, "_old_" + name, getattr(self, name))
        self._alloc_state(max(steps, 2 * self._steps_cap))  # (re)sizes the top-k buffers to the new steps too
        for name in ("out_tokens", "out_logprobs", "out_entropy", "out_forced", "uniforms"):
            delattr(self, "_old_" + name)

    # ---- the caller's side --------------------------------------------------------------------------------------
    def submit(self, prompts: Sequence[list[int]], params: Sequence[SamplingParams], episodes: Sequence[str],
               streams: Sequence[int | None], *, on_token: Sequence[Callable[..., None] | None] | None = None,
               cancel: Sequence[threading.Event | None] | None = None,
               keep: bool = False) -> list[concurrent.futures.Future[Generation]]:
        """Queue requests; each future resolves with its :class:`Generation` (or the error that ended it).

        ``on_token`` (one callback or ``None`` per request) is called from the decode thread with every token as it
        is sampled, so a server streams per decode step; ``cancel`` events stop their rows at the next step with
        ``finish_reason="abort"``. ``keep``: rows without an episode leave their keys and values in their slot
        (least recently used evicted first), and a later prompt that extends one reuses them (prefix caching).
        """
        requests = []
        hooks = list(on_token) if on_token is not None else [None] * len(prompts)
        events = list(cancel) if cancel is not None else [None] * len(prompts)
        for prompt, p, episode, stream, hook, event in zip(prompts, params, episodes, streams, hooks, events):
            request = _Request(prompt, p, episode, stream, concurrent.futures.Future(), on_token=hook, cancel=event,
                               keep=keep and not episode)
            if p.constraint is not None:  # too small a max_tokens fails its own call, not the decode thread
                p.constraint.start(p.max_tokens)
            if p.choices:  # checked here, so a bad choice set fails its own call before it is queued
                request.node = -1
                self.choice_trees.get(p.choices, p.max_tokens)
            requests.append(request)
        with self._cond:
            if self._closed or self._draining:
                raise RuntimeError("the sampler was closed")
            self._pending.extend(requests)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentgym-continuous-sampler", daemon=True)
                self._thread.start()
                _RUNNING.add(self)
                for finished in [t for t in list(_DECODE_THREADS) if not t.is_alive()]:
                    _DECODE_THREADS.discard(finished)
                _DECODE_THREADS.add(self._thread)
            self._cond.notify()
        return [r.future for r in requests]

    def load(self) -> tuple[int, int]:
        """``(requests waiting for a slot, rows decoding)`` right now (read without the lock: a gauge)."""
        return len(self._pending), len(self._bound)

    def end_episode(self, episode: str) -> None:
        """Free the episode's slot (at the end of its running request, if one is running)."""
        with self._cond:
            slot = self._of_episode.get(episode)
            if slot is None:
                return
            if self._busy[slot] is not None:
                self._ended.add(episode)
            else:
                self._release(slot)

    def close(self) -> None:
        """End the decode thread now; requests still queued or running fail with "the sampler was closed"."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    def release(self) -> None:
        """End the decode thread once the requests it holds are done, without waiting for it. For an owner that
        went away: futures it handed out may still be awaited, and they resolve as usual; nothing new is taken."""
        with self._cond:
            self._draining = True
            self._cond.notify()

    def _release(self, slot: int) -> None:
        owner = self._owner[slot]
        if owner:
            self._of_episode.pop(owner, None)
            self._ended.discard(owner)
        self._owner[slot] = None
        self._ids[slot] = []
        self._idle.pop(slot, None)

    # ---- the decode thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        torch = self.torch
        while True:
            with self._cond:
                while not self._closed and not self._pending and not self._bound and not self._draining:
                    self._cond.wait()
                if self._closed or (self._draining and not self._pending and not self._bound):
                    failing = self._pending + [r for r in self._busy if r is not None]
                    self._pending = []
                    break
                admitted = self._admit()
            try:
                self._drop_cancelled()
                with torch.inference_mode():
                    if admitted:
                        self._prefill(admitted)
                    if self._bound:
                        self._decode()
            except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the error instead of hanging
                logger.exception("continuous sampler step failed")
                with self._cond:
                    for slot, request in enumerate(self._busy):
                        if request is not None:
                            self._busy[slot] = None
                            self._bound.pop(slot, None)
                            self.live[slot] = False
                            self._release(slot)
                            if not request.future.done():
                                request.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
        for request in failing:
            if not request.future.done():
                request.future.set_exception(RuntimeError("the sampler was closed"))

    def _drop_cancelled(self) -> None:
        """Rows whose caller went away leave the batch now, with what they generated (``abort``)."""
        gone = [slot for slot, r in enumerate(self._busy) if r is not None and slot in self._bound
                and (r.future.cancelled() or (r.cancel is not None and r.cancel.is_set()))]
        if gone:
            self._finish(gone, set(), aborted=set(gone))

    def _prefix_slot(self, prompt: list[int]) -> int:
        """The idle anonymous slot whose cached ids ``prompt`` extends furthest (-1: none worth taking).

        A slot holds one sequence, so taking it for a prompt that shares only a little of it would destroy the rest
        for little gain: a slot is taken only when the prompt extends at least half its cached ids (the next turn of
        a chat extends all of them); otherwise the request takes a free slot or evicts the least recently used.
        """
        best, best_len = -1, 0
        for slot in self._idle:
            if self._owner[slot] == "":
                n = common_prefix_length(self._ids[slot], prompt)
                if n > best_len and 2 * n >= len(self._ids[slot]):
                    best, best_len = slot, n
        return best

    def _admit(self) -> list[_Request]:
        """Give pending requests slots (their episode's own, a free one, or an idle episode's), lowest first."""
        if not self._pending:
            return []
        version = self.weights_version()
        if version != self._weights:  # keys and values of other weights would give other results
            self._weights = version
            for slot in range(self.slots):
                self._ids[slot] = []
        free = [s for s in range(self.slots) if self._owner[s] is None and self._busy[s] is None]
        free.reverse()  # pop() takes the lowest, keeping live rows packed at the front of the decode batch
        admitted, waiting = [], []
        for request in self._pending:
            if request.future.cancelled() or (request.cancel is not None and request.cancel.is_set()):
                if not request.future.done():
                    request.future.set_result(Generation(text="", token_ids=(), logprobs=(), entropies=(),
                                                         finish_reason="abort"))
                continue
            slot = self._of_episode.get(request.episode, -1) if request.episode else -1
            if slot < 0 and request.keep:
                slot = self._prefix_slot(request.prompt)
                if slot >= 0:
                    self._idle.pop(slot, None)
            if slot >= 0 and self._busy[slot] is not None:
                waiting.append(request)  # one turn per episode at a time; this one waits for the running one
                continue
            if slot < 0:
                if free:
                    slot = free.pop()
                elif self._idle:
                    slot, _ = self._idle.popitem(last=False)
                    self._release(slot)
                else:
                    waiting.append(request)
                    continue
                if request.episode:
                    self._owner[slot] = request.episode
                    self._of_episode[request.episode] = slot
                else:
                    self._owner[slot] = ""
            self._idle.pop(slot, None)
            self._busy[slot] = request
            request.slot = slot
            request.reused = min(common_prefix_length(self._ids[slot], request.prompt), len(request.prompt) - 1)
            admitted.append(request)
        self._pending = waiting
        return admitted

    def _prefill(self, requests: list[_Request]) -> None:
        """Set the admitted rows' sampling state, run their new prompt tokens, and sample their first tokens."""
        torch = self.torch
        self._grow_steps(max(r.params.max_tokens for r in requests))
        self.net.ensure_capacity(max(len(r.prompt) + r.params.max_tokens for r in requests),
                                 max(r.slot for r in requests) + 1)
        self.kv_stats.record_use([r.prompt for r in requests if r.episode], [r.reused for r in requests if r.episode])
        self.prefix_tokens_reused += sum(r.reused for r in requests if r.keep)
        slots = [r.slot for r in requests]
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        temps = torch.tensor([r.params.temperature for r in requests], dtype=torch.float32, device=self.device)
        greedy = temps == 0
        self.scale[index] = torch.where(greedy, torch.ones_like(temps), temps)
        self.greedy[index] = greedy
        top_p = torch.tensor([r.params.top_p for r in requests], dtype=torch.float32, device=self.device)
        self.top_p[index] = top_p
        self.use_top_p[index] = (top_p < 1) & ~greedy
        self.max_tokens[index] = torch.tensor([r.params.max_tokens for r in requests], device=self.device)
        self.count[index] = 0
        self.out_forced[index] = False
        self.column[index] = torch.tensor([len(r.prompt) for r in requests], device=self.device)
        steps = self._steps_cap
        self.uniforms[index] = row_uniforms([r.stream for r in requests], steps, self.device)
        for r in requests:
            if r.node == -1:
                r.node = self.automaton.root(self.choice_trees.get(r.params.choices, r.params.max_tokens))
            if r.params.constraint is not None:
                self._constraints[r.slot] = [r.params.constraint, r.params.constraint.start(r.params.max_tokens)]
            else:
                self._constraints.pop(r.slot, None)
            if r.params.stop:
                r.stops = tuple(r.params.stop)
                if self.stop_table is None:
                    self.stop_table = StopCandidates(self.tokenizer, self.vocab, self.device)
                self.stop_table.add(r.stops)
        self.node[index] = torch.tensor([r.node for r in requests], dtype=torch.long, device=self.device)
        self.has_stops[index] = torch.tensor([bool(r.stops) for r in requests], device=self.device)
        wanted = [min(r.params.top_logprobs, self.vocab) for r in requests]
        if max(wanted) > self.top_cap:
            self._top_buffers(max(wanted))
        self.want_top[index] = torch.tensor(wanted, dtype=torch.long, device=self.device)
        self.rules.set_rows(slots, [r.params for r in requests], [r.prompt for r in requests])
        # Chunks of at most _PREFILL_TOKENS new tokens (a prompt longer than that is a chunk of its own), in slot order.
        order = sorted(requests, key=lambda r: r.slot)
        start = 0
        while start < len(order):
            end, tokens = start + 1, len(order[start].prompt) - order[start].reused
            while end < len(order) and tokens + len(order[end].prompt) - order[end].reused <= _PREFILL_TOKENS:
                tokens += len(order[end].prompt) - order[end].reused
                end += 1
            chunk = order[start:end]
            rows = torch.tensor([r.slot for r in chunk], dtype=torch.long, device=self.device)
            suffixes = [r.prompt[r.reused:] for r in chunk]
            forced, ahead = self._run_ahead(rows)  # a reply's forced first tokens are fed with its prompt
            if forced is None:
                logits = self.net.prefill([r.slot for r in chunk], suffixes, [r.reused for r in chunk])
            else:
                extra = ahead.tolist()
                suffixes = [s + ids[:n] for s, ids, n in zip(suffixes, forced.tolist(), extra)]
                last = torch.tensor([len(s) - n - 1 for s, n in zip(suffixes, extra)], device=self.device)
                at = torch.minimum(last[:, None] + torch.arange(forced.shape[1] + 1, device=self.device),
                                   (last + ahead)[:, None])
                logits = self.net.prefill([r.slot for r in chunk], suffixes, [r.reused for r in chunk], at=at)
                self.column[rows] += ahead
            for r in chunk:
                self._bound[r.slot] = len(r.prompt) + r.params.max_tokens
            self.live[rows] = True
            if forced is None:
                self._sample(rows, logits)
            else:
                self._sample_positions(rows, logits, ahead)
            start = end

    def _decode(self) -> None:
        """One token for every live row (and the forced tokens after it, :meth:`_forced_runs`), in one forward over
        the slots up to the highest live one."""
        rows = max(self._bound) + 1
        width = max(self._bound.values())
        gathered = 2 * len(self._bound) < rows  # live rows scattered among idle (cached) slots: compute them only
        index = self.live[:rows].nonzero().squeeze(-1)
        if self._forced_runs(index):
            return
        if gathered:
            logits = self.net.decode(self.last[index], self.column[index], None, width, slots=index)
            self.column[index] += 1
            self._sample(index, logits)
            return
        logits = self.net.decode(self.last[:rows], self.column[:rows], self.live[:rows], width)
        self.column[index] += 1
        self._sample(index, logits[index])

    def _run_ahead(self, rows: Any) -> tuple[Any, Any]:
        """The forced tokens that come next for each of ``rows`` (``[rows, k]`` ids, padded) and how many each has;
        ``(None, None)`` when no row has one.

        Why: under choice constraints most of a reply has one continuation (``move("up")`` is five tokens of which
        one is chosen), and each such token cost a whole decode step, a read of every live row's keys and values,
        for a draw that has one outcome. Fed in the forward that samples the token before them, they are then
        sampled position by position as usual: their log-probs and entropies are still the model's, read off the
        logits at the position before each, so every recorded number is what one token per step gives. A run
        stops before an end-of-turn id (the row ends there, and an ended reply's last token is never fed) and
        inside the row's ``max_tokens``; rows with stop strings, sampling rules or a TokenConstraint never run
        ahead (each may end a reply, or change what is allowed, at a token the tables cannot see coming).
        """
        torch = self.torch
        if self.rules.any() or self._constraints:
            return None, None
        node = self.node[rows]
        automaton = self.automaton
        token = automaton.forced_token[node]
        remaining = self.max_tokens[rows] - self.count[rows]
        alive = ~self.has_stops[rows]
        ahead = []
        count = torch.zeros_like(remaining)
        for j in range(1, self._steps_cap + 1):
            alive = alive & (token >= 0) & (remaining > j) & ~torch.isin(token, self.stop_tensor)
            if not bool(alive.any()):
                break
            ahead.append(torch.where(alive, token, torch.full_like(token, self.pad)))
            count += alive
            node = torch.where(alive, automaton.next[node, token.clamp(min=0)], node)
            token = automaton.forced_token[node]
        if not ahead:
            return None, None
        return torch.stack(ahead, 1), count

    def _sample_positions(self, rows: Any, logits: Any, ahead: Any) -> None:
        """Sample ``logits[:, j]`` for the rows with at least ``j`` tokens run ahead, position by position."""
        for j in range(logits.shape[1]):
            take = (ahead >= j) & self.live[rows]  # a row that ended early (never, by _run_ahead's checks) stops
            self._sample(rows[take], logits[take, j])

    def _forced_runs(self, index: Any) -> bool:
        """Feed each live row's newest token and the forced tokens after it (:meth:`_run_ahead`) in one forward
        and sample them; ``False`` (nothing done) when no live row has a forced token next."""
        torch = self.torch
        forced, ahead = self._run_ahead(index)
        if forced is None:
            return False
        slots = index.tolist()
        columns = self.column[index].tolist()
        fed = torch.cat([self.last[index][:, None], forced], 1)
        runs = [ids[:n + 1] for ids, n in zip(fed.tolist(), ahead.tolist())]
        at = torch.arange(fed.shape[1], device=self.device).expand(len(slots), -1)
        logits = self.net.prefill(slots, runs, columns, at=at)
        self.column[index] += ahead + 1
        self._sample_positions(index, logits, ahead)
        return True

    def _sample(self, rows: Any, logits: Any) -> None:
        """Draw each row's next token as the reference sampler does, record it, and finish the rows that end."""
        torch = self.torch
        logits = logits.float()
        scale = self.scale[rows]
        step = self.count[rows]
        # Recorded: the model's own distribution at the row's temperature (what a trainer recomputes).
        logp = torch.log_softmax(logits / scale[:, None], dim=-1)
        probs = logp.exp()
        entropy = -torch.where(probs > 0, probs * logp, torch.zeros_like(probs)).sum(-1)
        ruled = self.rules.any()
        if ruled:  # min_tokens, logit_bias, penalties; then min_p and top_k (sampling_rules, vLLM's order)
            logits = self.rules.process(rows, logits, step)
            probs = torch.softmax(self.rules.truncate(rows, logits / scale[:, None]), dim=-1)
        node = self.node[rows]
        constrained = bool(node.any())
        if constrained:  # sample inside the trees: renormalised over the allowed ids (recorded logp: the model's)
            allow = self.automaton.allowed[node]
            logits = logits.masked_fill(~allow, float("-inf"))
            masked = torch.log_softmax(logits / scale[:, None], dim=-1)
            probs = masked.exp()
            entropy = -torch.where(probs > 0, probs * masked, torch.zeros_like(probs)).sum(-1)
        # Rows under a TokenConstraint: the same renormalisation over the ids their constraint allows (per-row
        # Python, and a host sync, only while such rows are live).
        custom = [(i, slot) for i, slot in enumerate(rows.tolist()) if slot in self._constraints] \
            if self._constraints else []
        if custom:
            allow = torch.ones_like(logits, dtype=torch.bool)
            for position, slot in custom:
                constraint, state = self._constraints[slot]
                constraint_row(allow[position], constraint.allowed(state), self._stop_list)
            logits = logits.masked_fill(~allow, float("-inf"))
            masked = torch.log_softmax(logits / scale[:, None], dim=-1)
            probs = masked.exp()
            entropy = -torch.where(probs > 0, probs * masked, torch.zeros_like(probs)).sum(-1)
        greedy = self.greedy[rows]
        if bool(greedy.all()):
            token = logits.argmax(-1)
        else:
            sample_probs = probs
            use_top_p = self.use_top_p[rows]
            if bool(use_top_p.any()):
                sorted_p, sorted_idx = probs.sort(-1, descending=True)
                cut = ((sorted_p.cumsum(-1) - sorted_p) > self.top_p[rows][:, None]) & use_top_p[:, None]
                sample_probs = torch.zeros_like(probs).scatter_(-1, sorted_idx, sorted_p.masked_fill(cut, 0.0))
            cdf = sample_probs.double().cumsum(-1)
            target = (self.uniforms[rows, step] * cdf[:, -1]).unsqueeze(-1)
            sampled = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
            token = torch.where(greedy, logits.argmax(-1), sampled)
        self.out_tokens[rows, step] = token
        self.out_logprobs[rows, step] = logp.gather(-1, token[:, None]).squeeze(-1)
        self.out_entropy[rows, step] = entropy
        self.tokens_sampled += int(rows.shape[0])
        if self.top_cap and bool(self.want_top[rows].any()):
            values, ids = logp.topk(self.top_cap, dim=-1)
            self.out_top[rows, step] = values
            self.out_top_ids[rows, step] = ids
        if constrained:
            self.out_forced[rows, step] = self.automaton.forced[node]
            self.node[rows] = self.automaton.next[node, token]
        if custom:
            sampled_ids = token.tolist()
            for position, slot in custom:
                entry = self._constraints[slot]
                entry[1] = entry[0].advance(entry[1], sampled_ids[position])
        count = step + 1
        self.count[rows] = count
        self.last[rows] = token
        hit_stop = torch.isin(token, self.stop_tensor)
        may_stop = None
        if ruled:
            self.rules.record(rows, token)
            extra = self.rules.stopped(rows, token)
            if extra is not None:
                hit_stop = hit_stop | extra
            may_stop = self.rules.may_stop(rows, count)
        done = hit_stop | (count >= self.max_tokens[rows])
        string_rows: list[int] = []
        if self.stop_table is not None:
            maybe = self.has_stops[rows] & self.stop_table.table[token] & ~hit_stop
            if may_stop is not None:
                maybe &= may_stop
            if bool(maybe.any()):
                string_rows = rows[maybe].tolist()
        finished = rows[done].tolist()  # the one host sync of a step
        self._notify(rows, step, token)
        stopped = set(rows[hit_stop].tolist()) if finished else set()
        for slot in string_rows:
            request = self._busy[slot]
            n = int(self.count[slot])
            window = 4 * max(len(s) for s in request.stops) + 8
            text = self.tokenizer.decode(self.out_tokens[slot, max(0, n - window):n].tolist(),
                                         skip_special_tokens=True)
            if any(s in text for s in request.stops):
                stopped.add(slot)
                if slot not in finished:
                    finished.append(slot)
        if finished:
            self._finish(finished, stopped)

    def _notify(self, rows: Any, step: Any, token: Any) -> None:
        """Hand this step's tokens to the rows that stream them (one host copy, only when a row streams)."""
        hooked = [(i, r) for i, r in enumerate(self._busy) if r is not None and r.on_token is not None]
        if not hooked:
            return
        row_list = rows.tolist()
        where = {slot: pos for pos, slot in enumerate(row_list)}
        hooked = [(slot, r) for slot, r in hooked if slot in where]
        if not hooked:
            return
        tokens = token.tolist()
        logprobs = self.out_logprobs[rows, step].tolist()
        steps = step.tolist()
        for slot, request in hooked:
            pos = where[slot]
            top = None
            k = min(request.params.top_logprobs, self.vocab)
            if k:
                values = self.out_top[slot, steps[pos], :k].tolist()
                ids = self.out_top_ids[slot, steps[pos], :k].tolist()
                if tokens[pos] not in ids:  # vLLM's convention: the sampled token follows when not among the k
                    values, ids = values + [logprobs[pos]], ids + [tokens[pos]]
                top = (tuple(values), tuple(ids))
            try:
                request.on_token(tokens[pos], logprobs[pos], top)
            except Exception:  # noqa: BLE001 - a broken consumer must not stop the other rows
                logger.exception("a token callback failed; its row is cancelled")
                request.cancel = request.cancel or threading.Event()
                request.cancel.set()

    def _finish(self, slots: list[int], stopped: set[int], aborted: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """Resolve the finished rows' futures; their episodes keep the slots (prompt and fed tokens cached)."""
        torch = self.torch
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.live[index] = False
        counts = self.count[index].tolist()
        tokens = self.out_tokens[index].tolist()
        logprobs = self.out_logprobs[index].tolist()
        entropies = self.out_entropy[index].tolist()
        forced = self.out_forced[index].tolist()
        results = []
        with self._cond:
            for i, slot in enumerate(slots):
                request = self._busy[slot]
                n = counts[i]
                ids = tokens[i][:n]
                self._busy[slot] = None
                self._bound.pop(slot, None)
                self._ids[slot] = request.prompt + ids[: n - 1]  # the last sampled token was never fed
                self.rules.clear(slot)
                self._constraints.pop(slot, None)
                if request.episode in self._ended or not (request.episode or request.keep):
                    self._release(slot)
                else:
                    self._idle[slot] = None
                results.append((request, ids, n, i, slot))
        for request, ids, n, i, slot in results:
            top = None
            if request.params.top_logprobs:
                (top,) = top_logprobs(self.out_top[slot:slot + 1, :n], self.out_top_ids[slot:slot + 1, :n],
                                      self.out_logprobs[slot:slot + 1, :n], self.out_tokens[slot:slot + 1, :n],
                                      [min(request.params.top_logprobs, self.vocab)])
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            is_stop = slot in stopped
            if is_stop and request.stops:
                ends = [text.find(s) + len(s) for s in request.stops if s in text]
                if ends:
                    text = text[: min(ends)]
            if request.future.done():  # its caller cancelled the future (it no longer waits)
                continue
            request.future.set_result(Generation(
                text=text,
                token_ids=tuple(ids),
                logprobs=tuple(logprobs[i][:n]),
                entropies=tuple(entropies[i][:n]),
                finish_reason="abort" if slot in aborted else "stop" if is_stop else "length",
                forced=tuple(bool(f) for f in forced[i][:n]) if request.params.choices else None,
                top_logprobs=None if top is None else tuple(v for v, _ in top),
                top_token_ids=None if top is None else tuple(t for _, t in top),
            ))
