"""The browser pool: URL guard (links, redirects, forms, scripts, pop-ups), context reuse, crash recovery.

Every test that visits "another site" uses a canary server on a second 127.0.0.1 port and asserts that it
never received a request, and external hosts under the reserved ``.invalid`` TLD: the guard must refuse
them before any packet leaves the browser.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from agentgym.envs.web.app import Request, Response
from agentgym.envs.web.server import AppServer
from agentgym.tools.browser import (
    ActionError,
    BrowserConfig,
    BrowserCrashed,
    BrowserUnavailable,
    UrlGuard,
)
from agentgym.tools.browser.actions import (
    check_key,
    check_point,
    check_scroll_delta,
    check_text,
)
from agentgym.tools.browser.config import find_chromium
from agentgym.tools.browser.snapshot import (
    normalize_refs,
    yaml_escape_key,
    yaml_escape_value,
)
from tests.helpers.browsers import HAVE_BROWSER, needs_browser


EXTERNAL = "http://example.invalid"


class Site:
    """A tiny app with every way a page can try to leave, plus a canary server counting its hits."""

    def __init__(self) -> None:
        self.canary_hits = 0
        self.canary = AppServer(self._canary)
        self.server = AppServer(self._handle)

    def _canary(self, request: Request) -> Response:
        self.canary_hits += 1
        return Response(200, "<p>canary</p>")

    def _handle(self, request: Request) -> Response:
        canary = self.canary.origin
        if request.path == "/redirect-out":
            return Response(302, "", (("Location", f"{EXTERNAL}/r"),))
        if request.path == "/redirect-local":
            return Response(302, "", (("Location", f"{canary}/r"),))
        if request.path == "/redirect-chain":
            return Response(302, "", (("Location", "/redirect-local"),))
        if request.path == "/redirect-ok":
            return Response(303, "", (("Location", "/two"),))
        if request.path == "/two":
            return Response(200, "<!DOCTYPE html><html><body><h1>Two</h1><p>second page</p></body></html>")
        if request.path == "/slow-script":
            return Response(200, "<html><body><p>busy</p></body></html>")
        body = f"""<!DOCTYPE html><html><head><title>Home</title></head><body>
