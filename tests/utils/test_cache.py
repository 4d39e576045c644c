"""One cache root, and build_once safe across processes: one build, complete trees, nothing left behind."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentgym.utils.cache import build_once, cache_root

REPO = Path(__file__).resolve().parents[2]

# A builder that is slow enough for four processes to collide, logs each build it runs, and fills a tree in
# several files (so a reader of half a tree would notice).
BUILDER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from agentgym.utils.cache import build_once

    root = Path({root!r})
    while not (root / "go").exists():  # start all processes at the same moment
        time.sleep(0.005)

    def build(tmp: Path) -> None:
        with open(root / "builds.log", "a") as fh:
            fh.write(f"{{os.getpid()}}\\n")
        for i in range(20):
            (tmp / f"part{{i}}.txt").write_text(str(i) * 1000)
            time.sleep({delay})
        (tmp / "sub").mkdir()
        (tmp / "sub" / "last.txt").write_text("done")

    tree = build_once(root / "cache" / "entry", build)
    parts = sorted(p.name for p in tree.iterdir())
    ok = all((tree / f"part{{i}}.txt").read_text() == str(i) * 1000 for i in range(20))
    print(json.dumps({{"tree": str(tree), "parts": parts, "ok": ok and (tree / "sub" / "last.txt").read_text() == "done"}}))
    """
)


def _builder(root: Path, delay: float) -> subprocess.Popen[str]:
    script = BUILDER.format(repo=str(REPO), root=str(root), delay=delay)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".building-" in p.name)


def test_four_processes_build_once_exactly_once(tmp_path: Path) -> None:
    procs = [_builder(tmp_path, 0.01) for _ in range(4)]
    time.sleep(0.5)  # let every interpreter start and wait at the barrier
    (tmp_path / "go").touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert len((tmp_path / "builds.log").read_text().splitlines()) == 1, "exactly one process may build"
    expected = sorted([f"part{i}.txt" for i in range(20)] + ["sub", ".agentgym-complete"])
    for result in results:
        assert result["ok"] and result["parts"] == expected and result["tree"] == str(tmp_path / "cache" / "entry")
    assert _leftovers(tmp_path / "cache") == []


def test_a_builder_killed_mid_build_does_not_stop_the_next(tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    proc = _builder(tmp_path, 2.0)  # 40 s build: killed long before it finishes
    deadline = time.time() + 60
    while time.time() < deadline and not any(p.glob("part0.txt") for p in (tmp_path / "cache").glob(".entry.building-*")):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _leftovers(tmp_path / "cache"), "the killed builder left its temporary (the next one cleans it)"
    assert not (tmp_path / "cache" / "entry").exists()
    start = time.perf_counter()
    tree = build_once(tmp_path / "cache" / "entry", lambda tmp: (tmp / "x.txt").write_text("fresh"))
    assert time.perf_counter() - start < 5, "the dead builder's lock must not be held any more"
    assert (tree / "x.txt").read_text() == "fresh" and not (tree / "part0.txt").exists()
    assert _leftovers(tmp_path / "cache") == []


def test_a_failed_build_leaves_nothing_and_the_next_call_builds(tmp_path: Path) -> None:
    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("network down")

    with pytest.raises(RuntimeError, match="network down"):
        build_once(tmp_path / "entry", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock"]
    calls: list[Path] = []
    tree = build_once(tmp_path / "entry", lambda tmp: calls.append(tmp))
    assert build_once(tmp_path / "entry", lambda tmp: calls.append(tmp)) == tree and len(calls) == 1


def test_file_entries_and_incomplete_old_entries(tmp_path: Path) -> None:
    path = build_once(tmp_path / "vectors.bin", lambda tmp: tmp.write_bytes(b"abc"), directory=False)
    assert path.read_bytes() == b"abc" and oct(path.stat().st_mode & 0o777) == "0o644"
    old = tmp_path / "tree"
    old.mkdir()
    (old / "half-extracted").write_text("x")  # from a version that built in place and was interrupted
    tree = build_once(old, lambda tmp: (tmp / "whole").write_text("y"))
    assert sorted(p.name for p in tree.iterdir()) == [".agentgym-complete", "whole"]


def test_one_cache_root_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENTGYM_CACHE_DIR", raising=False)
    monkeypatch.delenv("AGENTGYM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "agentgym"
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "legacy"))
    assert cache_root() == tmp_path / "legacy", "the old SWE variable still works (with a warning)"
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(tmp_path / "one"))
    assert cache_root() == tmp_path / "one"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", "relative")
    assert cache_root() == tmp_path / "relative", "absolute, so subprocesses elsewhere agree"


def test_search_corpus_and_embeddings_live_under_the_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(tmp_path))
    from agentgym.envs.search.corpus import corpus_cache_path
    from agentgym.tools.retrieval.base import default_cache_dir

    assert default_cache_dir() == tmp_path
    assert corpus_cache_path("profiles").is_relative_to(tmp_path)


def _swe_on_build_once() -> bool:
    from agentgym.tasks.swe import libraries

    return "build_once" in inspect.getsource(libraries)


def test_swe_source_cache_lives_under_the_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agentgym.tasks.swe import libraries

    if not _swe_on_build_once():
        pytest.skip("tasks/swe/libraries.fetch_library does not use agentgym.utils.cache.build_once yet (SWE helper's change)")
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(tmp_path))
    assert libraries.cache_root().is_relative_to(tmp_path)


def test_four_processes_fetch_the_same_swe_library(tmp_path: Path) -> None:
    from agentgym.tasks.swe import libraries

    if not _swe_on_build_once():
        pytest.skip("tasks/swe/libraries.fetch_library does not use agentgym.utils.cache.build_once yet (SWE helper's change)")
    lib = libraries.get_library("toolz")
    cached = libraries.cache_root() / "sdists" / lib.sdist_name  # the user's cache: nothing is downloaded here
    if not cached.is_file():
        pytest.skip(f"the {lib.name} sdist is not cached at {cached}; this test does not download")
    env = {**os.environ, "AGENTGYM_CACHE_DIR": str(tmp_path)}
    env.pop("AGENTGYM_CACHE", None)
    target = subprocess.run([sys.executable, "-c", "from agentgym.tasks.swe import libraries; "
                             "print(libraries.cache_root())"], env=env, capture_output=True, text=True, check=True)
    fresh_root = Path(target.stdout.strip())
    (fresh_root / "sdists").mkdir(parents=True)
    shutil.copy(cached, fresh_root / "sdists" / lib.sdist_name)
    code = "from agentgym.tasks.swe import libraries; print(libraries.fetch_library('toolz'))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    trees = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        trees.append(Path(out.strip()))
    assert len(set(trees)) == 1 and trees[0].is_relative_to(tmp_path)
    assert (trees[0] / ".agentgym-complete").exists() and any(trees[0].rglob("*.py"))
    assert not [p for p in tmp_path.rglob("*") if ".building-" in p.name]
