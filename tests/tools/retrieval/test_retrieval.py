"""Retrievers behind one interface: BM25, dense, hybrid (RRF), the simulated engine and the factory."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pytest
from agentgym.tools.retrieval import (
    Document,
    Hit,
    RetrievalError,
    load_retriever,
    make_retriever,
    tokenize,
)
from agentgym.tools.retrieval.base import top_k_indices

from agentgym.errors import ConfigError, DependencyNotInstalled
from agentgym.policies import ScriptedPolicy

DOCS = [
    Document("peru", "Peru", "Peru is a country in South America. The capital of Peru is Lima. Its currency is the sol."),
    Document("colombia", "Colombia", "The capital of Colombia is Bogotá. Colombia uses the Colombian peso."),
    Document("lima", "Lima", "Lima is the capital and largest city of Peru, on the Pacific coast."),
    Document("car", "Automobile", "A car is a wheeled motor vehicle used for transportation on roads."),
    Document("tea", "Tea", "Tea is an aromatic beverage prepared by pouring hot water over cured leaves."),
    Document("music", "Jazz", "Jazz is a music genre that originated in New Orleans in the early 20th century."),
]

bm25s = pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def bm25():
    retriever = make_retriever("bm25")
    retriever.index(DOCS)
    return retriever


# ---- analyzer and helpers -------------------------------------------------------------------------
def test_tokenize_folds_accents_and_drops_stopwords() -> None:
    assert tokenize("The capital of Bogotá is...") == ["capital", "bogota"]
    assert tokenize("Capitals", stem=True) == ["capital"]
    assert tokenize("") == []


def test_top_k_breaks_ties_by_index_and_drops_non_matches() -> None:
    scores = np.array([0.0, 2.0, 1.0, 2.0, 0.5], dtype=np.float32)
    assert top_k_indices(scores, 3).tolist() == [1, 3, 2]
    assert top_k_indices(scores, 10).tolist() == [1, 3, 2, 4]
    assert top_k_indices(np.zeros(4), 2).tolist() == []


# ---- BM25 ------------------------------------------------------------------------------------------
def test_bm25_ranks_the_matching_documents_first(bm25) -> None:
    hits = bm25.search("capital of Peru", 3)
    assert [h.doc_id for h in hits][:2] == ["peru", "lima"]
    assert all(isinstance(h, Hit) and h.score > 0 for h in hits)
    assert [h.doc_id for h in bm25.search("bogota", 5)] == ["colombia"]  # accents folded on both sides


def test_bm25_unknown_words_give_no_results_and_k_is_clamped(bm25) -> None:
    assert bm25.search("zyxwvut qqq", 5) == []
    assert bm25.search("the of and", 5) == []  # stopwords only
    assert len(bm25.search("capital", 10**6)) == 3


@pytest.mark.parametrize(("query", "k", "fragment"), [
    ("", 5, "empty"), ("   ", 5, "empty"), ("x", 0, "at least 1"), ("x", -3, "at least 1"),
    ("x", True, "whole number"), ("x", 2.5, "whole number"), (None, 5, "must be text"),
])
def test_bad_requests_raise_with_the_fix(bm25, query, k, fragment) -> None:
    with pytest.raises(RetrievalError, match=fragment):
        bm25.search(query, k)


def test_bm25_save_and_load_give_identical_results(bm25, tmp_path: Path) -> None:
    bm25.save(tmp_path / "idx")
    loaded = load_retriever(tmp_path / "idx")
    for query in ("capital of Peru", "music genre", "hot water leaves"):
        assert loaded.search(query, 4) == bm25.search(query, 4)
    assert loaded.config() == bm25.config()


def test_index_rejects_duplicates_and_empty_input() -> None:
    retriever = make_retriever("bm25")
    with pytest.raises(RetrievalError, match="unique"):
        retriever.index([DOCS[0], DOCS[0]])
    with pytest.raises(RetrievalError, match="at least one"):
        retriever.index([])
    with pytest.raises(RetrievalError, match="no index yet"):
        make_retriever("bm25").search("x", 1)


def test_load_from_a_folder_without_an_index(tmp_path: Path) -> None:
    with pytest.raises(RetrievalError, match="no saved retriever"):
        load_retriever(tmp_path)


# ---- factory ----------------------------------------------------------------------------------------
def test_make_retriever_validates_names_and_options() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'bm25'"):
        make_retriever("bm52")
    with pytest.raises(ConfigError, match="Did you mean 'k1'"):
        make_retriever("bm25", k=3)
    with pytest.raises(ConfigError, match="needs policy"):
        make_retriever("simulated")
    with pytest.raises(ConfigError, match="k1 >= 0"):
        make_retriever("bm25", k1=-1)


# ---- hybrid ------------------------------------------------------------------------------------------
def test_reciprocal_rank_fusion_matches_the_formula() -> None:
    from agentgym.tools.retrieval import reciprocal_rank_fusion

    a = [Hit("x", 9.0), Hit("y", 5.0)]
    b = [Hit("y", 0.9), Hit("z", 0.8)]
    fused = reciprocal_rank_fusion([a, b], rrf_k=60)
    assert [h.doc_id for h in fused] == ["y", "x", "z"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1].score == pytest.approx(1 / 61)
    weighted = reciprocal_rank_fusion([a, b], weights=[1.0, 0.0], rrf_k=60)
    assert [h.doc_id for h in weighted][:2] == ["x", "y"]


def test_hybrid_of_two_bm25_variants_searches_saves_and_loads(tmp_path: Path) -> None:
    hybrid = make_retriever("hybrid", retrievers=[make_retriever("bm25"), make_retriever("bm25", k1=0.5, b=0.3)])
    hybrid.index(DOCS)
    hits = hybrid.search("capital of Peru", 2)
    assert [h.doc_id for h in hits] == ["peru", "lima"]
    hybrid.save(tmp_path / "h")
    assert load_retriever(tmp_path / "h").search("capital of Peru", 2) == hits
    with pytest.raises(ConfigError, match="one per retriever"):
        make_retriever("hybrid", retrievers=[make_retriever("bm25")], weights=[1.0, 2.0])


# ---- simulated engine (ZeroSearch) ---------------------------------------------------------------------
def _echo_policy() -> ScriptedPolicy:
    def reply(messages):
        kind = "USEFUL" if "USEFUL" in messages[-1]["content"] else "NOISY"
        query = messages[-1]["content"].split("\n", 1)[0].removeprefix("Query: ")
        return f"{kind} about {query}\nA {kind.lower()} passage about {query}."

    return ScriptedPolicy(reply)


def test_simulated_engine_writes_useful_and_noisy_documents() -> None:
    from agentgym.tools.retrieval import SimulatedSearchEngine

    clean = SimulatedSearchEngine(_echo_policy(), noise=0.0)
    hits = clean.search("capital of Peru", 3)
    assert len(hits) == 3 and all(h.document is not None for h in hits)
    assert all(h.document.title == "USEFUL about capital of Peru" for h in hits)
    assert clean.get(hits[0].doc_id) == hits[0].document
    noisy = SimulatedSearchEngine(_echo_policy(), noise=1.0)
    assert all(h.document.metadata["kind"] == "noisy" for h in noisy.search("capital of Peru", 3))
    half = SimulatedSearchEngine(_echo_policy(), noise=0.5, seed=1)
    kinds = half.slot_kinds("capital of Peru", 10)
    assert kinds == half.slot_kinds("capital of Peru", 10) and set(kinds) == {"useful", "noisy"}
    assert [h.doc_id for h in half.search("capital of Peru", 5)] == [h.doc_id for h in half.search("capital of Peru", 5)]


def test_simulated_engine_knobs_and_limits() -> None:
    from agentgym.tools.retrieval import SimulatedSearchEngine, curriculum_noise

    engine = SimulatedSearchEngine(_echo_policy(), noise=1.0, distractor_share=1.0)
    engine.index(DOCS)
    assert all(h.doc_id in {d.doc_id for d in DOCS} for h in engine.search("anything", 4))
    with pytest.raises(ConfigError, match=r"noise must be a number in \[0, 1\]"):
        engine.noise = 1.5
    with pytest.raises(RetrievalError, match="at most 10"):
        engine.search("q", 11)
    with pytest.raises(ConfigError, match="needs an agentgym Policy"):
        SimulatedSearchEngine(lambda m: "x")  # type: ignore[arg-type]
    seen = []
    engine = SimulatedSearchEngine(ScriptedPolicy(lambda m: seen.append(m[-1]["content"]) or "T\nbody"))
    engine.set_context("What is the capital of Peru?", ["Lima"])
    engine.search("Peru capital", 1)
    assert "What is the capital of Peru?" in seen[0] and "Lima" in seen[0]
    schedule = [curriculum_noise(s, 100, start=0.1, end=0.7) for s in range(0, 101, 10)]
    assert schedule[0] == pytest.approx(0.1) and schedule[-1] == pytest.approx(0.7)
    assert all(a < b for a, b in itertools.pairwise(schedule))


# ---- dense -----------------------------------------------------------------------------------------------
def _dense_available() -> bool:
    try:
        import faiss  # noqa: F401
        import transformers  # noqa: F401
        from agentgym.tools.retrieval.dense import default_model_dir

        default_model_dir()
    except Exception:  # noqa: BLE001 - any missing piece skips the dense tests
        return False
    return True


needs_dense = pytest.mark.skipif(not _dense_available(), reason="needs agentgym[search] (faiss, transformers, MiniLM)")


@needs_dense
def test_dense_finds_paraphrases_and_caches_embeddings(tmp_path: Path) -> None:
    dense = make_retriever("dense", cache_dir=tmp_path)
    dense.index(DOCS)
    assert not dense.last_cache_hit
    assert dense.search("automobile on the highway", 1)[0].doc_id == "car"
    assert dense.search("a hot drink made from leaves", 1)[0].doc_id == "tea"
    again = make_retriever("dense", cache_dir=tmp_path)
    again.index(DOCS)
    assert again.last_cache_hit and len(list(tmp_path.glob("*.npy"))) == 1
    batch = again.search_many(["automobile", "jazz music"], 2)
    assert [row[0].doc_id for row in batch] == ["car", "music"]
    again.save(tmp_path / "dense-index")
    loaded = load_retriever(tmp_path / "dense-index")
    assert [h.doc_id for h in loaded.search("automobile on the highway", 3)] == [
        h.doc_id for h in dense.search("automobile on the highway", 3)]


@needs_dense
def test_dense_and_hybrid_on_real_documents_retrieve_gold_documents(tmp_path: Path) -> None:
    """Gold documents of 60 test questions among 250 real distractors (the full 11k-document corpus is
    measured by benchmarks/retrieval.py; encoding it on 2 CPU cores would cost CI minutes)."""
    from agentgym.envs.search.corpus import load_corpus
    from agentgym.tools.retrieval import HybridRetriever, make_retriever

    from agentgym.registration.suites import load_suite

    try:
        corpus = load_corpus("full")
    except DependencyNotInstalled as exc:
        pytest.skip(f"needs agentgym[search]: {exc}")
    hops = [hop for task in load_suite("search-test").test[:60] for hop in task.metadata["path"]]
    gold = {doc_id for hop in hops for doc_id in hop["gold"]}
    documents = list(corpus)
    subset = [d for d in documents if d.doc_id in gold]
    subset += [d for d in documents[::7] if d.doc_id not in gold][:250]
    start = time.perf_counter()
    dense = make_retriever("dense", cache_dir=str(tmp_path))
    dense.index(subset)
    hybrid = HybridRetriever([make_retriever("bm25"), make_retriever("dense", cache_dir=str(tmp_path))])
    hybrid.index(subset)  # the dense half reuses the embeddings cached above
    build_s = time.perf_counter() - start
    queries = [hop["query"] for hop in hops]
    for retriever, floor in ((dense, 0.5), (hybrid, 0.8)):
        results = retriever.search_many(queries, 5)
        recall = np.mean([bool(set(hop["gold"]) & {h.doc_id for h in hits}) for hop, hits in zip(hops, results)])
        assert recall >= floor, (retriever.name, recall, build_s)
