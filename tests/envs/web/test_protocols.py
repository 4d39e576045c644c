"""WebShop scoring protocols: ``strict`` (exact matching, the default) and ``upstream`` (WebShop's own
``get_reward`` in ``web_agent_site/engine/goal.py``: fuzzy option match, title fallback), on hand-made purchases
whose scores under WebShop's rule were worked out by hand from that function."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest
from agentgym.envs.web.app import CartLine, Order, ShopApp
from agentgym.envs.web.catalogue import Product, load_catalogue
from agentgym.envs.web.goals import Goal, generate_tasks
from agentgym.envs.web.reward import score_item
from agentgym.envs.web.webshop_rules import normalize_color, score_item_upstream, token_set_ratio
from agentgym.errors import ConfigError

COOKIES = Product(id=1, title="Chocolate Chip Cookies", department="snacks", aisle="cookies cakes", base_price=2.0,
                  rating=4.5, features=("organic", "whole grain"),
                  options={"size": ("250 g", "500 g"), "pack": ("1-pack", "6-pack", "12-pack"),
                           "flavour": ("vanilla", "chocolate", "caramel")})
CHIPS = Product(id=2, title="Kettle Potato Chips", department="snacks", aisle="chips pretzels", base_price=1.5,
                rating=4.0, features=("gluten free", "non-gmo"),
                options={"size": ("100 g", "250 g"), "pack": ("2-pack", "24-pack"),
                         "flavour": ("lemon", "lemon pepper", "sea salt")})
COOKIE_GOAL = {"features": ("organic",), "options": {"size": "500 g", "pack": "12-pack", "flavour": "vanilla"}}
CHIPS_GOAL = {"features": ("gluten free",), "options": {"size": "250 g", "pack": "24-pack", "flavour": "lemon"}}

# (name, product, goal, choice, price, strict score, WebShop's score). Goals have 1 attribute + 3 options + price,
# so every score is a multiple of 1/5.
CASES = [
    ("right purchase", COOKIES, COOKIE_GOAL,
     {"size": "500 g", "pack": "12-pack", "flavour": "vanilla"}, 20.0, 1.0, 1.0),
    # WebShop: pack is matched fuzzily; token_set_ratio("12-pack", "1-pack") = 92 > 85, so the wrong pack counts.
    ("wrong pack 1 for 12", COOKIES, COOKIE_GOAL,
     {"size": "500 g", "pack": "1-pack", "flavour": "vanilla"}, 20.0, 0.8, 1.0),
    # WebShop: "chocolate" matches no goal option, but it is in the title ("chocolate chip cookies"): it counts.
    ("wrong flavour in title", COOKIES, COOKIE_GOAL,
     {"size": "500 g", "pack": "12-pack", "flavour": "chocolate"}, 20.0, 0.8, 1.0),
    # WebShop: token_set_ratio("12-pack", "6-pack") = 80, not above 85, and "6-pack" is not in the title.
    ("wrong pack 6 for 12", COOKIES, COOKIE_GOAL,
     {"size": "500 g", "pack": "6-pack", "flavour": "vanilla"}, 20.0, 0.8, 0.8),
    # WebShop: size is matched exactly ("250 g" is not among the goal values) and is not in the title.
    ("wrong size", COOKIES, COOKIE_GOAL,
     {"size": "250 g", "pack": "12-pack", "flavour": "vanilla"}, 20.0, 0.8, 0.8),
    # WebShop counts picked options only: a pack left on "Choose pack" adds nothing in both.
    ("pack not chosen", COOKIES, COOKIE_GOAL, {"size": "500 g", "flavour": "vanilla"}, 20.0, 0.8, 0.8),
    # WebShop: normalize_color cuts "lemon pepper" to "lemon", the goal's flavour; and "2-pack" vs "24-pack" = 92.
    ("lemon pepper and 2 for 24", CHIPS, CHIPS_GOAL,
     {"size": "250 g", "pack": "2-pack", "flavour": "lemon pepper"}, 5.0, 0.6, 1.0),
]


def _scores(product: Product, goal: dict, choice: dict, price: float) -> tuple[float, float]:
    kwargs = dict(goal_product_id=product.id, goal_title=product.title, goal_aisle=product.aisle,
                  goal_features=goal["features"], goal_options=goal["options"], price_upper=30.0)
    return (score_item(product, choice, price, **kwargs).total,
            score_item_upstream(product, choice, price, **kwargs).total)


@pytest.mark.parametrize("name, product, goal, choice, price, strict, upstream", CASES, ids=[c[0] for c in CASES])
def test_hand_made_cases_score_as_each_protocol_says(name, product, goal, choice, price, strict, upstream):
    got_strict, got_upstream = _scores(product, goal, choice, price)
    assert got_strict == pytest.approx(strict)
    assert got_upstream == pytest.approx(upstream)  # WebShop's get_reward on the same purchase


def test_the_protocols_disagree_on_three_of_the_seven_cases():
    disagree = [c[0] for c in CASES if _scores(*c[1:5])[0] != pytest.approx(_scores(*c[1:5])[1])]
    assert disagree == ["wrong pack 1 for 12", "wrong flavour in title", "lemon pepper and 2 for 24"]


def test_token_set_ratio_matches_thefuzz_0_19():
    # Values thefuzz 0.19.0 (difflib, WebShop's pinned version) returns for these pairs.
    pairs = {("1-pack", "12-pack"): 92, ("2-pack", "24-pack"): 92, ("6-pack", "12-pack"): 80,
             ("1-pack", "2-pack"): 83, ("vanilla", "vanilla bean"): 100, ("500 g", "250 g"): 80,
             ("gluten free", "dairy free"): 57, ("Non-GMO!", "non gmo"): 100, ("", "x"): 0, ("café", "caf"): 100}
    assert {pair: token_set_ratio(*pair) for pair in pairs} == pairs
    assert normalize_color("lemon pepper") == "lemon" and normalize_color("sea salt") == "sea salt"


def test_upstream_never_scores_below_strict_on_the_catalogue():
    """WebShop's rules credit a superset of what exact matching credits, so the difference runs one way here."""
    catalogue = load_catalogue()
    rng = random.Random(3)
    tasks = generate_tasks(random.Random("protocols"), 30)
    higher = 0
    for task in tasks:
        goal = Goal.from_task(task)
        for _ in range(10):
            product = catalogue.get(rng.choice([goal.product_id, rng.randrange(1, 49689)]))
            choice = {k: rng.choice(v) for k, v in product.options.items() if rng.random() < 0.8}
            kwargs = dict(goal_product_id=goal.product_id, goal_title=goal.title, goal_aisle=goal.aisle,
                          goal_features=goal.features, goal_options=goal.options, price_upper=goal.price_upper)
            price = product.price(choice)
            strict = score_item(product, choice, price, **kwargs).total
            upstream = score_item_upstream(product, choice, price, **kwargs).total
            assert strict - 1e-9 <= upstream <= 1.0 + 1e-9
            higher += upstream > strict + 1e-9
    assert higher > 0