<h1>Home</h1>
<p><a href="{EXTERNAL}/">external link</a></p>
<p><a href="{canary}/x">other port link</a></p>
<p><a href="/redirect-out">redirect out</a></p>
<p><a href="/redirect-local">redirect to other port</a></p>
<p><a href="/redirect-chain">redirect chain</a></p>
<p><a href="/redirect-ok">redirect ok</a></p>
<form method="post" action="{EXTERNAL}/post"><button type="submit">Post out</button></form>
<button onclick="location.href='{canary}/js'">Script out</button>
<button onclick="window.open('/two')">Pop up</button>
<input type="text" aria-label="Name">
<img src="{EXTERNAL}/pixel.png" alt="pixel"><img src="{canary}/pixel.png" alt="canary pixel">
</body></html>"""
        return Response(200, body, (("Content-Type", "text/html; charset=utf-8"),))

    def close(self) -> None:
        self.server.close()
        self.canary.close()


@pytest.fixture(scope="module")
def site():
    s = Site()
    yield s
    s.close()


@pytest.fixture(scope="module")
def pool():
    from agentgym.tools.browser import BrowserPool

    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    # Generous deadlines: these tests check behaviour, not speed, and make test runs them beside two other
    # busy xdist workers on 2 cores, where a page load or a click has taken more than 5 s. The hung-page
    # test keeps its own short watchdog.
    p = BrowserPool(BrowserConfig(action_timeout_s=20.0, navigation_timeout_s=30.0, watchdog_s=60.0))
    yield p
    p.close()


def ref_of(session, text: str) -> str:
    snapshot = session.snapshot()
    for line in snapshot.text.splitlines():
        if text in line and "[ref=" in line:
            return line.split("[ref=", 1)[1].split("]", 1)[0]
    raise AssertionError(f"{text!r} not in snapshot:\n{snapshot.text}")


# ---- pure helpers -------------------------------------------------------------------------------------
def test_url_guard_allows_only_the_envs_origins():
    guard = UrlGuard(["http://127.0.0.1:4000"])
    assert guard.allows("http://127.0.0.1:4000/cart?x=1")
    for url in ("http://127.0.0.1:4001/", "http://localhost:4000/", "http://127.0.0.2:4000/", f"{EXTERNAL}/",
                "https://127.0.0.1:4000/", "ftp://127.0.0.1:4000/", "javascript:alert(1)", "data:text/html,hi",
                "file:///etc/passwd", "http://127.0.0.1:99999/", "http://user@10.0.0.1/", "about:blank", ""):
        assert not guard.allows(url), url
        assert "127.0.0.1" in guard.refusal(url)
    assert guard.resolve("/cart") == "http://127.0.0.1:4000/cart"
    assert guard.resolve("two", "http://127.0.0.1:4000/a/b") == "http://127.0.0.1:4000/a/two"
    with pytest.raises(Exception, match="127.0.0.1:PORT"):
        UrlGuard(["http://example.com:80"])


def test_refs_lose_the_frame_prefix_and_map_back():
    raw = ('- generic [active] [ref=f3e1]:\n  - link "A" [ref=f3e2] [cursor=pointer]:\n    - /url: /a\n'
           '  - iframe [ref=f3e3]:\n    - button "B" [ref=f4e1]')
    snapshot = normalize_refs(raw)
    assert "[ref=e2]" in snapshot.text and "[ref=f4e1]" in snapshot.text and "f3e" not in snapshot.text
    assert snapshot.resolve("e2") == "f3e2" and snapshot.resolve("[ref=e2]") == "f3e2"
    assert snapshot.resolve("f4e1") == "f4e1" and snapshot.resolve("e9") is None
    assert snapshot.roles["e2"] == "link" and snapshot.roles["f4e1"] == "button"
    with pytest.raises(ActionError, match="no element"):
        snapshot.require("e99")
    with pytest.raises(ActionError, match="not a text field"):
        snapshot.require("e2", roles=("textbox",), action="type")


def test_yaml_quoting_matches_playwright_rules():
    assert yaml_escape_value("plain text") == "plain text"
    assert yaml_escape_value("Price: $3") == '"Price: $3"'
    assert yaml_escape_value("- dash") == '"- dash"'
    assert yaml_escape_value("12.5") == '"12.5"' and yaml_escape_value("yes") == '"yes"'
    assert yaml_escape_value('say "hi"') == 'say "hi"'
    assert yaml_escape_value('"quoted') == '"\\"quoted"'
    assert yaml_escape_value("a #tag") == '"a #tag"' and yaml_escape_value("a{b}") == '"a{b}"'
    assert yaml_escape_key('link "A: B" [ref=e1]') == "'link \"A: B\" [ref=e1]'"


def test_action_argument_checks_reject_garbage():
    assert check_key("Enter") == "Enter" and check_key("ctrl+a") == "Control+a" and check_key("Shift++") == "Shift++"
    assert check_key("x") == "x" and check_key("pagedown") == "PageDown"
    for bad in ("NoSuchKey", "", "Enter+a", "a+Shift", "A" * 100, None, 5):
        with pytest.raises(ActionError):
            check_key(bad)
    assert check_point(0, 209.5, 160, 210) == (0.0, 209.5)
    for x, y in ((-1, 5), (160, 5), (5, 210), (float("nan"), 1), (True, 1), ("3", 4), (10**12, 1)):
        with pytest.raises(ActionError, match="x|y"):
            check_point(x, y, 160, 210)
    with pytest.raises(ActionError, match="at most"):
        check_text("a" * 5000)
    with pytest.raises(ActionError):
        check_text("\ud800")
    with pytest.raises(ActionError):
        check_scroll_delta(1e9)


def test_missing_chromium_says_what_to_install():
    with pytest.raises(BrowserUnavailable, match="apt-get install -y chromium"):
        find_chromium("/nonexistent/chromium")


# ---- the guard in a real browser ----------------------------------------------------------------------
def test_the_browser_process_is_told_from_a_child_forked_but_not_yet_execd():
    """A child Chromium forks (a utility process starting) shows the browser's own command line until it execs; the
    pool must still watch the browser itself, or a stopped browser goes unnoticed until the watchdog."""
    import subprocess
    import sys

    from agentgym.tools.browser.chromium_processes import browser_process
    from agentgym.utils.procfs import descendants

    marker = "--agentgym-browser-pool=test-fork.1"
    script = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(30); os._exit(0)\nprint(os.getpid(), flush=True)\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", script, marker], stdout=subprocess.PIPE, text=True)
    renderer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker, "--type=renderer"])
    try:
        pid = int(parent.stdout.readline())
        assert pid == parent.pid
        deadline = time.monotonic() + 10  # the forked child is listed once the fork returned in it
        while not any(marker.encode() in open(f"/proc/{child}/cmdline", "rb").read()
                      for child in descendants(pid) - {pid}) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert descendants(pid) - {pid}, "the test's fork did not happen"
        assert browser_process(marker) == parent.pid
        assert browser_process("--agentgym-browser-pool=nobody-launched-this.1") is None
    finally:
        for proc in (parent, renderer):
            for child in descendants(proc.pid) - {proc.pid}:
                os.kill(child, signal.SIGKILL)
            proc.kill()
            proc.wait()


@needs_browser
def test_every_way_out_is_refused_and_nothing_reaches_other_ports(pool, site):
    session = pool.session(viewport=(800, 600))
    try:
        session.start("/", allowed_origins=[site.server.origin])
        assert "Home" in session.snapshot().text  # the page loaded although its images were blocked
        for label in ("external link", "other port link", "redirect out", "redirect to other port", "redirect chain",
                      "Post out", "Script out"):
            ref = ref_of(session, label)
            with pytest.raises(ActionError, match="navigation refused"):
                session.click(ref)
            assert session.url == site.server.origin + "/", label  # still on the page
        with pytest.raises(ActionError, match="outside this site"):
            session.goto(f"{site.canary.origin}/direct")
        with pytest.raises(ActionError, match="outside this site"):
            session.goto("http://localhost:1/")
        session.click(ref_of(session, "Pop up"))
        notes: list[str] = []
        for _ in range(50):  # the pop-up event arrives just after the click returns
            notes += session.notices()
            if notes:
                break
            time.sleep(0.02)
        assert any("new window" in note for note in notes)
        assert session.url == site.server.origin + "/"
        session.click(ref_of(session, "redirect ok"))  # allowed redirects are followed
        assert session.url == site.server.origin + "/two"
        session.back()
        assert session.url == site.server.origin + "/"
        with pytest.raises(ActionError, match="no previous page"):
            session.back()
        assert site.canary_hits == 0
    finally:
        session.close()


@needs_browser
def test_actions_on_bad_refs_and_wrong_elements_are_model_errors(pool, site):
    with pool.session(viewport=(800, 600)) as session:
        session.start("/", allowed_origins=[site.server.origin])
        session.snapshot()
        for call in (lambda: session.click("e999"), lambda: session.click("nonsense"),
                     lambda: session.type(ref_of(session, "Home"), "x"),
                     lambda: session.select(ref_of(session, "Name"), "x"),
                     lambda: session.scroll("sideways")):
            with pytest.raises(ActionError):
                call()
        session.type(ref_of(session, "Name"), "Ada " * 10)
        assert "Ada Ada" in session.snapshot().text


# ---- reuse and cleaning -------------------------------------------------------------------------------------
@needs_browser
def test_contexts_are_reused_and_cleaned_between_episodes(pool, site):
    with pool.session(viewport=(640, 480)) as session:
        session.start("/", allowed_origins=[site.server.origin], cookies=[{"name": "who", "value": "first"}])
        session.evaluate("() => { localStorage.setItem('k', 'v'); document.cookie = 'extra=1; path=/'; }")
        created = pool.stats["contexts_created"]
        session.start("/two", allowed_origins=[site.server.origin])
        assert pool.stats["contexts_created"] == created  # same context, not a new one
        assert session.evaluate("() => [document.cookie, localStorage.getItem('k')]") == ["", None]
    with pool.session(viewport=(640, 480)) as other:  # the released context is handed to the next session
        reused = pool.stats["contexts_reused"]
        other.start("/", allowed_origins=[site.server.origin])
        assert pool.stats["contexts_reused"] == reused + 1
        assert other.evaluate("() => document.cookie") == ""


def assert_next_episode_works(session, site) -> None:
    """After a crash or hang, the session's next episode starts on a working page."""
    session.start("/two", allowed_origins=[site.server.origin])
    assert "Two" in session.snapshot().text


