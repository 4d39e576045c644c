"""The lexical analyzer BM25 uses: fold case and accents, split into words, drop stopwords.

Folding accents matters for real data: the corpus writes "Bogotá" and "Yaoundé" while people (and models)
type "Bogota"; without folding those queries silently miss. The same analyzer runs on documents and
queries, and the benchmark gives it to the ``rank-bm25`` baseline too, so both libraries score the same
tokens.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["ANALYZER_VERSION", "ENGLISH_STOPWORDS", "fold", "tokenize"]

#: Bump when tokenization changes: saved lexical indexes built with another version are rebuilt.
ANALYZER_VERSION = 1

#: A short English stopword list (function words only: content words such as "capital" must survive).
ENGLISH_STOPWORDS: frozenset[str] = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    also s t""".split()  # noqa: SIM905 - a word list reads better as text
)

_WORD = re.compile(r"\w\w+")


def fold(text: str) -> str:
    """Lowercase and strip accents (NFKD, combining marks removed): "Bogotá" -> "bogota"."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()


def tokenize(text: str, *, stopwords: Iterable[str] | None = ENGLISH_STOPWORDS, stem: bool = False) -> list[str]:
    """Split ``text`` into folded words of two or more characters, without stopwords.

    Args:
        text: Any text.
        stopwords: Words to drop (``None`` keeps all).
        stem: Strip a plural "s" ("capitals" -> "capital"); a deliberately tiny stemmer that is the same for
            documents and queries.
    """
    words = _WORD.findall(fold(text))
    stop = stopwords if isinstance(stopwords, (set, frozenset)) else frozenset(stopwords or ())
    if stop:
        words = [w for w in words if w not in stop]
    if stem:
        words = [_strip_plural(w) for w in words]
    return words


def _strip_plural(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word
