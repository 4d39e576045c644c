"""The docs site builds with warnings as errors, its generated pages are current, and the README stays a short guide."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_generated_pages_and_tables_are_current() -> None:
    result = subprocess.run([sys.executable, "docs/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"run python docs/generate.py:\n{result.stdout}{result.stderr[-3000:]}"


def test_the_docs_build_strictly_with_link_checks(tmp_path: Path) -> None:
    missing = [name for name in ("mkdocs", "material") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (pip install -e '.[test]' installs mkdocs and "
                    "mkdocs-material)")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_readme_is_a_short_guide_with_both_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "README.md is a five-minute guide; move detail to docs/"
    assert "make quickstart" in text and "make test" in text


def test_the_readme_links_point_at_files_that_exist() -> None:
    """mkdocs checks the links inside docs/; this checks the README's own relative links."""
    text = README.read_text(encoding="utf-8")
    targets = {link.split("#", 1)[0] for link in re.findall(r"\]\(([^)\s]+)\)", text)
               if not link.startswith(("http://", "https://", "#", "mailto:"))}
    missing = sorted(target for target in targets if not (ROOT / target).exists())
    assert not missing, f"README.md links to missing files: {missing}"


# Dotted names in the docs that are not Python paths: a model directory's metadata file, entry-point groups.
_NOT_PYTHON_PATHS = {"agentgym.json", "agentgym.suites"}

_RESOLVE = """
import importlib, json, sys, warnings
warnings.simplefilter("error", DeprecationWarning)
failed = {}
for ref in json.loads(sys.argv[1]):
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and not (module + ".").startswith(exc.name + "."):
                obj = None  # an optional dependency of the module is not installed: nothing to check here
                break
            continue
        except Exception as exc:
            failed[ref] = repr(exc)[:200]
            break
        try:
            for name in parts[i:] if obj is not None else ():
                obj = getattr(obj, name)
        except Exception as exc:
            failed[ref] = repr(exc)[:200]
        break
    else:
        failed[ref] = "no such module"
print(json.dumps(failed))
"""


def test_every_agentgym_path_the_docs_name_resolves_without_a_deprecation() -> None:
    """Docs that name a moved or removed module would send readers to an old path."""
    import json

    files = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    refs = sorted({ref for path in files
                   for ref in re.findall(r"`(agentgym(?:\.[A-Za-z_]\w*)+)", path.read_text(encoding="utf-8"))}
                  - _NOT_PYTHON_PATHS)
    result = subprocess.run([sys.executable, "-c", _RESOLVE, json.dumps(refs)], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failed, f"the docs name paths that do not resolve (or are deprecated): {failed}"
