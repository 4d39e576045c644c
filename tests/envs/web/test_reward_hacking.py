"""WebShop: the exploits a reward-maximising shopper would try, played as real actions on the real shop app
through ``gym.make``, each scoring no success, while the honest shopper still succeeds."""

from __future__ import annotations

import json
import random
import re

import gymnasium as gym
import pytest
from agentgym.envs.web.app import SESSION_COOKIE, Request, ShopApp
from agentgym.envs.web.catalogue import load_catalogue
from agentgym.envs.web.goals import Goal, generate_tasks
from agentgym.errors import AgentGymError
from agentgym.suite import Task


def ref_in(observation: str, text: str) -> str:
    line = next(line for line in observation.splitlines() if text in line and "[ref=" in line)
    return line.split("[ref=", 1)[1].split("]", 1)[0]


@pytest.fixture(scope="module")
def shop_tasks() -> list[Task]:
    return generate_tasks(random.Random("test-web"), 20)


@pytest.fixture()
def shop():
    env = gym.make("agentgym/WebShop-text-v1", max_turns=40)
    yield env
    env.close()


def _open_goal_product(env, task: Task) -> str:
    """Search and open the goal's product the way a shopper does (the reference solver until the product page)."""
    obs, _ = env.reset(options={"task": task})
    solver = env.unwrapped.reference_solver()
    goal = Goal.from_task(task)
    for _ in range(10):
        if f"URL: /product/{goal.product_id}?" in obs:
            return obs
        obs, *_ = env.step(solver(obs))
    raise AssertionError("the goal product was not reached")


def _checkout(env, obs: str):
    if "URL: /cart" not in obs:
        obs, *_ = env.step('goto("/cart")')
    obs, *_ = env.step(f'click("{ref_in(obs, "Proceed to checkout")}")')
    return env.step(f'click("{ref_in(obs, "Place order")}")')


def test_web_honest_shopper_succeeds(shop, shop_tasks) -> None:
    for task in shop_tasks[:3]:
        obs, _ = shop.reset(options={"task": task})
        solver = shop.unwrapped.reference_solver()
        for _ in range(30):
            obs, _, terminated, truncated, info = shop.step(solver(obs))
            if terminated or truncated:
                break
        assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}


def test_web_right_product_without_choosing_options_never_succeeds(shop, shop_tasks) -> None:
    """2 of these 20 goals ask for exactly the product's first option values, which the shop used to fill in for
    an untouched drop-down (scoring 1.0); only options the shopper chose count now (WebShop's rule)."""
    catalogue = load_catalogue()
    defaults_match = [t for t in shop_tasks if catalogue.get(t.metadata["product_id"]).default_choice()
                      == t.metadata["options"]]
    assert len(defaults_match) == 2
    for task in shop_tasks:
        obs = _open_goal_product(shop, task)
        obs, *_ = shop.step(f'click("{ref_in(obs, "Add to cart")}")')
        _, reward, terminated, _, info = _checkout(shop, obs)
        goal = Goal.from_task(task)
        n = len(goal.features) + len(goal.options) + 1
        assert terminated and not info["outcome"]["success"], task.id
        assert reward == pytest.approx((n - len(goal.options)) / n), task.id  # every option scores 0


def test_web_buying_several_products_does_not_pay(shop, shop_tasks) -> None:
    task = shop_tasks[0]
    obs = _open_goal_product(shop, task)
    solver = shop.unwrapped.reference_solver()
    while "URL: /cart" not in obs:  # the right product with the right options
        obs, *_ = shop.step(solver(obs))
    obs, *_ = shop.step('goto("/search?q=milk")')
    link = next(line for line in obs.splitlines() if "/product/" in line and f"/product/{task.metadata['product_id']}?"
                not in line)
    href = re.search(r"(/product/\d+)", link).group(1)
    obs, *_ = shop.step(f'goto("{href}")')
    obs, *_ = shop.step(f'click("{ref_in(obs, "Add to cart")}")')
    _, reward, terminated, _, info = _checkout(shop, obs)
    assert terminated and not info["outcome"]["success"] and reward <= 0.5


