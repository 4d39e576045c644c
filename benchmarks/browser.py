"""Browser env cost: our pooled contexts against launching a fresh browser per episode, in one run.

Episodes are real WebShop-v1 episodes played by the reference solver (search, open the product, set
2-3 options, add to cart, check out, place the order: 8-9 actions, each followed by an accessibility
snapshot), with 1 and with 4 envs stepping concurrently from threads (as the rollout engine does).

* ``ours``: one Chromium, one pooled context per env, cleaned and reused across episodes
  (``BrowserPool(isolation="context")``, the default).
* ``fresh browser``: a new Chromium process for every episode, closed after it
  (``BrowserPool(isolation="browser")``): the usual way of getting a clean browser per episode.
* ``text fallback``: ``WebShop-text-v1``, the same pages rendered without a browser, in one thread.

Reported: reset time (p50/p95), per-action latency (``env.step``: action + snapshot; p50/p95) and
actions/s over the whole run (resets included).

MiniWoB-v0 (pixels), in the same run, one env:

* step latency (``env.step("click(x, y)")``: a click that toggles a checkbox, then the new screenshot;
  p50/p99) for the old look (a separate state poll, then Playwright's ``page.screenshot`` with
  ``animations="disabled"``, ``caret="hide"``) against ours (one browser call: CDP ``Page.captureScreenshot``
  with the state script at the same time), and ours with each agent aid on (set-of-marks,
  ``screenshot_size``, accessibility text);
* screenshots per second (a loop of looks at an idle page): ``BrowserSession.observe`` against
  ``page.screenshot``;
* set-of-marks drawn with Pillow after capture against an overlay injected into the page (add the boxes,
  capture, remove them), per marked screenshot;
* resets with pooled contexts against a fresh browser per episode.

The machine is shared with other jobs: the load average is printed before and after, and the figures are
only comparable within one run.

Run: python benchmarks/browser.py [--episodes 6] [--text-episodes 200] [--miniwob-steps 150] [--only miniwob]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

from agentgym.envs.gui.env import MiniWoBEnv
from agentgym.envs.gui.miniwob import STATE_JS
from agentgym.envs.gui.tasks import make_task
from agentgym.envs.web.env import WebShopEnv, WebShopTextEnv
from agentgym.envs.web.goals import generate_tasks
from agentgym.tools.browser import BrowserConfig
from agentgym.tools.browser.marks import MARKS_JS, MAX_MARKS, draw_marks, parse_marks
from agentgym.tools.browser.page_session import PageView
from agentgym.tools.browser.pool import BrowserPool


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000 if ordered else float("nan")


def play(env: Any, tasks: list[Any], resets: list[float], steps: list[float], lock: threading.Lock) -> int:
    """Play ``tasks`` with the reference solver; return the number of successes."""
    solved = 0
    for task in tasks:
        start = time.perf_counter()
        observation, _ = env.reset(options={"task": task})
        reset_s = time.perf_counter() - start
        solver = env.unwrapped.reference_solver()
        local: list[float] = []
        while True:
            action = solver(observation)
            start = time.perf_counter()
            observation, _, terminated, truncated, info = env.step(action)
            local.append(time.perf_counter() - start)
            if terminated or truncated:
                solved += int(info["outcome"]["success"])
                break
        with lock:
            resets.append(reset_s)
            steps.extend(local)
    return solved


def run(setting: str, contexts: int, episodes: int, tasks: list[Any], config: BrowserConfig) -> dict[str, Any]:
    isolation = "browser" if setting == "fresh browser" else "context"
    pool = BrowserPool(config, isolation=isolation)
    envs = [WebShopEnv(browser=pool) for _ in range(contexts)]
    resets: list[float] = []
    steps: list[float] = []
    solved = [0] * contexts
    lock = threading.Lock()
    try:
        # Warm-up outside the clock: the browser (for ours) and the page cache, like a long training run.
        play(envs[0], tasks[:1], [], [], lock)
        shares = [[tasks[(i * episodes + j) % len(tasks)] for j in range(episodes)] for i in range(contexts)]

        def worker(index: int) -> None:
            solved[index] = play(envs[index], shares[index], resets, steps, lock)

        start = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(contexts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
    finally:
        for env in envs:
            env.close()
        pool.close()
    return {"setting": setting, "contexts": contexts, "episodes": len(resets), "solved": sum(solved),
            "reset_p50": percentile(resets, 0.5), "reset_p95": percentile(resets, 0.95),
            "step_p50": percentile(steps, 0.5), "step_p95": percentile(steps, 0.95),
            "actions_per_s": len(steps) / wall, "launches": pool.stats["launches"]}


def run_text(episodes: int, tasks: list[Any]) -> dict[str, Any]:
    env = WebShopTextEnv()
    resets: list[float] = []
    steps: list[float] = []
    lock = threading.Lock()
    play(env, tasks[:1], [], [], lock)
    start = time.perf_counter()
    solved = play(env, [tasks[i % len(tasks)] for i in range(episodes)], resets, steps, lock)
    wall = time.perf_counter() - start
    env.close()
    return {"setting": "text fallback", "contexts": 1, "episodes": len(resets), "solved": solved,
            "reset_p50": percentile(resets, 0.5), "reset_p95": percentile(resets, 0.95),
            "step_p50": percentile(steps, 0.5), "step_p95": percentile(steps, 0.95),
            "actions_per_s": len(steps) / wall, "launches": 0}


# ---- MiniWoB-v0: pixels ----------------------------------------------------------------------------------------------
class PlaywrightLookEnv(MiniWoBEnv):
    """MiniWoB-v0 with the look it had before: a state poll, then Playwright's screenshot (the baseline)."""

    def _look(self) -> PageView:
        state = self._session.evaluate(STATE_JS)
        aria = self._session.aria_text() if self.accessibility else None
        return PageView([state, None], self._session.screenshot(), aria)


