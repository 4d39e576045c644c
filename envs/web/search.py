"""The shop's search engine: BM25 over product titles and aisle names.

WebShop searched its catalogue with BM25 (Pyserini); this is the same ranking in pure Python over an
inverted index built once per process (~1 s for 49,688 titles), so the shop needs no search service.
Ties break by product id, so result pages are deterministic.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter, defaultdict

from agentgym.envs.web.catalogue import Catalogue, load_catalogue

__all__ = ["SearchIndex", "default_index", "tokenize"]

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric words; a trailing plural 's' is dropped (``cookies`` finds ``cookie``)."""
    words = _TOKEN.findall(text.lower())
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words]


class SearchIndex:
    """Okapi BM25 (k1=1.2, b=0.75) over ``title + aisle`` of every product.

    Args:
        catalogue: The products to index.
    """

    K1 = 1.2
    B = 0.75

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lengths: dict[int, int] = {}
        for product_id, title in catalogue.titles().items():
            tokens = tokenize(title) + tokenize(catalogue.aisle_of(product_id))
            lengths[product_id] = len(tokens)
            for token, count in Counter(tokens).items():
                postings[token].append((product_id, count))
        self._postings = dict(postings)
        self._lengths = lengths
        self._avg_length = sum(lengths.values()) / max(len(lengths), 1)
        n = len(lengths)
        self._idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self._postings.items()}

    def search(self, query: str, limit: int = 50) -> list[int]:
        """Product ids ranked by BM25 for ``query`` (best first), at most ``limit``."""
        scores: dict[int, float] = defaultdict(float)
        for token in dict.fromkeys(tokenize(query)):
            idf = self._idf.get(token)
            if idf is None:
                continue
            for product_id, tf in self._postings[token]:
                norm = self.K1 * (1 - self.B + self.B * self._lengths[product_id] / self._avg_length)
                scores[product_id] += idf * tf * (self.K1 + 1) / (tf + norm)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        return [product_id for product_id, _ in ranked[:limit]]


@functools.lru_cache(maxsize=1)
def default_index() -> SearchIndex:
    """The index over the full catalogue, built once per process."""
    return SearchIndex(load_catalogue())
