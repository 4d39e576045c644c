"""Search-v1: answer (multi-hop) questions by searching a real Wikipedia corpus (Search-R1 / ZeroSearch style).

The agent sees a question, calls ``search(query, k)`` to get numbered, titled snippets with document ids,
may ``open(doc_id)`` to read a whole document, and ends the episode with ``answer(text)``. Success and the
reward (1 or 0) are :func:`~agentgym.envs.search.scoring.grade_answer`: the answer must name the gold entity
(an alias or an equivalent form) and nothing else, so hedges such as both options of a comparison fail.
SQuAD EM and F1 are reported in ``info["answer"]`` and ``info["outcome"]`` but are never the reward (v0 could
reward F1, which pays for answers padded with the gold's tokens). ``info["outcome"]`` also carries the
question's ``kind`` and ``type`` so success can be reported per type (comparisons separately: a coin flip
answers a named two-way comparison half the time). The retriever is chosen by
kwargs (``bm25``, the default; ``dense``; ``hybrid``) or passed as an object, e.g. a
:class:`~agentgym.tools.retrieval.SimulatedSearchEngine` whose documents a policy writes.

Accepted action formats: Hermes ``<tool_call>{json}</tool_call>``, Search-R1 tags (``<search>query</search>``,
``<answer>text</answer>``, ``<open>doc_id</open>``) and function calls (``search("query")``,
``open("wiki-peru")``, ``answer(Lima)``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from agentgym.envs.search.corpus import Corpus, load_corpus
from agentgym.envs.search.index import corpus_retriever
from agentgym.envs.search.questions import ENTITY_GROUPS, generate_questions
from agentgym.envs.search.scoring import (
    AnswerScore,
    SentenceContext,
    accepted_answers,
    context_for,
    grade_against,
    score_answer,
)
from agentgym.tools.retrieval import Document, RetrievalError, Retriever, tokenize

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, TaskError, did_you_mean
from agentgym.parsers import (
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    TagParser,
    ToolCallParser,
)
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["SearchEnv", "make_snippet"]

_REWARDS = ("grade",)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def make_snippet(text: str, query: str, max_chars: int) -> str:
    """The passage of ``text`` that best matches ``query``, at most ``max_chars`` long.

    Sentences are scored by how many distinct query words they contain; the snippet starts at the best
    one (the first on ties) and adds following sentences while they fit, so a fact stated late in a
    document still shows up in the result list.
    """
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    sentences = _SENTENCE_END.split(text)
    words = set(tokenize(query))
    scores = [len(words & set(tokenize(s))) for s in sentences]
    best = max(range(len(sentences)), key=lambda i: (scores[i], -i)) if words else 0
    parts, used = [], 0
    for sentence in sentences[best:]:
        if used + len(sentence) + 1 > max_chars and parts:
            break
        parts.append(sentence)
        used += len(sentence) + 1
    snippet = " ".join(parts)
    if len(snippet) > max_chars:
        snippet = snippet[: max_chars - 1].rsplit(" ", 1)[0] + "…"
    elif best + len(parts) < len(sentences):
        snippet += " …"
    return ("… " if best > 0 else "") + snippet


class SearchEnv(AgentEnv):
    """Answer 1-3 hop questions over 11k real Wikipedia summaries and profiles with `search`, `open` and `answer`.

    ## Description

    Search-R1 / ZeroSearch style. The agent sees a question, searches a real corpus (10,033 Wikipedia summaries plus
    country and city profiles) for numbered, titled snippets with document ids, may open a whole document, and
    answers. Questions are generated from the corpus (1-3 hops, comparisons balanced), so gold answers follow it.
    Besides Hermes tool calls, Search-R1 tags (`<search>query</search>`, `<open>doc_id</open>`,
    `<answer>text</answer>`) and function calls (`search("query")`) are read. The retriever is `bm25` (default),
    `dense`, `hybrid`, or any `Retriever` object, e.g. a `SimulatedSearchEngine` whose documents a policy writes.

    ## Tools

    - `search(query, k)`: search the corpus; returns `k` numbered results, each with a title, a document id and a
      snippet.
    - `open(doc_id)`: read the full text of a document.
    - `answer(text)`: submit the final answer (a short phrase: a name or a number); this ends the episode.

    ## Reward

    1 when `grade_answer` accepts the answer, else 0 (component `answer`): the answer must name the gold entity (an
    alias or an equivalent form) and nothing else, so hedges such as both options of a comparison fail. SQuAD EM and
    F1 are reported in `info["answer"]` and `info["outcome"]` but are never the reward; `info["outcome"]` also
    carries the question's `kind` and `type`, so success can be reported per type.

    ## Episode end

    Terminated by `answer`; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation (a 3-hop question needs 4: three searches and the answer).
    - `tasks`: tasks to draw from (e.g. a suite's split); without them a question is generated from the reset seed
      (see `entities`).
    - `retriever`: `bm25` (default), `dense`, `hybrid`, or a `Retriever` object (an unindexed one is indexed on the
      corpus; a `SimulatedSearchEngine` is used as is).
    - `retriever_options`: constructor options for a retriever given by name (e.g. `{"k1": 0.9}`).
    - `corpus`: `full` (10,033 Wikipedia summaries + country and city profiles) or `profiles` (the profiles only;
      small and fast, for tests).
    - `top_k`: results per search when the agent gives no `k`.
    - `max_k`: largest `k` the agent may ask for.
    - `snippet_chars`: length of each result's snippet.
    - `max_query_chars`: longest accepted query.
    - `max_open_chars`: longest document text `open` shows (the rest is cut, and the cut is said).
    - `reward`: `grade` (the only choice: `grade_answer`); `em` is taken as `grade`, and `f1` is refused because
      padding an answer with the gold's tokens earns F1.
    - `entities`: entity group of generated questions when no tasks are given: `train`, `test` or `all`.
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v1: gold answers follow the corpus, `grade_answer` refuses hedges and padding (EM and F1 are reported only).
    - v0: the first version (could reward F1).
    """

    description: ClassVar[str] = (
        "Answer (multi-hop) questions by searching 11k real Wikipedia summaries and fact profiles: "
        "search(query, k), open(doc_id), answer(text)."
    )
    native_format_hint: ClassVar[str] = (
        "You may also write <search>your query</search>, <open>doc-id</open> and <answer>your answer</answer>, "
        'or plain calls such as search("capital of Peru"), open("country-peru") and answer("Lima").'
    )

    def __init__(
        self,
        *,
        max_turns: int = 8,
        tasks: Sequence[Task] | None = None,
        retriever: str | Retriever = "bm25",
        retriever_options: Mapping[str, Any] | None = None,
        corpus: str = "full",
        top_k: int = 5,
        max_k: int = 20,
        snippet_chars: int = 300,
        max_query_chars: int = 500,
        max_open_chars: int = 4000,
        reward: str = "grade",
        entities: str = "all",
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
    ) -> None:
        if not 1 <= top_k <= max_k:
            raise ConfigError(f"Need 1 <= top_k <= max_k, got top_k={top_k}, max_k={max_k}.")
        if snippet_chars < 40 or max_query_chars < 1 or max_open_chars < 100:
            raise ConfigError("snippet_chars must be >= 40, max_query_chars >= 1 and max_open_chars >= 100; got "
                              f"{snippet_chars}, {max_query_chars}, {max_open_chars}.")
        if reward == "f1":
            raise ConfigError("reward='f1' is no longer offered: token F1 rewards answers padded with the gold's "
                              "tokens and hedges between candidates. Use the default reward (grade_answer); F1 is "
                              "still reported in info['answer']['f1'].")
        reward = "grade" if reward == "em" else reward
        if reward not in _REWARDS:
            raise ConfigError(f"reward must be 'grade' (the default), got {reward!r}."
                              f"{did_you_mean(str(reward), _REWARDS)}")
        if entities not in ENTITY_GROUPS:
            raise ConfigError(f"entities must be one of {ENTITY_GROUPS}, got {entities!r}.")
        self.top_k, self.max_k, self.snippet_chars = int(top_k), int(max_k), int(snippet_chars)
        self.max_query_chars, self.max_open_chars = int(max_query_chars), int(max_open_chars)
        self.reward_metric, self.entities = reward, entities
        self.corpus: Corpus = load_corpus(corpus)
        self.retriever: Retriever = self._resolve_retriever(retriever, retriever_options)
        self.retriever_name = getattr(self.retriever, "name", type(self.retriever).__name__)
        self._question = ""
        self._answers: tuple[str, ...] = ()
        self._context: SentenceContext | None = None
        self._last_results: list[Document] = []
        self._seen: dict[str, Document] = {}
        self._opened: set[str] = set()  # ids of the documents read in full this episode
        self._answer_score: AnswerScore | None = None
        self._correct = False
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars,
                         max_calls_per_turn=max_calls_per_turn, render_mode=render_mode)

    def _resolve_retriever(self, retriever: str | Retriever, options: Mapping[str, Any] | None) -> Retriever:
        if isinstance(retriever, str):
            return corpus_retriever(retriever, self.corpus, options)
        if not isinstance(retriever, Retriever):
            raise ConfigError(f"retriever must be a name ('bm25', 'dense', 'hybrid') or a Retriever object, got "
                              f"{type(retriever).__name__}.")
        if options:
            raise ConfigError("retriever_options only apply to a retriever given by name; configure the object itself.")
        if hasattr(retriever, "set_context"):
            return retriever  # simulated: it writes its own documents
        if not retriever.is_indexed:
            retriever.index(list(self.corpus))
        elif retriever.doc_ids[0] not in self.corpus:
            raise ConfigError(f"The given retriever indexes documents that are not in the {self.corpus.name!r} corpus "
                              f"(e.g. {retriever.doc_ids[0]!r}); pass an unindexed retriever and the env indexes it.")
        return retriever

    # ---- tools ---------------------------------------------------------------------------------
    @tool
    def search(self, query: str, k: int | None = None) -> str | ToolResult:
        """Search the corpus; returns numbered results, each with a title, a document id and a snippet.

        Args:
            query: A few keywords or a question, e.g. "capital of Peru".
            k: Number of results (default 5, at most 20).
        """
        k = self.top_k if k is None else k
        if not query.strip():
            return ToolResult.error('Error: the query is empty; search for a few keywords, e.g. search("capital of Peru").')
        if len(query) > self.max_query_chars:
            return ToolResult.error(f"Error: the query has {len(query)} characters; the limit is {self.max_query_chars}. "
                                    "Search with a few keywords instead.")
        if not 1 <= k <= self.max_k:
            return ToolResult.error(f"Error: k must be between 1 and {self.max_k}, got {k}.")
        try:
            hits = self.retriever.search(query, k)
        except RetrievalError as exc:
            return ToolResult.error(f"Error: {exc}")
        documents = []
        for hit in hits:
            doc = hit.document or self.corpus.get(hit.doc_id)
            if doc is not None:
                documents.append(doc)
                self._seen[doc.doc_id] = doc
        self._last_results = documents
        shown = query if len(query) <= 80 else query[:77] + "..."
        if not documents:
            return f'No documents match "{shown}". Try other keywords.'
        lines = [f'Results for "{shown}":']
        for rank, doc in enumerate(documents, start=1):
            lines.append(f"[{rank}] {doc.title} (id: {doc.doc_id})")
            lines.append(f"    {make_snippet(doc.text, query, self.snippet_chars)}")
        lines.append("Read a whole document with open(doc_id).")
        return "\n".join(lines)

    @tool
    def open(self, doc_id: str) -> str | ToolResult:
        """Read the full text of a document.

        Args:
            doc_id: A document id from the search results (e.g. "country-peru"), or a result number of the latest
                search (e.g. "2").
        """
        doc = self._lookup(doc_id)
        if doc is None:
            hint = self.corpus.suggest(doc_id) if len(doc_id) <= 200 else ""
            shown = doc_id if len(doc_id) <= 60 else doc_id[:57] + "..."
            return ToolResult.error(f"Error: unknown document id {shown!r}.{hint} Use an id shown in the search "
                                    "results, or the number of a result of your latest search.")
        self._opened.add(doc.doc_id)
        text = doc.text
        if len(text) > self.max_open_chars:
            text = text[: self.max_open_chars] + f" … [cut: {len(doc.text) - self.max_open_chars} more characters]"
        return f"{doc.title} (id: {doc.doc_id})\n{text}"

    @tool
    def answer(self, text: str) -> str:
        """Submit your final answer (a short phrase: a name or a number); this ends the episode.

        Args:
            text: The answer, e.g. "Lima".
        """
        self.mark_answer()
        self._answer_score = score_answer(text, self._answers)  # reported only
        self._correct = grade_against(text, self._answers, self._context)  # == grade_answer(task, text)
        self.add_reward("answer", float(self._correct))
        self.finish(success=self._correct, score=float(self._correct), reason="answered")
        expected = self._answers[0] if self._answers else "(none)"
        if self._correct:
            return f"Correct: {expected}."
        return f"Wrong: the expected answer was {expected}."

    def _lookup(self, doc_id: str) -> Document | None:
        key = doc_id.strip().strip("[]").strip()
        if key.isdigit() and 1 <= int(key) <= len(self._last_results):
            return self._last_results[int(key) - 1]
        doc = self.corpus.get(key) or self._seen.get(key)
        if doc is None and hasattr(self.retriever, "get"):
            doc = self.retriever.get(key)
        if doc is None and len(key) <= 200:
            doc = self.corpus.by_title(key)
        return doc

    # ---- hooks ---------------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.search, self.open, self.answer])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([
            HermesParser(),
            TagParser({"search": ("search", "query"), "answer": ("answer", "text"), "open": ("open", "doc_id")}),
            FunctionCallParser(["search", "open", "answer"], {"open": "doc_id", "answer": "text"}),
        ])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        from agentgym.envs.games._common import python_rng

        return generate_questions(python_rng(rng), 1, entities=self.entities)[0]

    def _begin_episode(self, task: Task) -> str:
        self._answers = accepted_answers(task)
        self._context = context_for(task)
        if not self._answers:
            raise TaskError(f"Search task {task.id!r} has no answer and no metadata.aliases; give it at least one.")
        self._question = task.prompt
        self._last_results, self._seen, self._answer_score = [], {}, None
        self._opened = set()
        if hasattr(self.retriever, "set_context"):
            self.retriever.set_context(task.prompt, self._answers)
        return f"Question: {task.prompt}"

    def _task_instructions(self) -> str:
        return (
            "Answer the question by searching a collection of encyclopedia documents. Questions may need several "
            "searches: find one fact, then search for the next. Call search with a few keywords to get numbered "
            "results (title, document id, snippet); call open with a document id to read the whole document. When "
            "you know the answer, call answer with a short phrase (a name or a number); answering ends the episode, "
            "and an answer that names more than one candidate (a list, or 'A or B') counts as wrong. "
            f"You have {self.max_turns} turns."
        )

    def state_key(self) -> str:
        """What the agent has found: the ids of every document its searches returned and of those it opened,
        sorted. Two query wordings that surface the same documents reach the same state; a search that finds
        nothing new leaves it unchanged. The latest result list is part of it too (``open("2")`` depends on it)."""
        if self._finished:
            return "answered"
        latest = [doc.doc_id for doc in self._last_results]
        return f"found {sorted(self._seen)} opened {sorted(self._opened)} latest {latest}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._answer_score = None
        observation, reward, terminated, truncated, info = super().step(action)
        if self._answer_score is not None:
            info["answer"] = {**self._answer_score.to_dict(), "correct": self._correct}
            if "outcome" in info:
                info["outcome"].update(em=self._answer_score.em, f1=self._answer_score.f1)
        if "outcome" in info and self.task is not None:
            metadata = self.task.metadata
            info["outcome"].update(kind=metadata.get("kind"), type=metadata.get("type"))
            if metadata.get("answer_position"):
                info["outcome"]["answer_position"] = metadata["answer_position"]
        return observation, reward, terminated, truncated, info

    # ---- solvers -------------------------------------------------------------------------------
    def reference_solver(self) -> ReferenceSolver:
        """Replay the task's reference path, then answer; answers wrongly if a hop's gold document was not retrieved.

        So :meth:`TaskSuite.validate` fails exactly for questions whose path the configured retriever cannot
        follow within ``top_k`` results.
        """
        task = self.task
        path = list((task.metadata.get("path") if task is not None else None) or [])
        answer = self._answers[0] if self._answers else ""
        state = {"hop": 0, "ok": True}

        def call(name: str, **arguments: Any) -> str:
            return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"

        def solve(observation: str) -> str:
            hop = state["hop"]
            if hop > 0:
                gold = path[hop - 1].get("gold") or []
                if not any(f"(id: {g})" in observation for g in gold):
                    state["ok"] = False
            if hop < len(path):
                state["hop"] = hop + 1
                return call("search", query=path[hop]["query"])
            return call("answer", text=answer if state["ok"] else "the reference path failed")

        return solve

    def shortcut_solver(self) -> ReferenceSolver:
        """Answer at once without searching: the bridge entity of a multi-hop question, or the country a 1-hop
        question names (plausible, wrong): a tool-skipping demonstration."""
        from agentgym.envs.search.sources import load_world

        task = self.task
        guess = "unknown"
        if task is not None:
            path = task.metadata.get("path") or []
            entities = task.metadata.get("entities") or []
            if len(path) > 1 and path[0].get("finds"):
                guess = str(path[0]["finds"])
            elif entities and entities[0] in load_world().countries:
                guess = load_world().countries[entities[0]].name
        return lambda observation: f"<answer>{guess}</answer>"