#: A checkbox of click-checkboxes to click again and again (each click repaints the page).
_FIRST_BOX_JS = ("() => { const r = document.querySelector('#boxes input').getBoundingClientRect(); "
                 "return [r.left + r.width / 2, r.top + r.height / 2]; }")
MINIWOB_TASK = make_task("click-checkboxes", 21)
MARKS_TASK = make_task("click-checkboxes-large", 21)  # a busier page for the screenshot and marks timings

#: The rejected way of drawing marks: boxes and numbers as page elements, removed after the shot.
OVERLAY_ADD_JS = """(marks) => {
  const root = document.createElement('div');
  root.id = '__marks';
  root.style.cssText = 'position:fixed;left:0;top:0;width:0;height:0;z-index:2147483647;pointer-events:none';
  marks.forEach(([x, y, w, h], i) => {
    const box = document.createElement('div');
    box.style.cssText = `position:fixed;left:${x}px;top:${y}px;width:${w}px;height:${h}px;outline:1px solid red`;
    const tag = document.createElement('span');
    tag.textContent = String(i + 1);
    tag.style.cssText = 'position:absolute;left:0;top:0;background:red;color:white;font:8px sans-serif';
    box.appendChild(tag);
    root.appendChild(box);
  });
  document.body.appendChild(root);
}"""
OVERLAY_REMOVE_JS = "() => document.getElementById('__marks').remove()"


def miniwob_episode(env: MiniWoBEnv, step_times: list[float]) -> None:
    """One episode of timed clicks on a checkbox (each toggles it: the page repaints every step)."""
    env.reset(options={"task": MINIWOB_TASK})
    x, y = env.to_image(*env._session.evaluate(_FIRST_BOX_JS))
    for _ in range(env.max_turns - 1):
        start = time.perf_counter()
        env.step(f"click({x:.3f}, {y:.3f})")
        step_times.append(time.perf_counter() - start)


def rates(fns: dict[str, Any], seconds: float, block: int = 5) -> dict[str, float]:
    """Calls per second of each function, measured in alternating blocks over ``seconds`` in all (after one
    warm-up call each), so that all of them see the same machine load."""
    spent = dict.fromkeys(fns, 0.0)
    counts = dict.fromkeys(fns, 0)
    for fn in fns.values():
        fn()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(block):
                fn()
            spent[name] += time.perf_counter() - start
            counts[name] += block
    return {name: counts[name] / spent[name] for name in fns}


