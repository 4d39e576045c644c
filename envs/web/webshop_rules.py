"""WebShop's own matching rules, for scores that can stand next to published WebShop numbers.

WebShop (Yao et al., 2022) scores a purchase with ``get_reward`` in ``web_agent_site/engine/goal.py``, pinned to
``thefuzz==0.19.0`` without python-Levenshtein, so its string ratio is :class:`difflib.SequenceMatcher`'s. Its
rules are looser than the exact matching of :func:`agentgym.envs.web.reward.score_item` in three ways, each
reproduced here:

* **Fuzzy options.** Every option the shopper picked, except a ``size``, counts when its ``token_set_ratio``
  with *any* goal option value exceeds 85. "1-pack" and "12-pack" score 92 (``"pack 1"`` vs ``"pack 12"``), so
  a wrong pack count earns the option.
* **Title fallback.** A picked option that matched nothing still counts when its value appears in the product's
  title, bullet points or description: picking "chocolate" for a "Chocolate Chip Cookies" goal that wanted
  "vanilla" earns the option.
* **Colour normalisation.** Option values are first cut to the first colour word they contain (``normalize_color``:
  "lemon pepper" becomes "lemon"), so flavours named after colours match each other.

Attributes match a product attribute with ``token_set_ratio > 85`` or appear in the title, bullet points or
description. Our product pages list the features as bullet points and have no description, so the product's
features stand for both WebShop's ``Attributes`` and its ``BulletPoints``. ``r_type`` and the order rule (best
item divided by the number bought) are shared with the default protocol; WebShop's spaCy noun parse of titles is
approximated by content words there too.

WebShop counts matches per *picked* option, not per goal option, so a goal that names fewer option kinds than
the product offers could score above 1 under its rule; generated goals name every kind, so they cannot.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

from agentgym.envs.web.catalogue import Product
from agentgym.envs.web.reward import ItemScore, type_reward

__all__ = ["COLOR_WORDS", "EXACT_MATCH_OPTIONS", "attribute_matches", "fuzzy_ratio", "normalize_color",
           "option_matches", "score_item_upstream", "token_set_ratio"]

#: Option kinds WebShop matches exactly instead of fuzzily.
EXACT_MATCH_OPTIONS = frozenset({"size"})
#: Fuzzy matches need a ``token_set_ratio`` strictly above this.
FUZZY_THRESHOLD = 85

#: WebShop's ``COLOR_SET`` (``web_agent_site/engine/normalize.py``), in its order: the first one contained in an
#: option value replaces the value.
COLOR_WORDS = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal",
    "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass",
    "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light",
    "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
    "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow",
    "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone",
    "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut", "wheat", "white",
    "wine", "yellow",
)
_NON_WORD = re.compile(r"(?ui)\W")


def normalize_color(value: str) -> str:
    """The first colour word ``value`` contains (case-sensitive substring, as WebShop does), else ``value``."""
    for colour in COLOR_WORDS:
        if colour in value:
            return colour
    return value


def _process(text: str) -> str:
    """thefuzz's ``full_process`` with ``force_ascii``: drop non-ASCII, non-word characters to spaces, lower-case."""
    ascii_only = "".join(ch for ch in text if ord(ch) < 128)
    return _NON_WORD.sub(" ", ascii_only).lower().strip()


def fuzzy_ratio(a: str, b: str) -> int:
    """thefuzz 0.19's ``ratio`` without python-Levenshtein: difflib's similarity in percent, rounded."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``token_set_ratio``: compare the shared words with each side's shared-plus-own words, keep the best.

    One side's words all being among the other's scores 100 ("pack" vs "pack 12" is not that case: "pack" is not an
    option value; "vanilla" vs "vanilla bean" is).
    """
    p1, p2 = _process(a), _process(b)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    common = " ".join(sorted(t1 & t2))
    first = (common + " " + " ".join(sorted(t1 - t2))).strip()
    second = (common + " " + " ".join(sorted(t2 - t1))).strip()
    common = common.strip()
    return max(fuzzy_ratio(common, first), fuzzy_ratio(common, second), fuzzy_ratio(first, second))


def _in_text(value: str, product: Product) -> bool:
    """WebShop's fallback: ``value`` appears in the title, the bullet points or the description (case-sensitive
    ``value`` against lower-cased text, as WebShop does; our pages have no description)."""
    return value in product.title.lower() or value in " ".join(product.features).lower()


def attribute_matches(product: Product, goal_features: Sequence[str]) -> int:
    """WebShop's ``get_attribute_reward`` count: fuzzy match with an attribute, else a substring of the text."""
    matched = 0
    for wanted in goal_features:
        fuzzy = any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.features)
        if fuzzy or _in_text(wanted, product):
            matched += 1
    return matched


def option_matches(product: Product, choice: Mapping[str, str], goal_options: Mapping[str, str]) -> int:
    """WebShop's ``get_option_reward`` count: per *picked* option, against every goal option value."""
    wanted = [normalize_color(str(v)) for v in goal_options.values()]
    matched = 0
    for kind, picked_raw in choice.items():
        picked = normalize_color(str(picked_raw))
        if kind.lower() in EXACT_MATCH_OPTIONS:
            hit = picked in wanted
        else:
            hit = any(token_set_ratio(goal_value, picked) > FUZZY_THRESHOLD for goal_value in wanted)
        if hit or _in_text(picked, product):
            matched += 1
    return matched


def score_item_upstream(product: Product, choice: Mapping[str, str], price: float, *, goal_product_id: int,
                        goal_title: str, goal_aisle: str, goal_features: Sequence[str],
                        goal_options: Mapping[str, str], price_upper: float) -> ItemScore:
    """Score one bought item with WebShop's matching rules (same arguments as ``reward.score_item``)."""
    r_type = type_reward(product, goal_product_id=goal_product_id, goal_title=goal_title, goal_aisle=goal_aisle)
    return ItemScore(r_type, attribute_matches(product, goal_features), len(goal_features),
                     option_matches(product, choice, goal_options), len(goal_options),
                     price <= price_upper if price_upper > 0 else False)
