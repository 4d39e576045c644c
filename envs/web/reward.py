"""WebShop's reward, computed from what was actually bought.

WebShop (Yao et al., 2022, ``web_agent_site/engine/goal.py``) scores a purchase as

    r = r_type * (n_matched_attributes + n_matched_options + [price <= price_upper])
                / (n_goal_attributes + n_goal_options + 1)

where ``r_type`` checks the bought thing is the right kind of product: 1.0 when the query, the category or
enough of the title's nouns match, 0.5 when only a little of the title matches, 0.1 below 10 % overlap and
0.0 with no overlap. Success is a full match (``r == 1``).

``n_matched_options`` counts only options the shopper chose: a goal option whose kind was left on the product
page's blank "Choose ..." entry scores 0 even when the product's first value happens to be the wanted one
(WebShop's ``get_option_reward`` compares the goal with ``purchased_options``, the options clicked). Filling
in defaults let the right product bought with no option chosen score 1.0 on 2 of 20 tasks.

A placed order is scored by :func:`order_score`: its best item's ``r`` divided by the number of items in the
order (WebShop buys one item; buying several must not pay). WebShop matched attributes and options with
fuzzy string ratios (``thefuzz``) and a title fallback, and title nouns with spaCy. This default ``strict``
protocol matches exactly: on our closed vocabulary the fuzzy rules credit wrong choices ("1-pack" for
"12-pack" scores 92 > 85, and a wrong flavour that appears in the title counts), so exact matching is the
stricter, truer test. ``protocol="upstream"`` (:mod:`agentgym.envs.web.webshop_rules`) applies WebShop's own
rules, for numbers to put next to published ones. In both, title nouns are approximated by the title's
content words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentgym.envs.web.catalogue import Product
from agentgym.errors import ConfigError

__all__ = ["PROTOCOLS", "ItemScore", "check_protocol", "order_score", "score_item", "title_overlap", "type_reward"]

#: Scoring protocols: ``strict`` (exact option and attribute matching, the default) and ``upstream`` (WebShop's
#: fuzzy matching and title fallback, :mod:`agentgym.envs.web.webshop_rules`), for numbers comparable with papers.
PROTOCOLS = ("strict", "upstream")

_STOPWORDS = frozenset({
    "a", "an", "and", "the", "of", "with", "in", "on", "for", "to", "from", "by", "or", "no", "not", "free", "less",
    "more", "&", "+", "-", "oz", "g", "kg", "ml", "l", "pack", "size",
})
_WORD = re.compile(r"[a-z0-9]+")


def _content_words(title: str) -> set[str]:
    return {w for w in _WORD.findall(title.lower()) if w not in _STOPWORDS and not w.isdigit()}


def title_overlap(bought_title: str, goal_title: str) -> float:
    """Share of the goal title's content words that the bought title has (WebShop's ``title_score``)."""
    wanted = _content_words(goal_title)
    if not wanted:
        return 0.2  # WebShop's value when the goal title has no nouns
    return len(wanted & _content_words(bought_title)) / len(wanted)


@dataclass(frozen=True)
class ItemScore:
    """The parts of WebShop's reward for one bought item."""

    r_type: float
    attributes_matched: int
    attributes_total: int
    options_matched: int
    options_total: int
    price_ok: bool

    @property
    def total(self) -> float:
        matched = self.attributes_matched + self.options_matched + int(self.price_ok)
        return self.r_type * matched / (self.attributes_total + self.options_total + 1)


def check_protocol(protocol: object) -> str:
    """``protocol`` if it names a scoring protocol, else a ConfigError that lists them."""
    if protocol not in PROTOCOLS:
        raise ConfigError(f"protocol must be one of {', '.join(map(repr, PROTOCOLS))}, got {protocol!r}: 'strict' "
                          "counts only exact matches, 'upstream' follows WebShop's own get_reward (fuzzy options, "
                          "title fallback) for numbers next to published ones.")
    return str(protocol)


def type_reward(product: Product, *, goal_product_id: int, goal_title: str, goal_aisle: str) -> float:
    """WebShop's ``r_type``: is the bought product the right kind of thing?"""
    overlap = title_overlap(product.title, goal_title)
    match = product.id == goal_product_id or product.aisle == goal_aisle or overlap > 0.2
    r_type = 1.0 if match else 0.5
    if overlap < 0.1:
        r_type = 0.1
    if overlap == 0.0:
        r_type = 0.0
    if product.id == goal_product_id:
        r_type = 1.0
    return r_type


def score_item(product: Product, choice: Mapping[str, str], price: float, *, goal_product_id: int,
               goal_title: str, goal_aisle: str, goal_features: Sequence[str], goal_options: Mapping[str, str],
               price_upper: float) -> ItemScore:
    """Score one bought item (``product`` with options ``choice`` at ``price``) against the goal, matching exactly
    (the ``strict`` protocol; ``webshop_rules.score_item_upstream`` is the ``upstream`` one)."""
    r_type = type_reward(product, goal_product_id=goal_product_id, goal_title=goal_title, goal_aisle=goal_aisle)
    title_lower = product.title.lower()
    attributes = sum(1 for f in goal_features if f in product.features or f in title_lower)
    options = sum(1 for kind, wanted in goal_options.items()
                  if str(choice.get(kind, "")).lower() == str(wanted).lower())  # unchosen kinds are absent: 0
    return ItemScore(r_type, attributes, len(goal_features), options, len(goal_options), price <= price_upper + 1e-9)


def order_score(item_scores: Sequence[ItemScore]) -> float:
    """Score of a placed order: its best item's reward, divided by the number of items bought.

    WebShop buys exactly one item; a cart lets an agent buy several, so buying extra items must not pay.
    """
    if not item_scores:
        return 0.0
    return max(s.total for s in item_scores) / len(item_scores)
