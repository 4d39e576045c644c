"""Every module imports on its own, old paths still work (with a warning), and two checkouts never mix.

An import circle can hide for months: it only breaks when a user's first import happens to be the module in the
middle of it. So each module is imported first, in a process that has imported no agentgym module yet. Forking
one clean parent per module costs milliseconds where a new interpreter costs a second; the parent imports the
heavy third-party libraries beforehand, which changes nothing about the order in which agentgym's own modules
load.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.project.test_layers import is_deprecated_alias, modules

REPO = Path(__file__).resolve().parents[2]

#: Modules that are programs, not libraries: importing them runs them.
PROGRAMS = {"agentgym.cli.__main__"}

_FORK_EACH = textwrap.dedent("""
    import importlib, json, os, sys, traceback, warnings
    for heavy in ("numpy", "gymnasium", "yaml", "jsonschema", "rich", "httpx", "torch", "transformers",
                  "pydantic", "fastapi", "openenv.core", "requests", "websockets", "pettingzoo", "math_verify"):
        try:
            importlib.import_module(heavy)
        except Exception:
            pass
    loaded = [m for m in sys.modules if m == "agentgym" or m.startswith("agentgym.")]
    assert not loaded, loaded
    failures = {}
    running = {}  # pid -> (module, read end of its pipe)

    def reap():
        pid, _ = os.waitpid(-1, 0)
        if pid not in running:
            return
        name, read = running.pop(pid)
        out = b""
        while chunk := os.read(read, 65536):  # the child has exited: its few kB sit in the pipe, then EOF
            out += chunk
        os.close(read)
        if out:
            failures[name] = out.decode(errors="replace")

    for name in json.loads(sys.argv[1]):
        while len(running) >= int(sys.argv[2]):
            reap()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            warnings.simplefilter("ignore")
            try:
                importlib.import_module(name)
                message = b""
            except BaseException:
                message = traceback.format_exc()[-3000:].encode()
            os.write(write, message)
            os._exit(0)
        os.close(write)
        running[pid] = (name, read)
    while running:
        reap()
    print(json.dumps(failures))
""")


def _optional_missing(name: str, error: str) -> bool:
    """A module of an extra that this machine lacks (vLLM needs CUDA) fails with that extra's own message."""
    return "DependencyNotInstalled" in error or ("No module named 'vllm'" in error)


def test_every_module_imports_first_in_a_fresh_process() -> None:
    names = sorted(name for name, module in modules().items()
                   if name not in PROGRAMS and not is_deprecated_alias(module))
    # Two imports at a time: each child is a short burst of CPU, and one at a time left a core idle whenever the
    # other test workers waited on their browsers, sandboxes and servers.
    result = subprocess.run([sys.executable, "-c", _FORK_EACH, json.dumps(names), "2"], cwd=REPO,
                            capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    failures = {name: error for name, error in json.loads(result.stdout.splitlines()[-1]).items()
                if not _optional_missing(name, error)}
    assert failures == {}, "modules that fail when imported first:\n" + "\n".join(
        f"--- {name}\n{error}" for name, error in failures.items())


def _aliases() -> dict[str, str]:
    """Old path -> new path, read from each alias file's ``moved_module`` call."""
    found = {}
    for name, module in modules().items():
        if not is_deprecated_alias(module):
            continue
        for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "moved_module":
                target = node.args[1]
                if isinstance(target, ast.IfExp):  # ``X if __name__ == "__main__" else Y``: Y is the import path
                    target = target.orelse
                found[name] = ast.literal_eval(target)
    return found


def test_old_paths_warn_and_are_the_new_modules() -> None:
    aliases = _aliases()
    assert "agentgym.serve" in aliases and "agentgym.catalogue" in aliases
    code = textwrap.dedent("""
        import importlib, json, sys, warnings
        import agentgym
        report = {}
        for old, new in json.loads(sys.argv[1]).items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
            report[old] = {"same": module is importlib.import_module(new), "warned": any(new in s for s in said)}
        print(json.dumps(report))
    """)
    result = subprocess.run([sys.executable, "-c", code, json.dumps(aliases)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    wrong = {old: r for old, r in report.items() if not (r["same"] and r["warned"])}
    assert wrong == {}, f"old paths that are not the new module or did not warn: {wrong}"


def test_moved_names_warn_and_resolve() -> None:
    import agentgym.registration.suites as suites
    import agentgym.suite as suite

    with pytest.warns(DeprecationWarning, match="agentgym.registration.suites.load_suite"):
        assert suite.load_suite is suites.load_suite
    with pytest.raises(AttributeError):
        suite.no_such_name  # noqa: B018


def test_an_old_program_path_still_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "agentgym.quickstart", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower()
    assert "python -m agentgym.cli.quickstart" in result.stderr


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=120)


def test_two_checkouts_never_mix(tmp_path: Path) -> None:
    """One clone installed editable in a venv, Python started in another clone: every module comes from the
    clone Python started in (its own ``agentgym`` and its own ``envs``, ``tools``, ``trainers``, ``tasks``), and
    the installed clone still imports whole from its own folder."""
    first, second = tmp_path / "first", tmp_path / "second"
    for clone in (first, second):
        _git("clone", "-q", "--no-hardlinks", str(REPO), str(clone), cwd=tmp_path)
    venv = tmp_path / "venv"
    # --without-pip: the venv uses this interpreter's pip and setuptools (ensurepip's are older)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                              str(first)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = ("import json, agentgym, agentgym.envs, agentgym.tools, agentgym.trainers, agentgym.tasks, "
             "agentgym.envs.games.calculator as calc\n"
             "print(json.dumps([m.__file__ for m in (agentgym, agentgym.envs, agentgym.tools, agentgym.trainers, "
             "agentgym.tasks, calc)]))")
    for where, expected in ((second, second), (first, first)):
        result = subprocess.run([str(python), "-c", probe], cwd=where, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        files = [Path(f) for f in json.loads(result.stdout.splitlines()[-1])]
        assert all(f.is_relative_to(expected) for f in files), (where, files)
