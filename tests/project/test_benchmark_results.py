"""Benchmark results are data: every benchmark has a committed ``benchmarks/results/<name>.json`` with the schema
``benchmarks/_results.py`` writes, and ``docs/benchmarks.md``'s tables are generated from those files.

No benchmark runs here: the files are read as committed.
"""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from tests.helpers.scripts import REPO, load_script

table = load_script("benchmarks/results_table.py")
results = load_script("benchmarks/_results.py")

# Benchmarks that have no committed results file yet, each with the reason. Shrink this as they are run; a
# benchmark not listed here must have its file.
_NOT_RUN_YET = "a learning study (up to an hour at its defaults); not yet run on the shared machine"
WITHOUT_RESULTS: dict[str, str] = {
    "archer_vs_bc": _NOT_RUN_YET,
    "credit_assignment": _NOT_RUN_YET,
    "vlm_miniwob": _NOT_RUN_YET,
}


def _files() -> list:
    return sorted((REPO / "benchmarks" / "results").glob("*.json"))


def test_every_benchmark_script_has_a_committed_results_file() -> None:
    have = {p.stem for p in _files()}
    missing = [name for name in table.benchmark_names() if name not in have and name not in WITHOUT_RESULTS]
    assert not missing, (f"no benchmarks/results/<name>.json for {missing}: run `python benchmarks/<name>.py` "
                         "(it writes the file) and commit it")
    stale = sorted(set(WITHOUT_RESULTS) & have)
    assert not stale, f"{stale} now have results files: take them out of WITHOUT_RESULTS"


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_results_file_has_the_schema_fields(path) -> None:
    record = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in results.SCHEMA_KEYS if key not in record]
    assert not missing, f"{path.name} lacks {missing}"
    assert record["name"] == path.stem
    assert {"commit", "dirty"} <= set(record["git"])
    assert {"cpu_count", "cpu_model", "ram_gib", "load_average_start", "load_average_end", "python", "torch",
            "gpu"} <= set(record["machine"])
    assert record["command"].startswith("python benchmarks/"), record["command"]
    assert record["figures"], f"{path.name} has no figures"
    for row in record["figures"]:
        lacking = [key for key in results.FIGURE_KEYS if key not in row]
        assert not lacking, f"{path.name}: a figure lacks {lacking}: {row}"
        assert row["met"] in (True, False, None)
        assert row["goal"] is not None or row["met"] is None, f"{path.name}: 'met' without a goal: {row}"


def test_docs_benchmarks_page_is_generated_from_the_results() -> None:
    assert table.main(["--check"]) == 0, "run python benchmarks/results_table.py and commit docs/benchmarks.md"


def test_figure_computes_the_ratio_only_from_two_numbers() -> None:
    assert results.figure("x", 6.0, 3.0)["ratio"] == 2.0
    assert results.figure("x", 6.0, None)["ratio"] is None
    assert results.figure("x", 6.0, 3.0, ratio=0.5)["ratio"] == 0.5
    assert results.figure("x", float("nan"), 3.0)["agentgym"] is None


def test_write_results_writes_the_schema_atomically(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    path = results.write_results("demo", [results.figure("x", 2.0, 1.0, unit="ops/s", goal=">= 1.5x", met=True)])
    record = json.loads(path.read_text())
    assert set(results.SCHEMA_KEYS) <= set(record)
    assert record["figures"][0]["ratio"] == 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]  # no temporary file left behind
    packages = record["machine"]["packages"]  # the versions that can change a figure, as installed
    assert packages["transformers"] == metadata.version("transformers")
    assert packages["numpy"] == metadata.version("numpy") and set(packages) <= set(results.PACKAGES)


def test_the_generated_section_replaces_only_the_text_between_the_markers() -> None:
    page = f"intro kept\n{table.START}\nold\n{table.END}\noutro kept\n"
    record = {"name": "demo", "date": "2026-01-01T00:00:00+00:00", "git": {"commit": "abcdef1234", "dirty": False},
              "machine": {"cpu_count": 2, "load_average_start": [1.0], "load_average_end": [2.0]},
              "command": "python benchmarks/demo.py", "figures": [results.figure("a | b", 2.0, 1.0, unit="x/s")]}
    out = table.render(page, [record])
    assert out.startswith("intro kept\n") and out.endswith("outro kept\n") and "\nold\n" not in out
    assert "a \\| b" in out and "2.00x" in out and "`python benchmarks/demo.py`" in out