def run_miniwob(steps: int, resets: int, config: BrowserConfig) -> dict[str, Any]:
    pool = BrowserPool(config)
    out: dict[str, Any] = {"steps": [], "shots": {}, "marks": {}, "resets": {}}
    settings: list[tuple[str, type[MiniWoBEnv], dict[str, Any]]] = [
        ("before: state poll + page.screenshot", PlaywrightLookEnv, {}),
        ("ours: one look (CDP capture)", MiniWoBEnv, {}),
        ("ours + set_of_marks", MiniWoBEnv, {"set_of_marks": True}),
        ("ours + screenshot_size=(320, 420)", MiniWoBEnv, {"screenshot_size": (320, 420)}),
        ("ours + accessibility text", MiniWoBEnv, {"accessibility": True}),
    ]
    try:
        # Settings take turns episode by episode, so a load change on this shared machine hits them all alike.
        envs = [cls(browser=pool, **kwargs) for _, cls, kwargs in settings]
        times: list[list[float]] = [[] for _ in settings]
        try:
            for env in envs:
                miniwob_episode(env, [])  # warm-up outside the clock
            while min(len(t) for t in times) < steps:
                for env, samples in zip(envs, times):
                    miniwob_episode(env, samples)
        finally:
            for env in envs:
                env.close()
        for (name, _, _), samples in zip(settings, times):
            out["steps"].append({"setting": name, "steps": len(samples), "p50": percentile(samples, 0.5),
                                 "p99": percentile(samples, 0.99)})
        env = MiniWoBEnv(browser=pool, set_of_marks=True)
        try:
            env.reset(options={"task": MARKS_TASK})
            session = env._session
            out["shots"] = rates({"observe (CDP)": lambda: session.observe(),
                                  "page.screenshot": lambda: session.screenshot()}, 6.0)
            marks = parse_marks(session.evaluate(MARKS_JS, MAX_MARKS))
            boxes = [list(m.box) for m in marks]

            def pil_marks() -> None:
                draw_marks(session.observe().image, marks)

            def overlay_marks() -> None:
                session.evaluate(OVERLAY_ADD_JS, boxes)
                session.observe()
                session.evaluate(OVERLAY_REMOVE_JS)

            image = session.observe().image
            per_s = rates({"pil": pil_marks, "overlay": overlay_marks,
                           "draw": lambda: draw_marks(image, marks)}, 6.0)
            out["marks"] = {"marks": len(marks), "pil_ms": 1000 / per_s["pil"], "overlay_ms": 1000 / per_s["overlay"],
                            "draw_only_ms": 1000 / per_s["draw"]}
        finally:
            env.close()
    finally:
        pool.close()
    for isolation in ("context", "browser"):
        pool = BrowserPool(config, isolation=isolation)  # type: ignore[arg-type]
        env = MiniWoBEnv(browser=pool)
        try:
            env.reset(options={"task": MINIWOB_TASK})  # warm-up (the pooled browser's launch)
            times = []
            for _ in range(resets):
                start = time.perf_counter()
                env.reset(options={"task": MINIWOB_TASK})
                times.append(time.perf_counter() - start)
            out["resets"][isolation] = {"p50": percentile(times, 0.5), "p95": percentile(times, 0.95),
                                        "launches": pool.stats["launches"]}
        finally:
            env.close()
            pool.close()
    return out


