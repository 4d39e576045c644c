"""Answer scoring: the success/reward decision (:func:`grade_answer`), and SQuAD EM/F1 as reported metrics.

Normalisation lowercases, strips accents, punctuation and the articles a/an/the, and collapses
whitespace, so "The Sol." matches "sol" and "Bogotá" matches "Bogota"; numbers lose their separators
("31,989,256" -> "31989256").

:func:`grade_answer` decides success and reward, and nothing else does (the labelled set in
``tests/data/grading/search.jsonl`` checks exactly this function). It accepts an answer only when every
candidate it names is an accepted form of the gold answer: an alias, an alias wrapped in a stock phrase
("The answer is Astana."), a count with its noun ("3 countries"), or several aliases of the same entity
("Astana (Nur-Sultan)", "Sol (PEN)", "yen (¥)"), or a short sentence that names the gold and no other
candidate of its type ("The capital of Fiji is Suva.", "Suva, Fiji": Fiji is no capital). So it fails hedges ("Astana or Almaty", both options of a comparison,
a list of capitals), whole passages, the question echoed back and gold tokens padded with others, which
token F1 partly rewards: F1 is reported next to the verdict but is never the reward.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from agentgym.envs.search.candidates import ANSWER_TYPES, STOCK_WORDS, answer_type, candidate_names, is_search_kind

if TYPE_CHECKING:
    from agentgym.suite import Task

__all__ = [
    "AnswerScore",
    "SentenceContext",
    "accepted_answers",
    "context_for",
    "exact_match",
    "f1_score",
    "grade_answer",
    "grade_against",
    "normalize_answer",
    "rival_names",
    "score_answer",
]

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


# ---- the success/reward decision ----------------------------------------------------------------------
#: Longest answer (in normalised tokens) that can pass: the longest alias has 8 tokens ("Saint Vincent and the
#: Grenadines" style names plus a stock phrase); a passage or a list is far longer.
MAX_ANSWER_TOKENS = 16
#: Stock phrases around an answer that change nothing ("The answer is Lima.", "It's 3 countries").
_LEADING = re.compile(r"^(?:(?:so |thus |therefore )?(?:my |the )?(?:final )?answer(?: is)?|it is|its|that is|thats)\s+")
_COUNT_NOUN = re.compile(r"^(\S+) (?:other )?(?:countries|country|neighbours|neighbors|land borders|borders)$")
#: Where an answer names several things: a list or an alternative ("A or B", "A, B", "A / B", "A (B)").
#: Not "and": it is part of names ("Trinidad and Tobago"), and "A and B" fails anyway as it is no alias.
_SEPARATORS = re.compile(r"\s*(?:[,;/|()\[\]]|\bor\b|\baka\b|\balso known as\b|\bformerly\b)\s*", re.IGNORECASE)


def accepted_answers(task: Task) -> tuple[str, ...]:
    """The task's answer and its ``metadata["aliases"]``, deduplicated, in order (what grading accepts)."""
    answers = ([str(task.answer)] if task.answer is not None else []) + [
        str(a) for a in (task.metadata.get("aliases") or [])]
    return tuple(dict.fromkeys(a for a in answers if normalize_answer(a)))


def _canonical(text: str) -> str:
    """Normalised text without stock phrases or a count's noun: what is compared with the aliases.

    Names lose their spaces too, since normalisation joins hyphenated names ("Nur-Sultan" -> "nursultan")
    and a space-separated spelling ("Nur Sultan") is the same name; numbers keep them ("1 6" is not 16).
    """
    text = normalize_answer(text)
    text = _LEADING.sub("", text)
    match = _COUNT_NOUN.match(text)
    text = match.group(1) if match else text
    return text if any(ch.isdigit() for ch in text) else text.replace(" ", "")


#: Words that turn a sentence naming the gold into a hedge or a denial ("not Astana", "maybe Astana"); a
#: sentence with any of them is judged only by the strict paths above.
_HEDGE_WORDS = re.compile(r"\b(?:or|not|no|never|nor|neither|either|isnt|wasnt|arent|cant|cannot|dont|doesnt|"
                          r"maybe|perhaps|possibly|probably|likely|unlikely|unsure|unknown|guess|might|could|if|"
                          r"unless|except|instead|but|than|between|versus|vs)\b")


def _findable(name: str) -> str:
    """The normalised form of ``name`` to look for inside a sentence, or "" when it cannot be looked for
    safely: codes and abbreviations (written in capitals: "IN" India, "CAN" Canada, "PER" Peru, "US") are
    English words once lower-cased, so they count only as a whole answer."""
    norm = normalize_answer(name)
    letters = [ch for ch in name if ch.isalpha()]
    if letters and all(ch.isupper() for ch in letters) and len(norm.replace(" ", "")) <= 4:
        return ""
    return norm


_MAX_NAME_WORDS = 8


