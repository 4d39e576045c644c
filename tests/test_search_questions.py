"""The search corpus and question generator: real data, stated answers, held-out entities, caching."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agentgym.errors import ConfigError, DependencyNotInstalled, TaskError


def _search_data() -> bool:
    try:
        from agentgym.envs.search.sources import source_versions

        source_versions()
    except (ImportError, DependencyNotInstalled):
        return False
    return True


pytestmark = pytest.mark.skipif(not _search_data(), reason="needs agentgym[search] (the data packages)")


@pytest.fixture(scope="module")
def corpus():
    from agentgym.envs.search.corpus import load_corpus

    return load_corpus("full")


def test_corpus_holds_every_wikipedia_summary_and_the_profiles(corpus) -> None:
    kinds = {}
    for doc in corpus:
        kinds[doc.metadata["kind"]] = kinds.get(doc.metadata["kind"], 0) + 1
    assert kinds["wiki"] == 10_033
    assert 180 <= kinds["country"] <= 200 and kinds["city"] > 1000
    peru = corpus["country-peru"]
    assert "The capital of Peru is Lima." in peru.text and "The currency of Peru is the Sol (PEN)." in peru.text
    assert corpus["wiki-paris"].text.startswith("Paris is the capital and largest city of France")
    assert corpus.by_title("bogota") is not None and corpus.get("nope") is None


def test_corpus_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    from agentgym.envs.search.corpus import (
        build_documents,
        corpus_cache_path,
        load_corpus,
    )

    first = load_corpus("profiles", cache_dir=tmp_path)
    assert corpus_cache_path("profiles", tmp_path).is_file()
    assert "-v1-" in corpus_cache_path("profiles", tmp_path).name  # version in the cache key
    again = build_documents("profiles")
    assert [d.to_dict() for d in first] == [d.to_dict() for d in again]
    with pytest.raises(ConfigError, match="Did you mean 'profiles'"):
        load_corpus("profile")


def test_every_gold_document_exists_and_states_the_hop(corpus) -> None:
    from agentgym.envs.search.questions import question_pool
    from agentgym.envs.search.scoring import normalize_answer

    for kind, questions in question_pool("all").items():
        for question in questions[:300]:
            for hop in question.path:
                assert hop.gold and all(g in corpus for g in hop.gold), (kind, hop)
                primary = corpus[hop.gold[0]]
                stated = normalize_answer(primary.text).replace(" ", "")
                assert normalize_answer(hop.finds).replace(" ", "") in stated, (kind, hop, primary.text)


def test_answers_of_single_fact_questions_are_in_the_last_gold_document(corpus) -> None:
    from agentgym.envs.search.questions import question_pool

    for kind in ("capital", "currency", "language", "city_capital", "common_neighbour_currency"):
        for question in question_pool("all")[kind][:100]:
            assert question.answer in corpus[question.path[-1].gold[0]].text, (kind, question)


def test_train_and_test_questions_share_no_country() -> None:
    from agentgym.envs.search.questions import entity_group, question_pool

    train = {c for qs in question_pool("train").values() for q in qs for c in q.entities}
    test = {c for qs in question_pool("test").values() for q in qs for c in q.entities}
    assert train and test and not train & test
    assert {entity_group(c) for c in test} == {"test"}
    share = len(test) / (len(test) + len(train))
    assert 0.2 < share < 0.4


def test_generator_is_deterministic_balanced_and_checked() -> None:
    from agentgym.envs.search.questions import KINDS, generate_questions

    a = generate_questions(random.Random(3), 90, entities="train")
    b = generate_questions(random.Random(3), 90, entities="train")
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert len({t.prompt for t in a}) == 90
    kinds = {t.metadata["kind"] for t in a}
    assert kinds == set(KINDS)  # 90 draws over 18 kinds: every kind appears
    two_hop = generate_questions(random.Random(0), 20, entities="test", min_hops=2, max_hops=2)
    assert {t.metadata["hops"] for t in two_hop} == {2}
    with pytest.raises(TaskError, match="Did you mean 'capital'"):
        generate_questions(random.Random(0), 1, kinds=["captial"])
    with pytest.raises(TaskError, match="only"):
        generate_questions(random.Random(0), 10**6)
    with pytest.raises(TaskError, match="entity group"):
        generate_questions(random.Random(0), 1, entities="dev")


@pytest.mark.parametrize(("prediction", "answers", "em", "f1"), [
    ("Lima", ["Lima"], 1.0, 1.0),
    ("  the LIMA. ", ["Lima"], 1.0, 1.0),
    ("Bogota", ["Bogotá"], 1.0, 1.0),
    ("31,989,256", ["31989256"], 1.0, 1.0),
    ("Peruvian sol", ["Sol", "PEN"], 0.0, 2 / 3),
    ("", ["Sol"], 0.0, 0.0),
    ("Paris", ["Lima", "Paris"], 1.0, 1.0),
])
def test_answer_scoring_is_squad_style(prediction: str, answers: list[str], em: float, f1: float) -> None:
    from agentgym.envs.search.scoring import score_answer

    score = score_answer(prediction, answers)
    assert score.em == em and score.f1 == pytest.approx(f1)
