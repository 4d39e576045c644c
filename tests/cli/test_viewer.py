"""The trajectory viewer (``agentgym view RUN --serve`` and its static export, report.html) in headless Chromium:
settings and summary as a reader reads them, filters and search, an episode as a chat with its image, the token
view, two episodes side by side, learning curves; layout checked by element boxes, model text never run as markup."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentgym.cli import main
from agentgym.storage import TrajectoryWriter
from agentgym.trajectory import Trajectory, Turn
from agentgym.utils.images import ImageRef
from agentgym.viewer.formatting import format_value
from agentgym.viewer.run import load_run
from agentgym.trainers.rollout_saver import RolloutSaver, StepTokens
from tests.helpers.browsers import needs_browser

XSS = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"
VOCAB = ["<s>", "What", " is", " 2+2", "?", "\n", "answer", "(", "4", ")", "5", " calc"]
WIDE = (1280, 900)


class _Vocab:
    """Decodes the few ids of these hand-made trajectories (a trainer passes its tokenizer)."""

    def decode(self, ids: list[int]) -> str:
        return VOCAB[ids[0]]


def _episode(task: str, seed: int, success: bool, *, reason: str, action: str, image: bool = False,
             observation: str = "What is 2+2?") -> Trajectory:
    pixels = np.zeros((12, 16, 3), dtype=np.uint8)
    pixels[:, : seed % 16] = 255
    turn = Turn(observation, action, reward=1.0 if success else 0.0,
                info={"kind": "answer", "calls": [{"name": "answer", "arguments": {}, "args": [4 if success else 5]}]},
                prompt_token_ids=(0, 1, 2, 3, 4, 5), action_token_ids=(6, 7, 8 if success else 10, 9),
                action_logprobs=(-0.1, -0.2, -0.05 if success else -4.5, -0.3),
                images=(ImageRef.from_array(pixels),) if image else ())
    return Trajectory(env_id="agentgym/Calculator-v0", task_id=task, seed=seed, turns=(turn,), end_reason=reason,
                      outcome={"success": success, "score": 1.0 if success else 0.0}, traj_id=f"{task}-{seed}",
                      group_id=f"g/{task}", policy="grpo",
                      metadata={"final_observation": "Correct!" if success else "Wrong."})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run as a trainer with save_rollouts: 1 leaves it: settings, summary, metrics, two saved steps."""
    out = tmp_path_factory.mktemp("viewer") / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({
        "trainer": "grpo", "model": "tiny:games-calc", "suite": "games-calc", "steps": 2, "group_size": 2,
        "learning_rate": 0.0003, "system_prompt": None, "env_kwargs": {}, "loggers": []}))
    (out / "summary.json").write_text(json.dumps({
        "eval_after": {"episodes": 4, "success_rate": 0.75, "mean_action_tokens": None,
                       "mean_episode_s": 3.5978426997899895, "policy": "grpo", "end_reasons": {"answered": 3, "max_turns": 1}},
        "episodes": 8, "config": {"steps": 2}}))
    with (out / "metrics.jsonl").open("w") as fh:
        for step in range(4):
            fh.write(json.dumps({"step": step, "train/success_rate": step / 4, "train/loss": 1.0 / (step + 1),
                                 "eval/success_rate": 0.5 + step / 10}) + "\n")
    saver = RolloutSaver(out, 1, tokenizer=_Vocab())
    steps = {1: [_episode("calc-1", 1, False, reason="failed", action=XSS, image=True),
                 _episode("calc-1", 2, True, reason="answered", action="answer(4)"),
                 _episode("calc-2", 3, False, reason="max_turns", action="calc(2+3)")],
             2: [_episode("calc-1", 4, True, reason="answered", action="answer(4)"),
                 _episode("calc-2", 5, True, reason="answered", action="answer(4) with a needle")]}
    for step, trajectories in steps.items():
        # the update's loss mask (the first episode of step 1 was masked out) and advantages per token
        masks = [[0.0] * 6 + [1.0] * 4 for _ in trajectories]
        masks[0] = [0.0] * 10 if step == 1 else masks[0]
        advantages = [[1.0 if t.success else -1.0] * 10 for t in trajectories]
        assert saver.save(step, trajectories, StepTokens(list(range(len(trajectories))), masks, advantages))
    return out


# ---- without a browser ---------------------------------------------------------------------------------
def test_values_read_as_numbers_and_words() -> None:
    assert format_value(3.5978426997899895) == "3.6" and format_value(0.27412) == "0.274"
    assert format_value(None) == "n/a" and format_value("reference") == "reference"
    assert format_value({"answered": 3}) == "answered=3" and format_value(True) == "yes"


