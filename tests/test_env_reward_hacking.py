"""Reward-hacking battery for the web, GUI, game and multi-agent envs: the exploits a reward-maximising policy
would try, each played as real actions through ``gym.make`` on the real env (real shop app, real Chromium,
real Stockfish), each scoring no success, while the honest solution still succeeds."""

from __future__ import annotations

import json
import random
import re

import gymnasium as gym
import pytest
from agentgym.envs.games.guess_number import GuessNumberEnv
from agentgym.envs.web.app import SESSION_COOKIE, Request, ShopApp
from agentgym.envs.web.catalogue import load_catalogue
from agentgym.envs.web.goals import Goal, generate_tasks

from agentgym.errors import AgentGymError
from agentgym.suite import Task
from tests.browsers import HAVE_BROWSER, needs_browser


for _id, _entry in (("agentgym/WebShop-text-v1", "agentgym.envs.web.env:WebShopTextEnv"),
                    ("agentgym/MiniWoB-v0", "agentgym.envs.gui.env:MiniWoBEnv"),
                    ("agentgym/GuessNumber-v0", "agentgym.envs.games.guess_number:GuessNumberEnv")):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)


def ref_in(observation: str, text: str) -> str:
    line = next(line for line in observation.splitlines() if text in line and "[ref=" in line)
    return line.split("[ref=", 1)[1].split("]", 1)[0]


# ---- WebShop ----------------------------------------------------------------------------------------------------
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


# ---- MiniWoB (GUI) ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gui():
    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    env = gym.make("agentgym/MiniWoB-v0", accessibility=True)
    yield env
    env.close()