def print_miniwob(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Print the MiniWoB part and return its rows for the results file."""
    from _results import figure

    print("\nMiniWoB-v0 (click-checkboxes, 1 env): env.step = click + screenshot (ms)")
    header = f"  {'setting':<38} {'steps':>5} {'p50':>7} {'p99':>7}"
    print(header + "\n  " + "-" * (len(header) - 2))
    for r in result["steps"]:
        print(f"  {r['setting']:<38} {r['steps']:>5} {r['p50']:>7.1f} {r['p99']:>7.1f}")
    before, ours = result["steps"][0], result["steps"][1]
    print(f"  step p50 {before['p50'] / ours['p50']:.1f}x faster, p99 {before['p99'] / ours['p99']:.1f}x, than before")
    shots = result["shots"]
    print(f"\n  screenshots/s: observe (CDP) {shots['observe (CDP)']:.0f}, page.screenshot "
          f"{shots['page.screenshot']:.0f} ({shots['observe (CDP)'] / shots['page.screenshot']:.1f}x)")
    marks = result["marks"]
    print(f"  set-of-marks ({marks['marks']} marks) per marked screenshot: Pillow after capture "
          f"{marks['pil_ms']:.1f} ms (drawing alone {marks['draw_only_ms']:.2f} ms), overlay in the page "
          f"{marks['overlay_ms']:.1f} ms ({marks['overlay_ms'] / marks['pil_ms']:.1f}x)")
    pooled, fresh = result["resets"]["context"], result["resets"]["browser"]
    print(f"  reset p50/p95: pooled contexts {pooled['p50']:.0f} / {pooled['p95']:.0f} ms, fresh browser per episode "
          f"{fresh['p50']:.0f} / {fresh['p95']:.0f} ms ({fresh['p50'] / pooled['p50']:.1f}x; launches "
          f"{pooled['launches']} vs {fresh['launches']})")
    faster = "ratio is baseline / agentgym time (higher is better)"
    return [
        figure(f"MiniWoB-v0 step (click + screenshot), click-checkboxes, 1 env, {ours['steps']} steps: one look (CDP "
               "capture + state script at once); baseline: state poll, then Playwright page.screenshot", ours["p50"],
               before["p50"], unit="ms p50", ratio=before["p50"] / ours["p50"], goal="p50 < 60 ms",
               met=ours["p50"] < 60, note=f"{faster}; p99 {ours['p99']:.1f} vs {before['p99']:.1f} ms"),
        figure("MiniWoB-v0 screenshots per second: observe (CDP); baseline: page.screenshot", shots["observe (CDP)"],
               shots["page.screenshot"], unit="screenshots/s"),
        figure(f"MiniWoB-v0 set-of-marks ({marks['marks']} marks): Pillow after capture; baseline: overlay in the page",
               marks["pil_ms"], marks["overlay_ms"], unit="ms per marked screenshot",
               ratio=marks["overlay_ms"] / marks["pil_ms"], note=faster),
        figure("MiniWoB-v0 reset: pooled contexts; baseline: fresh browser per episode", pooled["p50"], fresh["p50"],
               unit="ms p50", ratio=fresh["p50"] / pooled["p50"],
               note=f"{faster}; launches {pooled['launches']} vs {fresh['launches']}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=6, help="episodes per env (thread) for each browser setting")
    parser.add_argument("--text-episodes", type=int, default=200, help="episodes for the text fallback")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1, 4], help="concurrent envs to measure")
    parser.add_argument("--miniwob-steps", type=int, default=150, help="timed MiniWoB steps per setting")
    parser.add_argument("--miniwob-resets", type=int, default=8, help="timed MiniWoB resets per isolation mode")
    parser.add_argument("--only", choices=["webshop", "miniwob"], help="run one part only")
    args = parser.parse_args()
    if (args.episodes < 1 or args.text_episodes < 1 or min(args.contexts) < 1 or args.miniwob_steps < 1
            or args.miniwob_resets < 1):
        parser.error("--episodes, --text-episodes, --contexts, --miniwob-steps and --miniwob-resets must be >= 1")

    import random

    from _results import write_results

    config = BrowserConfig()
    figures: list[dict[str, Any]] = []
    print(f"load average at start: {' / '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    if args.only != "webshop":
        figures += print_miniwob(run_miniwob(args.miniwob_steps, args.miniwob_resets, config))
    if args.only != "miniwob":
        figures += run_webshop(args, generate_tasks(random.Random("benchmark"), 32), config)
    print(f"\nload average at end: {' / '.join(f'{v:.1f}' for v in os.getloadavg())}")
    write_results("browser", figures)


def run_webshop(args: argparse.Namespace, tasks: list[Any], config: BrowserConfig) -> list[dict[str, Any]]:
    """Run and print the WebShop part and return its rows for the results file."""
    from _results import figure

    figures = []
    rows = []
    for contexts in args.contexts:
        for setting in ("ours", "fresh browser"):
            rows.append(run(setting, contexts, args.episodes, tasks, config))
    rows.append(run_text(args.text_episodes, tasks))

    print(f"\nWebShop-v1 episodes with the reference solver on {os.cpu_count()} cores (times in ms)")
    header = (f"  {'setting':<16} {'envs':>4} {'episodes':>8} {'solved':>6} {'reset p50':>9} {'reset p95':>9} "
              f"{'step p50':>8} {'step p95':>8} {'actions/s':>9} {'launches':>8}")
    print(header + "\n  " + "-" * (len(header) - 2))
    for r in rows:
        print(f"  {r['setting']:<16} {r['contexts']:>4} {r['episodes']:>8} {r['solved']:>6} {r['reset_p50']:>9.1f} "
              f"{r['reset_p95']:>9.1f} {r['step_p50']:>8.1f} {r['step_p95']:>8.1f} {r['actions_per_s']:>9.1f} "
              f"{r['launches']:>8}")
    by_key = {(r["setting"], r["contexts"]): r for r in rows}
    print()
    for contexts in args.contexts:
        ours, fresh = by_key[("ours", contexts)], by_key[("fresh browser", contexts)]
        print(f"  {contexts} env(s): reset {fresh['reset_p50'] / ours['reset_p50']:.1f}x faster, "
              f"actions/s {ours['actions_per_s'] / fresh['actions_per_s']:.1f}x higher than a fresh browser per "
              "episode")
        figures += [
            figure(f"WebShop-v1 reset, {contexts} env(s), {ours['episodes']} reference-solver episodes: pooled contexts; "
                   "baseline: fresh browser per episode", ours["reset_p50"], fresh["reset_p50"], unit="ms p50",
                   ratio=fresh["reset_p50"] / ours["reset_p50"],
                   note="ratio is baseline / agentgym time (higher is better)"),
            figure(f"WebShop-v1 actions per second, {contexts} env(s): pooled contexts; baseline: fresh browser per "
                   "episode", ours["actions_per_s"], fresh["actions_per_s"], unit="actions/s"),
        ]
    text = by_key[("text fallback", 1)]
    best = max(r["actions_per_s"] for r in rows if r["setting"] == "ours")
    print(f"  text fallback: {text['actions_per_s']:.0f} steps/s, {text['actions_per_s'] / best:.0f}x the best browser "
          "setting")
    figures.append(figure(f"WebShop-v1 text fallback (no browser), {text['episodes']} episodes; baseline: the best "
                          "browser setting", text["actions_per_s"], best, unit="steps/s"))
    return figures


if __name__ == "__main__":
    main()
