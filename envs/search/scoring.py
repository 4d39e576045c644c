"""Answer scoring: SQuAD-style normalisation, exact match over aliases, token F1 (best alias).

Normalisation lowercases, strips accents, punctuation and the articles a/an/the, and collapses
whitespace, so "The Sol." matches "sol" and "Bogotá" matches "Bogota"; numbers lose their separators
("31,989,256" -> "31989256"). Exact match is the reward; F1 is reported alongside for analysis and as an
optional dense reward.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AnswerScore", "exact_match", "f1_score", "normalize_answer", "score_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation) | {"\u2018", "\u2019", "\u201c", "\u201d", "\u2013", "\u2014", "\u00b7"}


def normalize_answer(text: str) -> str:
    """Lowercase, strip accents, punctuation and articles, collapse whitespace (SQuAD, plus accent folding)."""
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """Token-overlap F1 between normalised prediction and gold (SQuAD)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class AnswerScore:
    """Exact match and F1 of one prediction against every accepted answer."""

    prediction: str
    em: float
    f1: float
    matched: str | None  # the alias that matched exactly, if any

    def to_dict(self) -> dict[str, object]:
        return {"prediction": self.prediction, "em": self.em, "f1": self.f1, "matched": self.matched}


def score_answer(prediction: str, answers: Iterable[str]) -> AnswerScore:
    """EM = 1 if the prediction equals any alias after normalisation; F1 = the best over aliases."""
    golds = [a for a in answers if normalize_answer(a)]
    matched = next((g for g in golds if exact_match(prediction, g)), None)
    best_f1 = max((f1_score(prediction, g) for g in golds), default=0.0)
    return AnswerScore(prediction, 1.0 if matched is not None else 0.0, 1.0 if matched is not None else best_f1, matched)