# ---- crashes ------------------------------------------------------------------------------------------------
@needs_browser
def test_a_crashed_page_ends_only_its_own_session(site):
    from agentgym.tools.browser import BrowserPool

    # Its own pool: a renderer death must not leave anything behind for the module's other tests. The renderer
    # is killed through chrome://kill (what the OOM killer does), not CDP's Page.crash: that one goes through
    # the host's crash-dump handler, which on some CI hosts held the crash event back past every timeout.
    config = BrowserConfig(action_timeout_s=20.0, navigation_timeout_s=30.0, watchdog_s=60.0)
    with BrowserPool(config) as own:
        crashed, healthy = own.session(viewport=(640, 480)), own.session(viewport=(640, 480))
        try:
            crashed.start("/", allowed_origins=[site.server.origin])
            healthy.start("/", allowed_origins=[site.server.origin])

            async def kill_renderer(lease):
                import contextlib

                with contextlib.suppress(Exception):  # the navigation dies with its renderer
                    await lease.page.goto("chrome://kill", timeout=5000)

            own._run(kill_renderer(crashed._lease))
            with pytest.raises(BrowserCrashed, match="crashed"):
                for _ in range(40):  # the crash event can trail the navigation by a few milliseconds
                    crashed.snapshot()
                    time.sleep(0.05)
            assert "Home" in healthy.snapshot().text  # the other context is untouched
            assert_next_episode_works(crashed, site)  # and the crashed one recovers
        finally:
            crashed.close()
            healthy.close()


