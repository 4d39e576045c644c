"""An LLM-simulated search engine (ZeroSearch, Sun et al. 2025): a policy writes the documents.

Training a search agent against a real engine is slow, costly and uncontrollable; ZeroSearch instead asks
an LLM to write the result documents. Its key knob is document quality: each result slot is *useful*
(written to help answer the query) or *noisy* (plausible but irrelevant or misleading), and a curriculum
raises the share of noisy slots as training goes on (:func:`curriculum_noise`), so the agent first learns
the search-answer loop and then learns to cross-check.

Any :class:`~agentgym.policies.Policy` can play the engine (an OpenAI-compatible server, an HF model, the
tiny model, or a ``ScriptedPolicy`` in tests). Which slots are noisy is drawn from a generator seeded by
``(seed, query, slot)``, so the same query gets the same kinds of slots: the engine is deterministic
whenever the policy is (greedy decoding or a fixed sampling seed, which we pass on).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.tools.retrieval.base import Document, Hit, RetrievalError, Retriever

from agentgym.errors import ConfigError
from agentgym.policy import GenerationRequest, Policy, SamplingParams
from agentgym.utils.coroutines import run_blocking

__all__ = ["SimulatedSearchEngine", "curriculum_noise"]

SYSTEM_PROMPT = (
    "You are a web search engine. For the user's query, write one search result: a title on the first line, "
    "then a short encyclopedia-style passage of at most {words} words. Write only the result."
)
USEFUL = (
    "Query: {query}\n{context}Write a USEFUL result: accurate, on topic, and containing the information the "
    "query asks for."
)
NOISY = (
    "Query: {query}\n{context}Write a NOISY result: it should look relevant to the query but must not contain "
    "the correct information; it may be off-topic or subtly misleading."
)


def curriculum_noise(step: int, total_steps: int, *, start: float = 0.0, end: float = 0.75,
                     base: float = 4.0) -> float:
    """ZeroSearch's curriculum: the noisy-slot probability at ``step`` of ``total_steps``.

    ``p = start + (base ** (step / total_steps) - 1) / (base - 1) * (end - start)``: it rises slowly at first
    and faster towards the end (``base`` > 1 sets how sharply).
    """
    if total_steps < 1 or step < 0:
        raise ConfigError(f"curriculum_noise needs total_steps >= 1 and step >= 0, got {step}/{total_steps}.")
    if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0) or base <= 1.0:
        raise ConfigError(f"start and end must lie in [0, 1] and base must be > 1; got {start}, {end}, {base}.")
    frac = min(step, total_steps) / total_steps
    return start + (base ** frac - 1.0) / (base - 1.0) * (end - start)


def _uniform(key: str) -> float:
    """A reproducible draw in [0, 1) from a string (sha256; ``random.Random(str)`` correlates similar strings)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


