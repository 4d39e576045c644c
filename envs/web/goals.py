"""Shopping goals and their WebShop-style instructions, generated from a seed.

A goal names a target product, one or two of its features, one choice per option kind and a price limit
that the target with those options meets. The instruction reads like WebShop's ("i'm looking for a
6-pack of ... that is gluten free, in the 500 g size and vanilla flavour, and price lower than 24.00
dollars"); any product that satisfies everything scores 1, not only the target.

Test tasks use every fifth product (by id) and train tasks the others, so held-out tasks ask for products
the agent never bought in training. Every goal's target is found on the first results page when its
instruction's product name is searched, so every task is solvable through the UI.

Task ids (``shop-<index>-<random hex>``) say nothing about the goal: the id reaches the policy in
``info["task_id"]``, and a target product id there would let it open ``/product/<id>`` without searching.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agentgym.envs.web.catalogue import Product, load_catalogue
from agentgym.envs.web.search import default_index

from agentgym.errors import TaskError
from agentgym.suite import Task

__all__ = ["RESULTS_PER_PAGE", "Goal", "generate_tasks", "make_goal"]

RESULTS_PER_PAGE = 10
HOLDOUT_EVERY = 5

_TEMPLATES = (
    "i'm looking for {pack_a} of {title} that is {features}, {opts}, and price lower than {price} dollars",
    "i need {pack_a} of {title}; it should be {features}, {opts}, and cost less than {price} dollars",
    "buy {pack_a} of {title} ({features}) {opts}, priced under {price} dollars",
    "find me {title} that is {features} - {pack_a}, {opts} - and keep the price below {price} dollars",
)


@dataclass(frozen=True)
class Goal:
    """What the shopper wants; stored in the task's metadata.

    Attributes:
        product_id: The product the goal was drawn from (a full match is possible with it).
        title: Its title, for WebShop's product-type check.
        aisle: Its aisle, for WebShop's category check.
        features: Features the bought product must have.
        options: Option kind -> required choice.
        price_upper: The bought item's price must not exceed this.
        instruction: The instruction text shown to the agent.
        query: What the reference solver types into the search box.
    """

    product_id: int
    title: str
    aisle: str
    features: tuple[str, ...]
    options: Mapping[str, str]
    price_upper: float
    instruction: str
    query: str

    def to_metadata(self) -> dict[str, Any]:
        return {"product_id": self.product_id, "title": self.title, "aisle": self.aisle,
                "features": list(self.features), "options": dict(self.options), "price_upper": self.price_upper,
                "query": self.query}

    @classmethod
    def from_task(cls, task: Task) -> Goal:
        meta = task.metadata
        try:
            return cls(product_id=int(meta["product_id"]), title=str(meta["title"]), aisle=str(meta["aisle"]),
                       features=tuple(str(f) for f in meta["features"]),
                       options={str(k): str(v) for k, v in dict(meta["options"]).items()},
                       price_upper=float(meta["price_upper"]), instruction=task.prompt,
                       query=str(meta.get("query", meta["title"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise TaskError(
                f"WebShop task {task.id!r} needs metadata product_id, title, aisle, features, options and "
                f"price_upper (make tasks with agentgym.envs.web.goals.generate_tasks); problem: {exc!r}."
            ) from None


def _option_phrase(options: Mapping[str, str]) -> str:
    parts = []
    if "size" in options:
        size = options["size"]
        parts.append(f"in {size}" if size.endswith("size") else f"in the {size} size")
    if "flavour" in options:
        parts.append(f"{options['flavour']} flavour")
    if "scent" in options:
        parts.append(f"{options['scent']} scent")
    return " and ".join(parts) if parts else "any size"


def make_goal(product: Product, rng: random.Random) -> Goal:
    """Draw features, options and a price limit for ``product`` and phrase the instruction."""
    features = tuple(rng.sample(product.features, min(len(product.features), rng.randint(1, 2))))
    options = {kind: rng.choice(values) for kind, values in product.options.items()}
    price = product.price(options)
    price_upper = float(int(price * rng.uniform(1.1, 1.6)) + 1)
    pack = options.get("pack", "1-pack")
    template = rng.choice(_TEMPLATES)
    instruction = template.format(
        pack_a=f"a {pack}", title=product.title.lower(), features=" and ".join(features),
        opts=_option_phrase(options), price=f"{price_upper:.2f}",
    )
    return Goal(product_id=product.id, title=product.title, aisle=product.aisle, features=features,
                options=options, price_upper=price_upper, instruction=instruction, query=product.title.lower())


def generate_tasks(rng: random.Random, count: int, *, holdout: Literal["exclude", "only", "any"] = "exclude",
                   departments: list[str] | None = None) -> list[Task]:
    """``count`` distinct shopping tasks whose targets are findable on the first results page.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks.
        holdout: ``exclude`` draws from the training products (ids not divisible by 5), ``only`` from the
            held-out ones, ``any`` from all.
        departments: Restrict targets to these department names (e.g. ``["snacks", "beverages"]``).
    """
    if holdout not in ("exclude", "only", "any"):
        raise TaskError(f"holdout must be 'exclude', 'only' or 'any', got {holdout!r}.")
    catalogue = load_catalogue()
    index = default_index()
    titles = catalogue.titles()
    lowered: dict[str, int] = {}
    for title in titles.values():
        lowered[title.lower()] = lowered.get(title.lower(), 0) + 1
    pool = [pid for pid in catalogue.ids
            if (holdout == "any" or (pid % HOLDOUT_EVERY == 0) == (holdout == "only"))
            and lowered[titles[pid].lower()] == 1 and 2 <= len(titles[pid]) <= 80]
    if departments:
        wanted = set(departments)
        unknown = wanted - set(catalogue.departments.values())
        if unknown:
            known = sorted(set(catalogue.departments.values()))
            raise TaskError(f"Unknown departments {sorted(unknown)}; known: {known}.")
        pool = [pid for pid in pool if catalogue.get(pid).department in wanted]
    if not pool:
        raise TaskError("No product matches the task filters; relax 'departments' or 'holdout'.")
    goals: list[Goal] = []
    seen: set[int] = set()
    attempts = 0
    while len(goals) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise TaskError(f"Could only make {len(goals)} of {count} solvable tasks; ask for fewer.")
        product_id = pool[rng.randrange(len(pool))]
        if product_id in seen:
            continue
        product = catalogue.get(product_id)
        if product_id not in index.search(product.title.lower(), limit=RESULTS_PER_PAGE):
            continue
        seen.add(product_id)
        goals.append(make_goal(product, rng))
    # The id reaches the policy (info["task_id"]): naming the target product would let it open
    # /product/<id> without searching, so ids are random draws taken after the goals (goals are unchanged).
    return [Task(id=f"shop-{i}-{rng.getrandbits(32):08x}", prompt=goal.instruction, answer=None,
                 metadata=goal.to_metadata())
            for i, goal in enumerate(goals)]