def test_the_eval_table_title_does_not_wrap_mid_word() -> None:
    from rich.console import Console

    from agentgym.cli.report import render_summary_table

    console = Console(width=100, record=True)
    title = "games-calc [test] with hf:runs/grpo-calc/model"
    console.print(render_summary_table({"episodes": 3, "success_rate": 1.0}, title=title))
    assert title in console.export_text()


def test_saved_rollouts_load_with_their_steps_and_tokens(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.kind == "train" and [e.train_step for e in run.episodes] == [1, 1, 1, 2, 2]
    assert all(e.tokens is not None for e in run.episodes)
    assert run.episodes[0].tokens["mask"] == [[0, 10]] and run.episodes[1].tokens["advantage"] == [[1, 10]]
    assert run.episodes[0].tokens["tokens"][:3] == ["<s>", "What", " is"]
    assert len(run.metrics) == 4 and run.settings["trainer"] == "grpo"
    assert (run_dir / "rollouts" / "images").is_dir(), "images beside the step files, as eval keeps them"


def test_the_page_shows_formatted_values_and_escapes_text(run_dir: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    assert main(["view", str(run_dir), "--html", str(report)]) == 0
    page = report.read_text(encoding="utf-8")
    shown = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # what the page shows, not its data and code
    for raw in ("3.5978426997899895", "null", '"grpo"', "{'", "None"):
        assert raw not in shown, raw
    assert "3.6" in shown and "n/a" in shown and "answered=3, max_turns=1" in shown
    assert "<script>window.__pwned" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.__pwned" in page
    data = page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and json.loads(data)["episodes"][0]["task"] == "calc-1"
    assert (tmp_path / "images").is_dir() and len(re.findall(r"<img src='images/[0-9a-f]{64}\.png'", page)) == 1


def test_an_export_of_a_run_with_a_missing_image_still_opens(run_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for png in (copy / "rollouts" / "images").iterdir():
        png.unlink()
    assert main(["view", str(copy), "--html", str(tmp_path / "out" / "r.html")]) == 0
    assert "1 image(s) could not be read" in (tmp_path / "out" / "r.html").read_text()


def test_view_of_a_run_directory_lists_episodes_and_a_bad_one_gets_the_fix(run_dir: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("rollouts/step-00000") == 5 and "--serve" in out
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 2
    assert "save_rollouts" in capsys.readouterr().err


def test_the_server_binds_loopback_rereads_the_run_and_serves_only_its_images(run_dir: Path, tmp_path: Path) -> None:
    import shutil

    from agentgym.viewer.server import serve

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    server = serve(copy, port=0)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        page = urllib.request.urlopen(server.url, timeout=10).read().decode()
        assert page.count("<article class='episode") == 5
        [src] = re.findall(r"<img src='(images/[0-9a-f]{64}\.png)'", page)
        png = urllib.request.urlopen(server.url + src, timeout=10)
        assert png.headers["Content-Type"] == "image/png" and png.read().startswith(b"\x89PNG")
        for bad in ("images/" + "0" * 64 + ".png", "../config.json", "rollouts/step-000001.jsonl"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(server.url + bad, timeout=10)
            assert err.value.code == 404
        with TrajectoryWriter(copy / "rollouts" / "step-000003.jsonl") as writer:  # a run still training
            writer.write(_episode("calc-3", 9, True, reason="answered", action="answer(4)"))
        assert urllib.request.urlopen(server.url, timeout=10).read().decode().count("<article class='episode") == 6
    finally:
        server.close()


def test_the_server_refuses_requests_for_other_host_names(run_dir: Path) -> None:
    """DNS rebinding: a page on evil.example points its name at 127.0.0.1; its requests say Host: evil.example."""
    import http.client

    from agentgym.viewer.server import serve

    server = serve(run_dir, port=0)
    try:
        port = server.httpd.server_address[1]
        for host, status in ((f"evil.example:{port}", 403), (f"127.0.0.1.evil.example:{port}", 403),
                             (f"localhost:{port}", 200), (f"127.0.0.1:{port}", 200)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.putrequest("GET", "/", skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            response = conn.getresponse()
            body = response.read()
            assert response.status == status, host
            assert (b"calc-1" in body) == (status == 200)
            conn.close()
    finally:
        server.close()


def test_token_records_of_the_wrong_shape_are_left_out_with_a_note(run_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    sidecar = copy / "rollouts" / "step-000002.tokens.jsonl"
    good, other = sidecar.read_text().splitlines()
    bad = json.loads(other)
    bad["mask"] = [["x", 3]]
    sidecar.write_text("\n".join([good, json.dumps(bad), '{"traj_id": "calc-2-5", "tokens": "abc"}']) + "\n")
    run = load_run(copy)
    step2 = [e for e in run.episodes if e.train_step == 2]
    assert step2[0].tokens is not None and step2[1].tokens is None
    assert any("2 line(s) are not token records" in note for note in run.notes)


def test_cli_serve_prints_the_url(run_dir: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "agentgym.cli", "view", str(run_dir), "--serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        assert "calc-2" in urllib.request.urlopen(url.group(0), timeout=10).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "agentgym.cli", "view", str(run_dir), "--serve", "--port",
                                 str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--port" in result.stderr and "Traceback" not in result.stderr


# ---- in Chromium -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    from agentgym.tools.browser.config import find_chromium

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": WIDE[0], "height": WIDE[1]})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type in ("error", "warning") else None)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    return page, problems


def _box(page: Any, selector: str) -> dict[str, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not laid out"
    return box


def _check_app(page: Any, shots: Path, name: str) -> None:
    """Everything a reader does, with the layout each step must have."""
    rows = page.locator("#episode-list .ep-row")
    assert rows.count() == 5 and "5 of 5" in page.inner_text("#shown-count")
    # overview, curves and browser: title on one line, sidebar left of the episode pane, curves of the metrics
    title, sidebar, pane = _box(page, "#title"), _box(page, "#sidebar"), _box(page, "#pane")
    assert title["height"] < 40, "the title wraps"
    assert sidebar["x"] + sidebar["width"] <= pane["x"] and abs(sidebar["y"] - pane["y"]) < 4
    assert 300 <= sidebar["width"] <= 360 and pane["width"] >= 800
    curves = page.locator("figure.curve")
    assert curves.count() == 3 and page.locator("figure.curve polyline").count() == 3
    assert [page.locator("figure.curve").nth(i).get_attribute("data-metric") for i in range(3)][:2] == \
        ["eval/success_rate", "train/success_rate"]
    first = _box(page, "figure.curve svg")
    assert (round(first["width"]), round(first["height"])) == (300, 150)
    summary = page.inner_text("#summary")
    assert "3.6" in summary and "n/a" in summary and "null" not in summary and "config" not in summary
    page.screenshot(path=str(shots / f"{name}-overview.png"), full_page=True)

    # one episode: a chat with the task, the action and its parsed call, the image inline, the text as text
    rows.nth(0).click()
    chat = page.locator("#pane-body .col .episode")
    assert chat.count() == 1 and "calc-1" in chat.inner_text()
    assert "<script>window.__pwned = 1</script>" in chat.locator(".msg.agent pre").inner_text()
    assert page.evaluate("window.__pwned") is None, "model text ran as markup"
    assert "answer(5)" in chat.locator(".call").first.inner_text()
    image = page.locator("#pane-body img").first
    assert page.evaluate("(img) => img.complete && img.naturalWidth", image.element_handle()) == 16
    env_msg, agent_msg = _box(page, "#pane-body .msg.env"), _box(page, "#pane-body .msg.agent")
    assert agent_msg["y"] > env_msg["y"] and agent_msg["x"] > env_msg["x"], "the agent speaks after, on the right"
    page.screenshot(path=str(shots / f"{name}-chat.png"), full_page=True)

    # filters: failures only, then a search; the selection follows what is shown
    page.check("#failed-only")
    assert rows.count() == 2 and page.locator("#episode-list .ep-row.ok").count() == 0
    page.uncheck("#failed-only")
    page.select_option("#filter-step", "2")
    assert rows.count() == 2
    page.select_option("#filter-step", "")
    page.fill("#search", "needle")
    assert rows.count() == 1 and "calc-2" in page.inner_text("#pane-body")
    page.fill("#search", "")
    page.select_option("#filter-reason", "max_turns")
    assert rows.count() == 1
    page.select_option("#filter-reason", "")
    assert rows.count() == 5

    # the token view: one span per token, trained tokens coloured apart from the rest, colour modes switch
    rows.nth(1).click()
    page.click("#pane-toolbar button[data-view=tokens]")
    tokens = page.locator("#pane-body .tok")
    assert tokens.count() == 10 and page.locator("#pane-body .tok[data-mask='1']").count() == 4
    colour = lambda i: tokens.nth(i).evaluate("(s) => getComputedStyle(s).backgroundColor")  # noqa: E731
    assert colour(0) != colour(9)
    page.select_option("#token-colour", "advantage")
    assert "46, 160, 67" in colour(9), "a positive advantage is green"
    page.screenshot(path=str(shots / f"{name}-tokens.png"), full_page=True)

    # side by side: the other episodes of the same task, in two equal columns next to each other
    options = page.locator("#compare-with option")
    assert options.count() == 3  # nothing, and the two other episodes of calc-1
    page.select_option("#compare-with", index=1)
    cols = page.locator("#pane-body .col")
    assert cols.count() == 2
    left, right = cols.nth(0).bounding_box(), cols.nth(1).bounding_box()
    assert left and right and abs(left["y"] - right["y"]) < 2 and abs(left["width"] - right["width"]) < 2
    assert left["x"] + left["width"] <= right["x"] and left["width"] >= 380
    page.click("#pane-toolbar button[data-view=chat]")
    assert page.locator("#pane-body .col .episode").count() == 2
    page.screenshot(path=str(shots / f"{name}-compare.png"), full_page=True)


@needs_browser
def test_the_served_app_in_chromium(run_dir: Path, browser: Any, tmp_path: Path) -> None:
    from agentgym.viewer.server import serve

    server = serve(run_dir, port=0)
    try:
        page, problems = _open(browser, server.url)
        _check_app(page, tmp_path, "served")
        assert problems == []
        page.close()
    finally:
        server.close()


@needs_browser
def test_the_static_export_is_the_same_app(run_dir: Path, browser: Any, tmp_path: Path) -> None:
    report = tmp_path / "export" / "report.html"
    assert main(["view", str(run_dir), "--html", str(report)]) == 0
    page, problems = _open(browser, report.as_uri())
    _check_app(page, tmp_path, "static")
    assert problems == []
    page.close()


@needs_browser
def test_an_eval_report_opens_in_chromium(tmp_path: Path, browser: Any) -> None:
    out = tmp_path / "eval"
    # a process of its own: Playwright's sync API keeps an event loop running in this one
    result = subprocess.run([sys.executable, "-m", "agentgym.cli", "eval", "--suite", "games-calc", "--policy",
                             "reference", "--limit", "3", "--out", str(out), "--no-progress"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page, problems = _open(browser, (out / "report.html").as_uri())
    assert page.locator("#episode-list .ep-row").count() == 3 and problems == []
    settings = page.inner_text("#settings")
    assert "suite" in settings and "games-calc" in settings
    assert page.locator("#pane-body .msg.env.final").count() == 1
    page.click("#pane-toolbar button[data-view=tokens]")
    assert "No token data" in page.inner_text("#pane-body")
    page.close()


def _segmented_run(out: Path) -> Path:
    """A saved step with one episode in two segments (its history was rewritten after the first turn)."""
    turns = (Turn("What is 2+2?", "calc(2+2)", info={"kind": "tool_call"}, prompt_token_ids=(0, 1, 2, 3, 4),
                  action_token_ids=(11, 3), action_logprobs=(-0.1, -0.2)),
             Turn("4", "answer(4)", reward=1.0, info={"kind": "answer"}, prompt_token_ids=(0, 1, 5),
                  action_token_ids=(6, 7, 8, 9), action_logprobs=(-0.1, -0.2, -0.3, -0.4), segment_index=1))
    episode = Trajectory(env_id="agentgym/Calculator-v0", task_id="calc-1", seed=1, turns=turns, end_reason="answered",
                         outcome={"success": True, "score": 1.0}, traj_id="calc-1-1", policy="grpo")
    masks = [[0.0] * 5 + [1.0] * 2, [0.0] * 3 + [1.0] * 4]
    advantages = [[1.0] * 7, [1.0] * 7]
    assert RolloutSaver(out, 1, tokenizer=_Vocab()).save(1, [episode], StepTokens([0, 0], masks, advantages))
    return out


def test_a_segmented_episode_loads_with_its_segments(tmp_path: Path) -> None:
    run = load_run(_segmented_run(tmp_path / "run"))
    [episode] = run.episodes
    assert episode.tokens is not None and episode.tokens["segments"] == [7, 7] and len(episode.tokens["tokens"]) == 14
    sidecar = tmp_path / "run" / "rollouts" / "step-000001.tokens.jsonl"
    record = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**record, "segments": [7, "7"]}) + "\n")  # lengths that are not token counts
    run = load_run(tmp_path / "run")
    assert run.episodes[0].tokens is None and any("not token records" in note for note in run.notes)


@needs_browser
def test_the_token_view_marks_where_each_segment_starts(tmp_path: Path, browser: Any) -> None:
    report = tmp_path / "report.html"
    assert main(["view", str(_segmented_run(tmp_path / "run")), "--html", str(report)]) == 0
    page, problems = _open(browser, report.as_uri())
    page.locator("#episode-list .ep-row").nth(0).click()
    page.click("#pane-toolbar button[data-view=tokens]")
    assert page.locator("#pane-body .tok").count() == 14 and page.locator("#pane-body .tok[data-mask='1']").count() == 6
    breaks = page.locator("#pane-body .seg-break")
    assert breaks.count() == 1 and "segment 2 of 2" in breaks.inner_text()
    assert problems == []
    page.close()
