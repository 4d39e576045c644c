"""Write a benchmark's figures to ``benchmarks/results/<name>.json``, the data the docs' tables are built from.

Every benchmark script calls :func:`write_results` once at the end with the numbers it printed, so a figure
quoted anywhere can be traced to a file that says when, on which commit and machine, under what load and with
which command line it was measured. Importing this module notes the load average, so a script that imports it
at the top gets the load at its start as well as at its end.

A row of figures says what was measured, agentgym's figure, the baseline's figure (``None`` where the benchmark
has no baseline), the ratio the script printed, the unit, and the goal with whether it was met (``None`` where
the benchmark sets no goal). ``benchmarks/results_table.py`` turns the files into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Keys every results file has; tests/project/test_benchmark_results.py checks them.
SCHEMA_KEYS = ("name", "date", "git", "machine", "command", "figures")
FIGURE_KEYS = ("what", "agentgym", "baseline", "ratio", "unit", "goal", "met")

PACKAGES = ("transformers", "tokenizers", "numpy", "gymnasium", "minigrid", "textworld", "scienceworld", "vllm")
"""Packages besides torch whose version can change a figure: the model code and its numerics, the tokenizer
trainer, and the packages whose code generates env tasks (BabyAI's rooms are minigrid's level code run on a seed).
Each results file records the installed ones, so two files' numbers can be told apart by what ran them."""

_LOAD_AT_IMPORT = os.getloadavg()
_STARTED_AT = _dt.datetime.now(_dt.timezone.utc)


def figure(
    what: str,
    agentgym: float | str | None,
    baseline: float | str | None = None,
    *,
    unit: str = "",
    ratio: float | None = None,
    goal: str | None = None,
    met: bool | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """One row of figures.

    Args:
        what: What was measured, with the workload (e.g. "256 GuessNumber episodes, free policy").
        agentgym: agentgym's figure.
        baseline: The baseline's figure from the same run, or ``None`` when there is none.
        unit: Unit of ``agentgym`` and ``baseline`` (e.g. "episodes/s", "ms p50").
        ratio: The ratio the script printed. Pass it whenever the script prints one, so the file holds the same
            number; left ``None`` it is ``agentgym / baseline`` when both are numbers.
        goal: The goal as text (e.g. "ratio >= 0.7"), or ``None``.
        met: Whether the goal was met, or ``None`` without a goal.
        note: Anything a reader needs to read the row right (e.g. "lower is better").
    """
    if ratio is None and _number(agentgym) and _number(baseline) and baseline:
        ratio = float(agentgym) / float(baseline)  # type: ignore[arg-type]
    row: dict[str, Any] = {
        "what": what,
        "agentgym": _clean(agentgym),
        "baseline": _clean(baseline),
        "ratio": _clean(ratio),
        "unit": unit,
        "goal": goal,
        "met": None if met is None else bool(met),
    }
    if note:
        row["note"] = note
    return row


def write_results(
    name: str,
    figures: list[dict[str, Any]],
    *,
    details: dict[str, Any] | None = None,
    note: str | None = None,
) -> Path:
    """Write ``benchmarks/results/<name>.json`` atomically and return its path.

    The file is written to a temporary name in the same folder and renamed over the old one, so a run killed
    half-way leaves the previous results whole.

    Args:
        name: The benchmark's name, the script's file name without ``.py``.
        figures: Rows made by :func:`figure`.
        details: Further raw numbers the script measured (kept as they are, for whoever digs deeper).
        note: One line on how to read this run (e.g. a reduced size and why).
    """
    record: dict[str, Any] = {
        "name": name,
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "started": _STARTED_AT.replace(microsecond=0).isoformat(),
        "git": _git(),
        "machine": _machine(),
        "command": shlex.join(_command()),
        "figures": [dict(f) for f in figures],
    }
    if note:
        record["note"] = note
    if details:
        record["details"] = _clean(details)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".json.tmp", dir=RESULTS_DIR)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the file from other users of a shared checkout
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    print(f"results written to {shown}")
    return path


def _command() -> list[str]:
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if argv:
        argv[0] = "python"
    # Paths relative to the repository root read the same on every machine.
    out = []
    for arg in argv:
        p = Path(arg)
        if p.is_absolute() and p.suffix == ".py":
            try:
                arg = str(p.resolve().relative_to(REPO_ROOT))
            except ValueError:
                pass
        out.append(arg)
    return out


def _git() -> dict[str, Any]:
    def run(*args: str) -> str | None:
        try:
            return subprocess.run(("git", *args), cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _machine() -> dict[str, Any]:
    load_end = os.getloadavg()
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_gib": _ram_gib(),
        "load_average_start": [round(v, 2) for v in _LOAD_AT_IMPORT],
        "load_average_end": [round(v, 2) for v in load_end],
        "python": platform.python_version(),
        "torch": _version("torch"),
        "packages": {name: version for name in PACKAGES if (version := _version(name)) is not None},
        "gpu": _gpu(),
        "platform": platform.platform(),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _gpu() -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001 - a broken CUDA setup means no GPU for this record
            pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.strip()
            return out.splitlines()[0] if out else None
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _clean(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python numbers, NaN and infinities to ``None``, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
