"""The shop's search engine: BM25 over product titles and aisle names.

WebShop searched its catalogue with BM25 (Pyserini); this is the same ranking over an inverted index built once
per process (~1 s for 49,688 titles), so the shop needs no search service. Ties break by product id, so result
pages are deterministic.

Each posting stores its product's whole BM25 term weight, computed once when the index is built, and a query adds
those weights into one score array with numpy: a query of common words touches tens of thousands of postings,
which a Python loop scored at 4-6 ms a query (generating the shop's goals searches once per goal).
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter, defaultdict

import numpy as np

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
        titles = catalogue.titles()
        # Row i of the score array is the i-th smallest product id, so sorting rows breaks ties by product id.
        self._product_ids = np.array(sorted(titles), dtype=np.int64)
        token_number: dict[str, int] = {}
        posting_token: list[int] = []
        posting_row: list[int] = []
        posting_tf: list[int] = []
        lengths = np.zeros(len(self._product_ids), dtype=np.float64)
        for row, product_id in enumerate(self._product_ids.tolist()):
            tokens = tokenize(titles[product_id]) + tokenize(catalogue.aisle_of(product_id))
            lengths[row] = len(tokens)
            for token, count in Counter(tokens).items():
                posting_token.append(token_number.setdefault(token, len(token_number)))
                posting_row.append(row)
                posting_tf.append(count)
        # Postings grouped by token number (a stable sort keeps each token's in row order).
        order = np.argsort(np.array(posting_token, dtype=np.int64), kind="stable")
        rows = np.array(posting_row, dtype=np.int64)[order]
        tf = np.array(posting_tf, dtype=np.float64)[order]
        counts = np.bincount(np.array(posting_token, dtype=np.int64), minlength=len(token_number))
        n = len(self._product_ids)
        average = float(lengths.sum()) / max(n, 1)
        # Every posting's term weight at once, the Okapi formula's operations in the usual order (math.log, not
        # numpy's vectorised log, whose last bit may differ by machine and reorder near-tied products).
        idf = np.repeat(np.array([math.log(1 + (n - c + 0.5) / (c + 0.5)) for c in counts.tolist()]), counts)
        norm = self.K1 * (1 - self.B + self.B * lengths[rows] / average)
        self._rows = rows
        self._weights = idf * tf * (self.K1 + 1) / (tf + norm)
        ends = np.cumsum(counts).tolist()
        self._span = {token: (ends[number] - int(counts[number]), ends[number])
                      for token, number in token_number.items()}

    def search(self, query: str, limit: int = 50) -> list[int]:
        """Product ids ranked by BM25 for ``query`` (best first), at most ``limit``."""
        scores = np.zeros(len(self._product_ids), dtype=np.float64)
        for token in dict.fromkeys(tokenize(query)):
            span = self._span.get(token)
            if span is not None:  # a product appears at most once in a token's postings
                scores[self._rows[span[0]:span[1]]] += self._weights[span[0]:span[1]]
        # Every term weight is positive, so the products any query word names are exactly the nonzero scores.
        hits = np.flatnonzero(scores)
        best = hits[np.lexsort((hits, -scores[hits]))[:limit]]
        return self._product_ids[best].tolist()


@functools.lru_cache(maxsize=1)
def default_index() -> SearchIndex:
    """The index over the full catalogue, built once per process."""
    return SearchIndex(load_catalogue())
