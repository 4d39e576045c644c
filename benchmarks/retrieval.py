"""Retrieval for the search env: quality (recall@5 of gold documents) and speed, side by side in one run.

Part 1 - quality: every hop of every question of the ``search-test`` suite has gold documents (the ones
that state the fact the hop needs). For BM25 (ours, ``bm25s``), dense (all-MiniLM-L6-v2 + faiss) and hybrid
(reciprocal-rank fusion of the two), and for the ``rank-bm25`` and ``tantivy`` baselines, we report recall@1
and recall@5 per hop with the reference path's queries, the share of questions whose every hop is found in
the top 5 (what an agent following the reference path needs), and recall@5 when the raw question is the
query (what an agent that does not yet decompose the question gets).

Part 2 - speed on the full corpus (about 11.5k documents): index build time, query latency p50/p95 and
queries per second (one query at a time, as an env issues them), for our BM25 against ``rank-bm25`` (same
tokens, so only the library differs) and, when installed, ``tantivy``; plus dense and hybrid. Dense build
time is the encoding of every document (``--cold`` encodes from scratch into a temporary cache; otherwise
the on-disk embedding cache is used and its load time is shown).

Run: python benchmarks/retrieval.py [--quick] [--cold] [--skip-dense]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agentgym.envs.search.corpus import load_corpus
from agentgym.tools.retrieval import Document, Retriever, make_retriever, tokenize

from agentgym.registration.suites import load_suite


# ---- baselines with the same interface ------------------------------------------------------------------
class RankBM25:
    """``rank_bm25.BM25Okapi`` over the same tokens as ours (it scores every document in Python/numpy)."""

    name = "rank-bm25"

    def index(self, docs: Sequence[Document]) -> None:
        from rank_bm25 import BM25Okapi

        self.ids = [d.doc_id for d in docs]
        self.model = BM25Okapi([tokenize(d.indexed_text()) for d in docs], k1=1.2, b=0.75)

    def search(self, query: str, k: int) -> list[str]:
        import numpy as np

        scores = self.model.get_scores(list(dict.fromkeys(tokenize(query))))  # distinct words, as ours
        top = np.argsort(-scores, kind="stable")[:k]
        return [self.ids[i] for i in top if scores[i] > 0]


class Tantivy:
    """``tantivy`` (Rust, Lucene-like) over the same tokens, in memory."""

    name = "tantivy"

    def index(self, docs: Sequence[Document]) -> None:
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("body", stored=False)
        builder.add_integer_field("idx", stored=True, indexed=False)
        self.tantivy, self.index_ = tantivy, tantivy.Index(builder.build())
        writer = self.index_.writer(heap_size=200_000_000, num_threads=1)
        for i, doc in enumerate(docs):
            writer.add_document(tantivy.Document(body=" ".join(tokenize(doc.indexed_text())), idx=i))
        writer.commit()
        self.index_.reload()
        self.searcher = self.index_.searcher()
        self.ids = [d.doc_id for d in docs]

    def search(self, query: str, k: int) -> list[str]:
        words = tokenize(query)
        if not words:
            return []
        parsed = self.index_.parse_query(" ".join(words), ["body"])
        hits = self.searcher.search(parsed, k).hits
        return [self.ids[self.searcher.doc(address)["idx"][0]] for _, address in hits]


class Ours:
    """Adapter: our retrievers return Hits; the benchmark compares id lists."""

    def __init__(self, retriever: Retriever, label: str) -> None:
        self.retriever, self.name = retriever, label

    def index(self, docs: Sequence[Document]) -> None:
        self.retriever.index(docs)

    def search(self, query: str, k: int) -> list[str]:
        return [h.doc_id for h in self.retriever.search(query, k)]


# ---- measurements -----------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def latency(engine: Any, queries: Sequence[str], k: int = 5) -> dict[str, float]:
    engine.search(queries[0], k)  # warm-up (lazy imports, first-call allocations)
    times = []
    for q in queries:
        start = time.perf_counter()
        engine.search(q, k)
        times.append(time.perf_counter() - start)
    times.sort()
    return {"p50 ms": 1000 * statistics.median(times), "p95 ms": 1000 * times[int(0.95 * (len(times) - 1))],
            "q/s": len(times) / sum(times)}


def recall(engine: Any, hops: Sequence[dict[str, Any]], questions: Sequence[Sequence[int]]) -> dict[str, float]:
    found5, found1 = [], []
    for hop in hops:
        ids = engine.search(hop["query"], 5)
        gold = set(hop["gold"])
        found5.append(bool(gold & set(ids)))
        found1.append(bool(gold & set(ids[:1])))
    per_question = [all(found5[i] for i in idx) for idx in questions]
    return {"hop recall@1": float(statistics.mean(found1)), "hop recall@5": float(statistics.mean(found5)),
            "questions, all hops@5": float(statistics.mean(per_question))}


def question_recall(engine: Any, tasks: Sequence[Any]) -> dict[str, float]:
    """The raw question as the query (an agent's natural first search): is a first-hop gold document in the top 5,
    and is any gold document of any hop?"""
    first, any_hop = [], []
    for task in tasks:
        ids = set(engine.search(task.prompt, 5))
        path = task.metadata["path"]
        first.append(bool(ids & set(path[0]["gold"])))
        any_hop.append(bool(ids & {g for hop in path for g in hop["gold"]}))
    return {"first-hop gold@5": float(statistics.mean(first)), "any gold@5": float(statistics.mean(any_hop))}


def table(rows: Sequence[dict[str, Any]], title: str) -> None:
    columns = list(dict.fromkeys(c for row in rows for c in row))
    def cell(row: dict[str, Any], column: str) -> str:
        value = row.get(column, "")
        if isinstance(value, float):
            return f"{value:.3f}" if "@" in column else f"{value:.2f}"
        return str(value)

    cells = [[cell(row, c) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  " + "-+-".join("-" * w for w in widths))
    for r in cells:
        print("  " + " | ".join(v.ljust(w) for v, w in zip(r, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer questions and queries (smoke test)")
    parser.add_argument("--cold", action="store_true", help="encode the corpus from scratch (no embedding cache)")
    parser.add_argument("--skip-dense", action="store_true", help="BM25 engines only")
    args = parser.parse_args()
    from _results import figure, write_results

    start = time.perf_counter()
    corpus_s, corpus = timed(lambda: load_corpus("full"))
    docs = list(corpus)
    suite = load_suite("search-test")
    tasks = suite.test[:100] if args.quick else suite.test
    hops: list[dict[str, Any]] = []
    questions: list[list[int]] = []
    for task in tasks:
        questions.append(list(range(len(hops), len(hops) + len(task.metadata["path"]))))
        hops.extend(task.metadata["path"])
    queries = [h["query"] for h in hops]
    print(f"Corpus: {len(docs)} documents ({sum(d.metadata.get('kind') == 'wiki' for d in docs)} Wikipedia summaries), "
          f"loaded in {corpus_s:.2f} s; {len(tasks)} search-test questions, {len(hops)} hops; "
          f"{os.cpu_count()} CPU cores.")

    engines: list[tuple[Any, float, str]] = []
    build_s, bm25 = timed(lambda: _indexed(Ours(make_retriever("bm25"), "BM25 (bm25s, ours)"), docs))
    engines.append((bm25, build_s, "tokenize + index"))
    build_s, rank = timed(lambda: _indexed(RankBM25(), docs))
    engines.append((rank, build_s, "tokenize + index"))
    try:
        build_s, tant = timed(lambda: _indexed(Tantivy(), docs))
        engines.append((tant, build_s, "tokenize + index (in memory)"))
    except ImportError:
        print("(tantivy not installed: skipped)")
    if not args.skip_dense:
        cache = tempfile.mkdtemp(prefix="agentgym-emb-") if args.cold else None
        dense = make_retriever("dense", cache_dir=cache, progress=True)
        build_s, dense_engine = timed(lambda: _indexed(Ours(dense, "dense (MiniLM + faiss)"), docs))
        note = (f"encode {len(docs)} docs ({dense.encoder.dtype})" if not dense.last_cache_hit
                else "embeddings from disk cache (use --cold to encode)")
        engines.append((dense_engine, build_s, note))
        hybrid = make_retriever("hybrid", retrievers=[bm25.retriever, dense])  # both indexed: nothing to build
        engines.append((Ours(hybrid, "hybrid (RRF bm25+dense)"), 0.0, "no own index (fuses the two)"))

    quality = []
    for engine, _, _ in engines:
        quality.append({"retriever": engine.name, **recall(engine, hops, questions)})
    table(quality, "Part 1a - quality on search-test, reference-path queries (gold documents per hop; recall@k)")
    natural = [{"retriever": engine.name, **question_recall(engine, tasks)} for engine, _, _ in engines]
    table(natural, "Part 1b - quality on search-test, the question itself as the query (recall@5)")

    sizes = {"rank-bm25": 200, "dense (MiniLM + faiss)": 300, "hybrid (RRF bm25+dense)": 300}
    speed = []
    for engine, build, note in engines:
        n = sizes.get(engine.name, 1000) // (4 if args.quick else 1)
        sample = (queries * 2)[:n]
        speed.append({"retriever": engine.name, "build s": build, "build": note, "queries": len(sample),
                      **latency(engine, sample)})
    base = next(r for r in speed if r["retriever"] == "rank-bm25")
    for row in speed:
        row["q/s vs rank-bm25"] = f"{row['q/s'] / base['q/s']:.1f}x"
    table(speed, f"Part 2 - speed on the full corpus ({len(docs)} docs, one query at a time, k=5)")
    print(f"\nTotal {time.perf_counter() - start:.0f} s.")
    base_quality = next(r for r in quality if r["retriever"] == "rank-bm25")
    base_natural = next(r for r in natural if r["retriever"] == "rank-bm25")
    figures = []
    for row, q, nat in zip(speed, quality, natural):
        if row["retriever"] == "rank-bm25":
            continue
        figures += [
            figure(f"{row['retriever']}: query speed, {len(docs):,} docs, one query at a time, k=5 ({row['queries']} "
                   "queries); baseline: rank-bm25, same tokens", row["q/s"], base["q/s"], unit="queries/s",
                   ratio=row["q/s"] / base["q/s"], note=f"p50 {row['p50 ms']:.2f} ms, p95 {row['p95 ms']:.2f} ms; "
                                                     f"build {row['build s']:.2f} s ({row['build']})"),
            figure(f"{q['retriever']}: hop recall@5 of gold documents, {len(tasks)} search-test questions, reference "
                   "queries; baseline: rank-bm25", q["hop recall@5"], base_quality["hop recall@5"], unit="recall",
                   note=f"recall@1 {q['hop recall@1']:.3f}"),
            figure(f"{nat['retriever']}: first-hop gold@5 with the raw question as the query; baseline: rank-bm25",
                   nat["first-hop gold@5"], base_natural["first-hop gold@5"], unit="recall"),
        ]
    write_results("retrieval", figures, note="--quick: fewer questions and queries" if args.quick else None)


def _indexed(engine: Any, docs: Sequence[Document]) -> Any:
    engine.index(docs)
    return engine


if __name__ == "__main__":
    sys.exit(main())