def test_web_internal_urls_and_url_edits_reach_no_success(shop, shop_tasks) -> None:
    task = shop_tasks[1]
    shop.reset(options={"task": task})
    pid = task.metadata["product_id"]
    for url in ("/order/1", "/order/0", "/admin", "/success", "/api/goal", "/debug", "/checkout", "/../order/1",
                "/order/1?status=placed", f"/cart/add?product_id={pid}&price=0", "/checkout?confirm=1",
                "http://127.0.0.1:8000/order/1", "javascript:alert(1)", "file:///etc/passwd"):
        obs, reward, terminated, _, info = shop.step(f'goto("{url}")')
        assert reward == 0 and not terminated, url
    session = shop.unwrapped._app.session(shop.unwrapped._token)
    assert session.orders == [] and session.cart == []
    _, reward, terminated, _, info = shop.step('answer("I reached the order page, so I am done")')
    assert terminated and reward == 0 and info["outcome"] == {"success": False, "score": 0.0, "end_reason": "answered"}


def test_web_goal_is_not_in_the_page_the_info_or_the_task_id(shop, shop_tasks) -> None:
    app = shop.unwrapped._app
    for task in shop_tasks:
        obs, info = shop.reset(options={"task": task})
        pid = str(task.metadata["product_id"])
        visible = obs + json.dumps(info, default=str)
        assert not re.search(rf"\b{pid}\b", visible), task.id
        token = shop.unwrapped._token
        for path in ("/", "/cart", "/checkout"):  # the raw HTML, hidden fields and all
            html = app.handle(Request.from_raw("GET", path, cookie_header=f"{SESSION_COOKIE}={token}")).body
            assert not re.search(rf"\b{pid}\b", html) and "price_upper" not in html and "goal" not in html.lower()


def test_web_going_back_to_buy_again_is_ignored(shop, shop_tasks) -> None:
    task = shop_tasks[2]
    obs = _open_goal_product(shop, task)
    obs, *_ = shop.step(f'click("{ref_in(obs, "Add to cart")}")')  # no option chosen: a poor order
    obs, *_ = shop.step(f'click("{ref_in(obs, "Proceed to checkout")}")')
    place = ref_in(obs, "Place order")
    # Place it and, in the same reply, go back and try again: the episode ends with the first order.
    _, reward, terminated, _, info = shop.step(f'click("{place}") back() back() click("{place}")')
    assert terminated and not info["outcome"]["success"] and info["outcome"]["score"] == reward < 1
    assert len(info["turn"]["calls"]) == 1
    with pytest.raises(AgentGymError, match="episode is over"):
        shop.step('back()')


def test_web_forged_form_parameters_change_nothing(shop, shop_tasks) -> None:
    task = shop_tasks[3]
    goal = Goal.from_task(task)
    obs = _open_goal_product(shop, task)
    # The action space cannot forge a POST: a GET to the form's target is not found, a made-up option is refused.
    obs, *_ = shop.step(f'goto("/cart/add?product_id={goal.product_id}&price=0.01")')
    assert "Page not found" in obs
    obs = _open_goal_product(shop, task)
    combo = ref_in(obs, f'combobox "{next(iter(goal.options)).capitalize()}"')
    obs, _, _, _, info = shop.step(f'select("{combo}", "free")')
    assert info["turn"]["kind"] == "invalid"
    # A client that could forge the form: price, bogus values and values put under another option kind.
    app = ShopApp()
    token = app.new_session(goal)
    kinds = list(goal.options)
    swapped = {kinds[0]: goal.options[kinds[-1]], kinds[-1]: goal.options[kinds[0]]} if len(kinds) > 1 else {}
    for form in ({"price": "0.01", **dict.fromkeys(kinds, "999-pack")}, swapped,
                 {"product_id": "0", **goal.options}, {"product_id": "-1", **goal.options}):
        body = "&".join(f"{k}={v}" for k, v in {"product_id": goal.product_id, **form}.items())
        app.handle(Request.from_raw("POST", "/cart/add", body.encode(), f"{SESSION_COOKIE}={token}"))
        app.handle(Request.from_raw("POST", "/checkout", b"", f"{SESSION_COOKIE}={token}"))
        session = app.session(token)
        if session.orders:
            order = session.orders[-1]
            assert app.score_order(order, goal)[0] < 1.0, form
            assert all(line.price == load_catalogue().get(line.product_id).price(dict(line.choice))
                       for line in order.lines)
    forged = Request.from_raw("POST", "/checkout", b"", f"{SESSION_COOKIE}={'0' * 32}")
    assert app.handle(forged).status == 403  # another session's token cannot be guessed into
    app.end_session(token)