def test_app_scores_an_order_under_either_protocol_and_refuses_unknown_ones():
    app = ShopApp()
    task = generate_tasks(random.Random("protocol-order"), 1)[0]
    goal = Goal.from_task(task)
    product = app.catalogue.get(goal.product_id)
    wrong = {**goal.options}
    wrong["pack"] = next((p for p in product.options["pack"] if p != goal.options["pack"]
                          and token_set_ratio(goal.options["pack"], p) > 85), goal.options["pack"])
    order = Order(1, (CartLine(product.id, wrong, product.price(wrong)),))
    strict, _ = app.score_order(order, goal)
    upstream, _ = app.score_order(order, goal, "upstream")
    assert upstream >= strict
    with pytest.raises(ConfigError, match="'strict', 'upstream'"):
        app.score_order(order, goal, "webshop")


def test_env_takes_the_protocol_and_refuses_a_misspelt_one():
    env = gym.make("agentgym/WebShop-text-v1", protocol="upstream")
    try:
        assert env.unwrapped.protocol == "upstream"
    finally:
        env.close()
    with pytest.raises(ConfigError, match="upstream"):
        gym.make("agentgym/WebShop-text-v1", protocol="Upstream")


def _ref(observation: str, text: str) -> str:
    line = next(line for line in observation.splitlines() if text in line and "[ref=" in line)
    return line.split("[ref=", 1)[1].split("]", 1)[0]


def _buy(protocol: str, task, choice: dict[str, str]) -> tuple[float, bool]:
    """Shop with the reference solver but pick ``choice`` on the goal's product page; the episode's reward."""
    env = gym.make("agentgym/WebShop-text-v1", max_turns=40, protocol=protocol)
    try:
        obs, _ = env.reset(options={"task": task})
        solver = env.unwrapped.reference_solver()
        goal = Goal.from_task(task)
        picked = False
        for _ in range(40):
            if f"URL: /product/{goal.product_id}" in obs and not picked:
                for kind, value in choice.items():
                    ref = _ref(obs, 'combobox "' + kind.capitalize() + '"')
                    obs, *_ = env.step(f'select("{ref}", "{value}")')
                ref = _ref(obs, 'button "Add to cart"')
                obs, *_ = env.step(f'click("{ref}")')
                picked = True
                continue
            obs, reward, terminated, truncated, info = env.step(solver(obs))
            if terminated or truncated:
                return reward, bool(info["outcome"]["success"])
        raise AssertionError("the episode did not end")
    finally:
        env.close()


def test_an_episode_pays_the_chosen_protocols_score():
    """A wrong pack that WebShop's fuzzy match accepts: the strict env pays less than full, the upstream one 1.0."""
    catalogue = load_catalogue()
    for task in generate_tasks(random.Random("protocol-episode"), 40):
        goal = Goal.from_task(task)
        product = catalogue.get(goal.product_id)
        wrong = [p for p in product.options["pack"] if p != goal.options["pack"]
                 and token_set_ratio(goal.options["pack"], p) > 85  # fuzzily "the same" pack
                 and product.price({**goal.options, "pack": p}) <= goal.price_upper]  # and within the price limit
        if wrong:
            break
    else:
        pytest.fail("no task with a fuzzily matching wrong pack among 40")
    choice = {**goal.options, "pack": wrong[0]}
    strict, strict_success = _buy("strict", task, choice)
    upstream, upstream_success = _buy("upstream", task, choice)
    total = len(goal.features) + len(goal.options) + 1
    assert not strict_success and strict == pytest.approx((total - 1) / total)
    assert upstream_success and upstream == pytest.approx(1.0)