@needs_browser
def test_a_page_that_stops_answering_ends_its_episode_but_a_hidden_element_does_not(site):
    from agentgym.tools.browser import BrowserPool

    # A click that times out is the model's mistake while the page still answers, and the end of the episode
    # once it does not (a renderer frozen without a crash event), long before the watchdog.
    config = BrowserConfig(action_timeout_s=2.0, navigation_timeout_s=4.0, watchdog_s=30.0)
    with BrowserPool(config) as own, own.session(viewport=(640, 480)) as session:
        session.start("/", allowed_origins=[site.server.origin])
        heading, link = ref_of(session, "Home"), ref_of(session, "redirect ok")
        session.evaluate("() => { document.querySelector('h1').style.display = 'none'; }")
        with pytest.raises(ActionError) as hidden:
            session.click(heading)
        assert not isinstance(hidden.value, BrowserCrashed)
        assert "Home" not in session.snapshot().text  # it still answers: the episode goes on
        session.evaluate("() => { setTimeout(() => { const t = Date.now(); while (Date.now() - t < 25000) {} }, 0); }")
        started = time.monotonic()
        with pytest.raises(BrowserCrashed, match="stopped answering"):
            session.click(link)
        assert time.monotonic() - started < 20
        assert_next_episode_works(session, site)  # a fresh context for the next episode


@needs_browser
def test_a_killed_browser_is_relaunched_for_the_next_episode(site):
    from agentgym.tools.browser import BrowserPool
    from agentgym.tools.browser.chromium_processes import singleton_dir

    with BrowserPool() as own:
        session = own.session(viewport=(640, 480))
        session.start("/", allowed_origins=[site.server.origin])
        pid = own.browser_pid()
        assert pid is not None
        singleton = singleton_dir(pid)  # the profile lock's temp dir, which a killed Chromium cannot remove
        assert singleton is not None and os.path.isdir(singleton)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(BrowserCrashed):
            for _ in range(40):
                session.snapshot()
                time.sleep(0.05)
        assert_next_episode_works(session, site)
        assert own.stats["launches"] == 2 and own.browser_pid() not in (None, pid)
        assert not os.path.exists(singleton), "a killed browser's temp dir was left behind"
        session.close()


@needs_browser
def test_a_hung_page_trips_the_watchdog(site):
    from agentgym.tools.browser import BrowserPool

    # Timeouts leave room for a machine under load (page loads there take seconds); the page spins for 20 s.
    config = BrowserConfig(action_timeout_s=2.0, navigation_timeout_s=4.0, watchdog_s=6.0)
    with BrowserPool(config) as own, own.session(viewport=(640, 480)) as session:
        session.start("/", allowed_origins=[site.server.origin])
        started = time.monotonic()
        with pytest.raises(BrowserCrashed, match="did not answer"):
            session.evaluate("() => { const t = Date.now(); while (Date.now() - t < 20000) {} }")
        assert time.monotonic() - started < 12
        assert_next_episode_works(session, site)  # a fresh context


@needs_browser
def test_sessions_work_concurrently_from_threads(pool, site):
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with pool.session(viewport=(640, 480)) as session:
                for _ in range(3):
                    session.start("/", allowed_origins=[site.server.origin])
                    session.click(ref_of(session, "redirect ok"))
                    assert "Two" in session.snapshot().text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


@needs_browser
def test_a_browser_that_stops_answering_outside_any_page_is_replaced(site, monkeypatch):
    """A start whose context creation gets no answer for the whole watchdog (the browser process hangs, not a page)
    kills that browser, so the same start's next try, and every later one, gets a new browser instead of hanging."""
    import asyncio

    from agentgym.tools.browser import BrowserPool

    config = BrowserConfig(action_timeout_s=2.0, navigation_timeout_s=4.0, watchdog_s=6.0)
    with BrowserPool(config) as own, own.session(viewport=(640, 480)) as session:
        session.start("/", allowed_origins=[site.server.origin])
        first = own.browser_pid()
        real_acquire, hangs = own._acquire, []

        async def hanging_once(key):  # the first fresh context never answers, as a frozen CDP connection would
            if not hangs:
                hangs.append(key)
                await asyncio.sleep(3600)
            return await real_acquire(key)

        monkeypatch.setattr(own, "_acquire", hanging_once)
        session._lease.broken = "test: the next start needs a fresh context"
        started = time.monotonic()
        session.start("/two", allowed_origins=[site.server.origin])  # try 1 hangs, the next gets a new browser
        assert hangs and time.monotonic() - started < 30
        assert "Two" in session.snapshot().text
        assert own.browser_pid() not in (None, first)