def _spans(words: list[str], names: frozenset[str] | set[str]) -> list[tuple[int, int]]:
    """(start, end) word spans of every run of 1-8 words that is one of ``names``."""
    return [(i, i + n) for i in range(len(words)) for n in range(1, _MAX_NAME_WORDS + 1)
            if i + n <= len(words) and " ".join(words[i:i + n]) in names]


@dataclass(frozen=True)
class SentenceContext:
    """What a sentence answer is judged against (built by :func:`context_for`).

    ``rivals``: findable forms of every other candidate of the answer's type (a sentence naming one fails);
    ``allowed``: the phrases that may stand around the gold: the question's own words, the words of stock
    answer sentences, and names of things of other types ("Fiji" around a capital). A word that is none of
    these (padding: "Harare city capital country town") fails the sentence.
    """

    rivals: frozenset[str]
    allowed: frozenset[str]
    #: Names of other types, kept apart from ``allowed`` so the large shared set is not copied per task.
    others: frozenset[str] = frozenset()


def _sentence_names_only_gold(text: str, answers: Iterable[str], context: SentenceContext) -> bool:
    """A short sentence that names the gold (some alias), no other candidate of its type, and nothing else.

    "The capital of Fiji is Suva." and "Suva, Fiji" name one capital: Suva (Fiji is no capital). Words
    inside a gold mention are no rival, so "Congo" inside "Democratic Republic of the Congo" is no second
    country. A hedge or denial word fails the sentence outright.
    """
    words = normalize_answer(text).split()
    if _HEDGE_WORDS.search(" ".join(words)):
        return False
    golds = {f for f in (_findable(a) for a in answers) if f}
    gold_spans = _spans(words, golds)
    if not gold_spans:
        return False
    covered = {i for start, end in gold_spans for i in range(start, end)}
    for start, end in _spans(words, context.rivals - golds):
        if not set(range(start, end)) <= covered:
            return False
    for names in (context.allowed, context.others):
        covered |= {i for start, end in _spans(words, names) for i in range(start, end)}
    return len(covered) == len(words)


def rival_names(names: Iterable[str]) -> frozenset[str]:
    """The findable normalised forms of candidate names (what :func:`grade_against` takes as ``rivals``)."""
    return frozenset(f for f in (_findable(n) for n in names) if f)


def grade_against(answer: str, answers: Iterable[str], context: SentenceContext | None = None) -> bool:
    """True when ``answer`` names the gold entity and nothing else (see the module docstring).

    ``context``: the other candidates of the answer's type and the words that may stand around the gold
    (:class:`SentenceContext`). With it a short sentence that names the gold, none of the others and
    nothing else passes; without it only the bare forms do.
    """
    answers = tuple(answers)
    golds = {_canonical(a) for a in answers} - {""}
    text = str(answer)
    if not golds or not normalize_answer(text) or len(normalize_answer(text).split()) > MAX_ANSWER_TOKENS:
        return False
    if _canonical(text) in golds:
        return True
    # Several names, each of which must be the gold entity: "Astana (Nur-Sultan)" passes, "Astana or Almaty"
    # does not. Split the raw text (normalisation would drop the brackets and commas that separate names).
    # A part of symbols only ("yen (¥)", "Euro (€)") names nothing and is left out.
    parts = [p for p in _SEPARATORS.split(text.strip().rstrip(".")) if any(ch.isalnum() for ch in normalize_answer(p))]
    if parts and all(_canonical(p) in golds for p in parts):
        return True
    return context is not None and _sentence_names_only_gold(text, answers, context)


def grade_answer(task: Task, answer: str) -> bool:
    """The success and reward decision of ``agentgym/Search-v1`` for ``answer`` to ``task``.

    Why a separate function from EM: the env, the labelled grading set and the reward-hacking battery must
    judge with the very same code, and EM alone both rejects harmless forms ("The answer is Lima") and, with
    a list of aliases, invites stuffing; this accepts equivalent forms and nothing that names a second
    candidate.
    """
    return grade_against(answer, accepted_answers(task), context_for(task))


@lru_cache(maxsize=8)
def _rivals(answer_kind: str) -> frozenset[str]:
    return rival_names(candidate_names()[answer_kind])


@lru_cache(maxsize=8)
def _others(answer_kind: str) -> frozenset[str]:
    """Names of every type but ``answer_kind`` (and counts): they may stand next to the gold in a sentence."""
    return frozenset().union(*(_rivals(name) for name in ANSWER_TYPES if name not in (answer_kind, "count")))


def context_for(task: Task) -> SentenceContext | None:
    """What a sentence answer to ``task`` is judged against, or None for a task of no known search kind
    (then only bare answers pass)."""
    kind = str(task.metadata.get("kind") or "")
    if not is_search_kind(kind):
        return None
    own = answer_type(kind)
    allowed = frozenset(normalize_answer(str(task.prompt)).split()) | STOCK_WORDS
    return SentenceContext(rivals=_rivals(own), allowed=allowed, others=_others(own))
