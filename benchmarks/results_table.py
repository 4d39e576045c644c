"""Build the benchmark tables of ``docs/benchmarks.md`` from ``benchmarks/results/*.json``.

Every benchmark writes its figures to ``benchmarks/results/<name>.json`` (``benchmarks/_results.py``); this script
turns those files into the generated section of ``docs/benchmarks.md``, between the markers below, so a figure in
the docs is always the one a run measured, with its date, commit, machine, load and command beside it. Text outside
the markers is kept as it is.

    python benchmarks/results_table.py           # rewrite the generated section
    python benchmarks/results_table.py --check   # exit 1 if docs/benchmarks.md is out of date
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
START = "<!-- generated:benchmarks:start -->"
END = "<!-- generated:benchmarks:end -->"
# Scripts in benchmarks/ that are not benchmarks (they write no results file).
NOT_BENCHMARKS = frozenset({"results_table", "long_horizon_page"})  # page generators, not benchmarks

INTRO = """# Benchmarks

Each script in `benchmarks/` runs agentgym and a baseline side by side in one run, prints the comparison, and
writes its figures to `benchmarks/results/<name>.json`: the date, the git commit (and whether the tree had
uncommitted changes), the machine (CPU count and model, memory, load average at the start and the end, Python and
torch versions, GPU), the exact command line, and one row per figure (what was measured, agentgym's figure, the
baseline's, the ratio the script printed, the unit, and the goal with whether it was met).

Run one benchmark, then regenerate the tables below:

```bash
python benchmarks/rollout_throughput.py      # most take their defaults; see --help for size flags
python benchmarks/results_table.py           # rewrites the generated section of this page
python benchmarks/results_table.py --check   # exits 1 if this page is out of date (the tests run it)
```

`make benchmarks` runs the quick ones in turn. The learning studies (`credit_assignment.py`, `archer_vs_bc.py`,
`arpo_vs_grpo.py`, `async_training.py`, `gradient_noise.py`, `vlm_miniwob.py`) take up to an hour each at their
default sizes; their `--quick` flags run a smoke-sized version, and the recorded command says which size a figure
comes from. Benchmarks on shared machines are noisy: read the load average beside each row, and compare ratios
(measured in one run, under the same load) rather than absolute figures across rows.

Everything between the markers below is generated from `benchmarks/results/*.json`; edit those files by running
the benchmark again, never by hand.
"""


def benchmark_names() -> list[str]:
    """Every benchmark script's name (``benchmarks/*.py`` without helpers, whose names start with ``_``)."""
    return sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                  if not p.stem.startswith("_") and p.stem not in NOT_BENCHMARKS)


def load_results() -> list[dict[str, Any]]:
    """Every results file, sorted by benchmark name, except smoke runs (``<name>_quick.json``: a benchmark's
    ``--quick`` size checks that it runs; its figures are not measurements to publish, and it is never committed)."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(RESULTS_DIR.glob("*.json"))
            if not p.stem.endswith("_quick")]


def fmt_number(value: Any) -> str:
    """A figure for a table cell: three significant digits, thousands separators, no trailing noise."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude == 0:
        return "0"
    return f"{value:.3g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _with_unit(value: Any, unit: str) -> str:
    text = fmt_number(value)
    return f"{text} {unit}" if unit and text != "-" else text


def _goal(row: dict[str, Any]) -> str:
    if not row.get("goal"):
        return "-"
    met = row.get("met")
    verdict = "met" if met else "missed" if met is False else "not judged"
    return f"{row['goal']}: **{verdict}**"


def _machine(record: dict[str, Any]) -> str:
    m = record.get("machine", {})
    parts = [f"{m.get('cpu_count', '?')} CPUs"]
    if m.get("gpu"):
        parts.append(str(m["gpu"]))
    if m.get("ram_gib") is not None:
        parts.append(f"{m['ram_gib']:g} GiB")
    start, end = m.get("load_average_start") or [None], m.get("load_average_end") or [None]
    load = f"load {fmt_number(start[0])} → {fmt_number(end[0])}"
    return ", ".join(parts) + f"; {load}"


def _date(record: dict[str, Any]) -> str:
    git = record.get("git") or {}
    commit = (git.get("commit") or "?")[:7]
    dirty = ", uncommitted changes" if git.get("dirty") else ""
    return f"{str(record.get('date', '?'))[:10]} ({commit}{dirty})"


def table(records: list[dict[str, Any]]) -> str:
    """The generated section's text: one table row per figure, then the benchmarks that have no results yet."""
    lines = ["| benchmark | what | agentgym | baseline | ratio | goal | date (commit) | machine and load (1 min) | "
             "command |", "|---|---|---|---|---|---|---|---|---|"]
    for record in records:
        for row in record["figures"]:
            what = row["what"] + (f" ({row['note']})" if row.get("note") else "")
            ratio = fmt_number(row.get("ratio"))
            lines.append("| " + " | ".join(_cell(c) for c in (
                record["name"], what, _with_unit(row.get("agentgym"), row.get("unit", "")),
                _with_unit(row.get("baseline"), row.get("unit", "")), ratio if ratio == "-" else f"{ratio}x",
                _goal(row), _date(record), _machine(record), f"`{record['command']}`")) + " |")
    out = "\n".join(lines)
    notes = [f"- `{r['name']}`: {r['note']}" for r in records if r.get("note")]
    if notes:
        out += "\n\nNotes on runs:\n\n" + "\n".join(notes)
    missing = sorted(set(benchmark_names()) - {r["name"] for r in records})
    if missing:
        out += ("\n\nBenchmarks without a results file yet (run them to add their rows): "
                + ", ".join(f"`{name}`" for name in missing) + ".")
    return out


def render(current: str | None, records: list[dict[str, Any]]) -> str:
    """``current`` (the page as it is, or ``None``) with its generated section replaced."""
    section = f"{START}\n\n{table(records)}\n\n{END}"
    if current is None or START not in current or END not in current:
        return f"{INTRO}\n{section}\n"
    head, rest = current.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + section + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md is out of date")
    args = parser.parse_args(argv)
    current = DOC.read_text(encoding="utf-8") if DOC.is_file() else None
    expected = render(current, load_results())
    if args.check:
        if current != expected:
            print(f"{DOC.relative_to(ROOT)} is out of date with benchmarks/results/; run "
                  "python benchmarks/results_table.py and commit the result", file=sys.stderr)
            return 1
        return 0
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(expected, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