class SimulatedSearchEngine(Retriever):
    """A search engine whose results a policy writes, with a noise knob for curriculum training.

    Args:
        policy: Writes the documents (one generation per result slot; all slots of a query in one batch).
        noise: Probability in [0, 1] that a slot is noisy (irrelevant or misleading) instead of useful.
        seed: Mixed into the per-slot draws and passed to the policy as the sampling seed.
        max_tokens: Token budget of one document.
        temperature: Sampling temperature of the policy (0 = greedy, reproducible).
        words: Length the prompt asks for.
        distractor_share: Share of noisy slots filled with a random real document from :meth:`index` (when
            given) instead of a written one; real but irrelevant documents are the cheapest noise.
        max_results: Most results one search may ask for (each one is a generation).
        max_remembered: Generated documents kept for ``get`` (oldest forgotten first).
    """

    name: ClassVar[str] = "simulated"

    def __init__(self, policy: Policy, *, noise: float = 0.0, seed: int = 0, max_tokens: int = 160,
                 temperature: float = 0.0, words: int = 60, distractor_share: float = 0.0,
                 max_results: int = 10, max_remembered: int = 10_000) -> None:
        super().__init__()
        if not isinstance(policy, Policy):
            raise ConfigError(f"SimulatedSearchEngine needs an agentgym Policy (e.g. ScriptedPolicy, HFPolicy, "
                              f"OpenAIPolicy), got {type(policy).__name__}.")
        if not 0.0 <= distractor_share <= 1.0:
            raise ConfigError(f"distractor_share must lie in [0, 1], got {distractor_share}.")
        self.policy = policy
        self.noise = noise  # validated by the property
        self.seed, self.max_tokens, self.temperature, self.words = int(seed), int(max_tokens), float(temperature), int(words)
        self.distractor_share = float(distractor_share)
        if max_results < 1:
            raise ConfigError(f"max_results must be >= 1, got {max_results}.")
        self.max_results = int(max_results)
        self.max_remembered = int(max_remembered)
        self._generated: OrderedDict[str, Document] = OrderedDict()
        self._distractors: list[Document] = []
        self._context = ""

    # ---- knobs ---------------------------------------------------------------------------------------
    @property
    def noise(self) -> float:
        """Probability that a result slot is noisy; set it between training steps for a curriculum."""
        return self._noise

    @noise.setter
    def noise(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise ConfigError(f"noise must be a number in [0, 1] (0 = all useful, 1 = all noisy), got {value!r}.")
        self._noise = float(value)

    def set_context(self, question: str | None, answers: Sequence[str] = ()) -> None:
        """Tell the engine what the user is trying to answer (ZeroSearch gives the simulator the question and
        its answer so useful documents are actually useful); ``None`` clears it."""
        if not question:
            self._context = ""
            return
        hint = f" (the answer is: {answers[0]})" if answers else ""
        self._context = f"The user is trying to answer: {question}{hint}\n"

    # ---- Retriever ---------------------------------------------------------------------------------------
    @property
    def is_indexed(self) -> bool:
        return True  # nothing to index: the documents are written on demand

    def __len__(self) -> int:
        return 1_000_000  # unbounded: k is limited by the caller, not by a corpus size

    def index(self, docs: Sequence[Document]) -> None:
        """Keep ``docs`` as the pool for real-document distractors (see ``distractor_share``)."""
        self._distractors = list(docs)

    def config(self) -> dict[str, Any]:
        return {"noise": self.noise, "seed": self.seed, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "words": self.words, "distractor_share": self.distractor_share,
                "policy": getattr(self.policy, "name", type(self.policy).__name__)}

    def slot_kinds(self, query: str, k: int) -> list[str]:
        """``useful`` / ``noisy`` / ``distractor`` for each of the ``k`` slots of ``query`` (deterministic)."""
        kinds = []
        for slot in range(k):
            if _uniform(f"{self.seed}/{query}/{slot}/noise") >= self.noise:
                kinds.append("useful")
            elif self._distractors and _uniform(f"{self.seed}/{query}/{slot}/distractor") < self.distractor_share:
                kinds.append("distractor")
            else:
                kinds.append("noisy")
        return kinds

    def _search(self, query: str, k: int) -> list[Hit]:
        if k > self.max_results:
            raise RetrievalError(f"The simulated engine writes at most {self.max_results} results per search (each is "
                                 f"a model generation); ask for k <= {self.max_results}, got {k}.")
        kinds = self.slot_kinds(query, k)
        written = [i for i, kind in enumerate(kinds) if kind != "distractor"]
        requests = [self._request(query, kinds[i], i) for i in written]
        generations = run_blocking(self.policy.act(requests)) if requests else []
        texts = {i: g.text for i, g in zip(written, generations)}
        hits = []
        for slot, kind in enumerate(kinds):
            if kind == "distractor":
                pick = int(_uniform(f"{self.seed}/{query}/{slot}/pick") * len(self._distractors))
                doc = self._distractors[pick]
            else:
                doc = self._document(query, slot, kind, texts.get(slot, ""))
            hits.append(Hit(doc.doc_id, float(k - slot), doc))
        return hits

    def _request(self, query: str, kind: str, slot: int) -> GenerationRequest:
        template = USEFUL if kind == "useful" else NOISY
        messages = (
            {"role": "system", "content": SYSTEM_PROMPT.format(words=self.words)},
            {"role": "user", "content": template.format(query=query, context=self._context)},
        )
        sampling = SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                                  seed=(self.seed * 1_000_003 + slot) % (2**31))
        return GenerationRequest(messages=messages, sampling=sampling, episode_id=f"simulated-search/{slot}")

    def _document(self, query: str, slot: int, kind: str, text: str) -> Document:
        lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
        if len(lines) >= 2:
            title, body = lines[0].removeprefix("Title:").strip(" #*"), " ".join(lines[1:])
        else:
            title, body = query[:80], (lines[0] if lines else "(the search engine returned an empty result)")
        digest = hashlib.sha256(f"{self.seed}/{query}/{slot}/{kind}/{body}".encode()).hexdigest()[:10]
        doc = Document(f"sim-{digest}", title or query[:80], body, {"source": "simulated", "kind": kind})
        self._generated[doc.doc_id] = doc
        self._generated.move_to_end(doc.doc_id)
        while len(self._generated) > self.max_remembered:
            self._generated.popitem(last=False)
        return doc

    def get(self, doc_id: str) -> Document | None:
        """A document this engine wrote (or a distractor it served), if it is still remembered."""
        doc = self._generated.get(doc_id)
        if doc is None:
            doc = next((d for d in self._distractors if d.doc_id == doc_id), None)
        return doc

    def save(self, path: str | Path) -> None:
        raise RetrievalError("A SimulatedSearchEngine has no index to save; build it again from its policy.")

    @classmethod
    def load(cls, path: str | Path) -> SimulatedSearchEngine:
        raise RetrievalError("A SimulatedSearchEngine cannot be loaded from disk; construct it with a policy.")

    def __repr__(self) -> str:
        return f"SimulatedSearchEngine(policy={self.config()['policy']!r}, noise={self.noise})"