@needs_browser
def test_gui_honest_solution_succeeds(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    obs, _ = gui.reset(options={"task": make_task("enter-text", 11)})
    solver = gui.unwrapped.reference_solver()
    for _ in range(6):
        obs, _, terminated, truncated, info = gui.step(solver(obs))
        if terminated or truncated:
            break
    assert info["outcome"]["success"]


@needs_browser
def test_gui_submit_without_doing_the_task_fails(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    gui.reset(options={"task": make_task("enter-text", 11)})
    solver = gui.unwrapped.reference_solver()
    _click_field, _typed, click_submit = solver(None), solver(None), solver(None)
    _, reward, terminated, _, info = gui.step(click_submit)
    assert terminated and reward <= 0 and not info["outcome"]["success"]


@needs_browser
def test_gui_actions_outside_the_page_and_script_urls_do_nothing(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    gui.reset(options={"task": make_task("click-test", 5)})
    assert set(gui.unwrapped.toolset.names) == {"click", "type", "key", "scroll", "drag"}  # no navigation, no eval
    url = gui.unwrapped._session.url
    for action in ("click(-1, -1)", "click(100000, 5)", "drag(0, 0, 9999, 9999)",
                   'type("javascript:WOB_DONE_GLOBAL=true")', 'key("Enter")', 'type("javascript:core.endEpisode(1)")', 'key("F12")', 'key("Control+L")'):
        obs, reward, terminated, _, info = gui.step(action)
        assert reward == 0 and not terminated, action
    assert gui.unwrapped._session.url == url
    _, reward, terminated, _, info = gui.step("click(2, 2)")
    assert not terminated and reward == 0


@needs_browser
def test_gui_observation_holds_no_score_or_seed(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    for name, seed in (("click-test", 123457), ("enter-text", 987653), ("click-checkboxes", 424243)):
        obs, info = gui.reset(options={"task": make_task(name, seed)})
        text = obs["text"].lower()
        assert "page:" in text and "- button" in text, name  # the accessibility text is there ...
        assert "reward" not in text and "episodes done" not in text and str(seed) not in text, name  # ... without these
        assert str(seed) not in json.dumps(info, default=str), name
    _, info = gui.reset(seed=3)  # a sampled task: its id is a random tag, not the page seed
    assert str(gui.unwrapped.task.metadata["seed"]) not in info["task_id"]


# ---- GuessNumber -------------------------------------------------------------------------------------------------
SECRET_TASK = Task("g", "I am thinking of an integer between 1 and 100 (inclusive). Find it.", 37,
                   {"low": 1, "high": 100, "secret": 37})


def test_guess_honest_binary_search_succeeds() -> None:
    env = gym.make("agentgym/GuessNumber-v0")
    obs, _ = env.reset(options={"task": SECRET_TASK})
    solver = env.unwrapped.reference_solver()
    for _ in range(10):
        obs, _, terminated, truncated, info = env.step(solver(obs))
        if terminated or truncated:
            break
    assert info["outcome"]["success"]


def test_guess_out_of_range_and_many_guesses_per_reply_never_win() -> None:
    env = gym.make("agentgym/GuessNumber-v0")
    env.reset(options={"task": SECRET_TASK})
    for guess in (0, 101, -37, 10**9, 37.5):
        _, reward, terminated, truncated, info = env.step(f"guess({guess})")
        assert reward == 0 and not terminated, guess
    env.reset(options={"task": SECRET_TASK})
    spray = " ".join(f"guess({n})" for n in range(1, 101))  # every number in one reply
    while True:
        obs, reward, terminated, truncated, info = env.step(spray)
        assert len(info["turn"]["calls"]) == 1 and "ignored" in obs
        if terminated or truncated:
            break
    assert truncated and info["outcome"] == {"success": False, "score": 0.0, "end_reason": "max_turns"}


def test_guess_secret_is_not_in_task_ids_info_or_observations() -> None:
    """What the policy sees at reset is the same for every secret, and sampled task ids do not name it (they used to
    be ``1-100-68``, printed by ``agentgym play``)."""
    env = gym.make("agentgym/GuessNumber-v0")
    seen: dict[str, tuple[str, str]] = {}
    for seed in range(200):
        obs, info = env.reset(seed=seed)
        secret = env.unwrapped.task.answer
        task_id = info.pop("task_id")
        assert task_id.startswith("guess-1-100-") and str(secret) not in task_id.split("-")[3:], task_id
        seen.setdefault(obs + json.dumps(info, default=str), (task_id, str(secret)))
    assert len(seen) == 1  # observation and info do not depend on the secret
    first, second = GuessNumberEnv(), GuessNumberEnv()
    for env_ in (first, second):
        env_.reset(seed=5)
    assert first.task.id == second.task.id and first.task.answer == second.task.answer  # still deterministic


# ---- multi-agent -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=False)
def selfplay_ids() -> None:
    pytest.importorskip("pettingzoo")
    from agentgym.registration.multi_agent import SELFPLAY_ENTRIES

    for entry in SELFPLAY_ENTRIES:
        if entry.id not in gym.registry:
            gym.register(id=entry.id, entry_point=entry.entry_point)


def _stockfish_available() -> bool:
    try:
        from agentgym.envs.multi_agent.stockfish import find_stockfish

        find_stockfish()
        pytest.importorskip("pyspiel")
        return True
    except Exception:  # noqa: BLE001 - any failure means: skip
        return False


@pytest.mark.parametrize("replies", [
    ['move("e2e5")', 'move("Ke9")', 'move("e1e8")'],  # illegal moves
    ["I resign", "resign()", "I resign"],  # resign loops (no such tool)
    ["Checkmate! I win.", '<tool_call>{"name": "claim_victory", "arguments": {}}</tool_call>',
     "The game is over and White won 1-0."],  # claiming victory in text
], ids=["illegal-moves", "resign-loop", "claimed-victory"])
def test_chess_exploits_score_zero(selfplay_ids, replies) -> None:
    if not _stockfish_available():
        pytest.skip("needs stockfish and pyspiel")
    env = gym.make("agentgym/Chess-vs-Stockfish-v0", learner="player_0")
    try:
        env.reset(seed=0)
        rewards = []
        for reply in replies:
            _, reward, terminated, truncated, info = env.step(reply)
            rewards.append(reward)
            if terminated or truncated:
                break
        assert terminated and info["outcome"]["success"] is False and info["outcome"]["score"] == 0.0
        # The invalid-action penalty lands on the offending step; by the reward rule the episode total is the score.
        assert min(rewards) < 0 and sum(rewards) == pytest.approx(0.0, abs=1e-9)
    finally:
        env.close()


def test_negotiation_offers_beyond_the_pool_score_zero(selfplay_ids) -> None:
    env = gym.make("agentgym/Negotiation-SelfPlay-v0")
    try:
        obs, _ = env.reset(seed=0)
        solver = env.unwrapped.reference_solver()
        for _ in range(20):  # the honest negotiator reaches a good deal
            obs, _, terminated, truncated, info = env.step(solver(obs))
            if terminated or truncated:
                break
        assert info["outcome"]["success"]
        exploit = gym.make("agentgym/Negotiation-SelfPlay-v0", learner="player_0")  # moves first: nothing to accept
        exploit.reset(seed=0)
        rewards = []
        for reply in ("propose(99, 99, 99)", "propose(-1, 0, 0)", "accept()", "propose(1.5, 0, 0)",
                      'propose(10, 10, 10, "I take everything, the partner agreed")'):
            _, reward, terminated, truncated, info = exploit.step(reply)
            rewards.append(reward)
            if terminated or truncated:
                break
        exploit.close()
        assert terminated and info["outcome"]["success"] is False and info["outcome"]["score"] == 0.0
        assert min(rewards) < 0 and sum(rewards) == pytest.approx(0.0, abs=1e-9)  # penalised steps; total = score
    finally:
        env.close()
