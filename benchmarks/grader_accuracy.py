"""Grader accuracy on the labelled grading sets: false positives and false negatives per env and task kind.

Every ``tests/data/grading/*.jsonl`` line is one (task, answer, verdict) triple labelled by hand-checked
construction; the grader of the line's env family (the very function that env rewards with) is run on it.
A false positive is a wrong answer rewarded (what a policy learns to exploit), a false negative a correct
answer refused (noise in the reward). Prints one table row per env and kind, plus grading time per answer (mean and slowest),
and exits non-zero if there is any false positive.

Run: ``python benchmarks/grader_accuracy.py [--show-errors]``
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.suite import Task

GRADING_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "grading"
#: env family -> "module:function" of its grade_answer(task, answer) -> bool.
GRADERS: dict[str, str] = {
    "code": "agentgym.envs.code_interpreter.answers:grade_answer",
    "games": "agentgym.envs.games.grading:grade_answer",
    "search": "agentgym.envs.search.scoring:grade_answer",
}


@dataclass
class KindResult:
    """Counts of one (env, kind) cell of the table."""

    n: int = 0
    positives: int = 0
    negatives: int = 0
    false_positives: int = 0
    false_negatives: int = 0
    seconds: float = 0.0
    slowest: float = 0.0
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fp_rate(self) -> float:
        return self.false_positives / self.negatives if self.negatives else 0.0

    @property
    def fn_rate(self) -> float:
        return self.false_negatives / self.positives if self.positives else 0.0


def load_rows(directory: Path = GRADING_DIR) -> list[dict[str, Any]]:
    """Every labelled line of every ``*.jsonl`` file in ``directory``."""
    rows = []
    for path in sorted(directory.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                row["_where"] = f"{path.name}:{number}"
                rows.append(row)
    return rows


def load_grader(family: str) -> Callable[[Task, str], bool] | None:
    """The family's grade_answer, or None when its module or function does not exist (yet)."""
    spec = GRADERS.get(family)
    if spec is None:
        return None
    module_name, _, function = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, function, None)


def task_of(row: Mapping[str, Any]) -> Task:
    spec = row["task"]
    return Task(id=spec["id"], prompt=spec["prompt"], answer=spec["answer"], metadata=dict(spec.get("metadata") or {}))


def evaluate(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[tuple[str, str], KindResult], list[str]]:
    """Grade every row; returns the per-(env, kind) results and notes on the families skipped."""
    results: dict[tuple[str, str], KindResult] = defaultdict(KindResult)
    graders: dict[str, Callable[[Task, str], bool] | None] = {}
    notes: list[str] = []
    for row in rows:
        family = row["env"]
        if family not in graders:
            graders[family] = load_grader(family)
            if graders[family] is None:
                notes.append(f"skipped env {family!r}: no grader {GRADERS.get(family, '(not in GRADERS)')} importable")
        grader = graders[family]
        if grader is None:
            continue
        cell = results[(family, row["kind"])]
        start = time.perf_counter()
        verdict = bool(grader(task_of(row), row["answer"]))
        elapsed = time.perf_counter() - start
        cell.seconds += elapsed
        cell.slowest = max(cell.slowest, elapsed)
        cell.n += 1
        expected = bool(row["verdict"])
        cell.positives += expected
        cell.negatives += not expected
        if verdict != expected:
            if verdict:
                cell.false_positives += 1
            else:
                cell.false_negatives += 1
            cell.errors.append({"where": row["_where"], "answer": row["answer"], "gold": row["task"]["answer"],
                                "label": expected, "why": row.get("why", "")})
    return dict(results), notes


#: Env families whose answers are math, where math-verify is a meaningful baseline.
BASELINE_FAMILIES = ("code", "games")


def math_verify_grade(task: Task, answer: str) -> bool:
    """math-verify's verdict on ``answer`` against the task's gold, as its README uses it (default extraction
    of LaTeX and plain expressions, default timeouts); a side it extracts nothing from is parsed again
    inside ``$...$`` (its LaTeX extraction wants delimiters: ``n(n-3)/2`` alone yields nothing); any error is
    a rejection."""
    from math_verify import parse, verify

    def read(text: str) -> list[Any]:
        return parse(text) or parse(f"${text}$")

    try:
        gold = read(str(task.answer))
        predicted = read(str(answer))
        return bool(gold and predicted and verify(gold, predicted))
    except Exception:  # noqa: BLE001 - a baseline that crashes on a line rejects it
        return False


def evaluate_baseline(rows: Iterable[Mapping[str, Any]],
                      grader: Callable[[Task, str], bool] | None = None) -> dict[tuple[str, str], KindResult]:
    """The same cells as :func:`evaluate`, graded by math-verify (or ``grader``) on the math families only."""
    grade = grader or math_verify_grade
    results: dict[tuple[str, str], KindResult] = defaultdict(KindResult)
    for row in rows:
        if row["env"] not in BASELINE_FAMILIES:
            continue
        cell = results[(row["env"], row["kind"])]
        start = time.perf_counter()
        verdict = bool(grade(task_of(row), row["answer"]))
        cell.seconds += time.perf_counter() - start
        cell.n += 1
        expected = bool(row["verdict"])
        cell.positives += expected
        cell.negatives += not expected
        if verdict != expected:
            cell.false_positives += verdict
            cell.false_negatives += not verdict
            cell.errors.append({"where": row["_where"], "answer": row["answer"], "gold": row["task"]["answer"],
                                "label": expected, "why": row.get("why", "")})
    return dict(results)


def format_comparison(ours: Mapping[tuple[str, str], KindResult],
                      baseline: Mapping[tuple[str, str], KindResult], name: str = "math-verify") -> str:
    """Confusion tables side by side: TP/FP/FN/TN of our graders and of ``name`` per env and kind."""
    header = (f"{'env':<8} {'kind':<26} {'n':>5} | {'ours TP':>7} {'FP':>4} {'FN':>4} {'TN':>4} | "
              f"{name + ' TP':>14} {'FP':>4} {'FN':>4} {'TN':>4}")
    lines = [header, "-" * len(header)]

    def counts(cell: KindResult) -> str:
        tp, tn = cell.positives - cell.false_negatives, cell.negatives - cell.false_positives
        return f"{cell.false_positives:>4} {cell.false_negatives:>4} {tn:>4}", tp

    def row(env: str, kind: str, mine: KindResult, theirs: KindResult) -> str:
        (a, tp_a), (b, tp_b) = counts(mine), counts(theirs)
        return f"{env:<8} {kind:<26} {mine.n:>5} | {tp_a:>7} {a} | {tp_b:>14} {b}"

    for env in sorted({env for env, _ in baseline}):
        for kind in sorted(kind for e, kind in baseline if e == env):
            lines.append(row(env, kind, ours.get((env, kind), KindResult()), baseline[(env, kind)]))
        lines.append(row(env, "(all)", total({k: v for k, v in ours.items() if k in baseline}, env),
                         total(baseline, env)))
    return "\n".join(lines)


def total(results: Mapping[tuple[str, str], KindResult], family: str | None = None) -> KindResult:
    """The sum of the cells (of one family, or all)."""
    out = KindResult()
    for (env, _), cell in results.items():
        if family is None or env == family:
            for name in ("n", "positives", "negatives", "false_positives", "false_negatives", "seconds"):
                setattr(out, name, getattr(out, name) + getattr(cell, name))
            out.slowest = max(out.slowest, cell.slowest)
            out.errors += cell.errors
    return out


def format_table(results: Mapping[tuple[str, str], KindResult]) -> str:
    header = f"{'env':<8} {'kind':<26} {'n':>5} {'FP':>4} {'FN':>4} {'FP rate':>8} {'FN rate':>8} {'ms/answer':>10} {'max ms':>8}"
    lines = [header, "-" * len(header)]

    def row(env: str, kind: str, cell: KindResult) -> str:
        ms = 1000 * cell.seconds / cell.n if cell.n else 0.0
        return (f"{env:<8} {kind:<26} {cell.n:>5} {cell.false_positives:>4} {cell.false_negatives:>4} "
                f"{cell.fp_rate:>8.2%} {cell.fn_rate:>8.2%} {ms:>10.2f} {1000 * cell.slowest:>8.1f}")

    for env in sorted({env for env, _ in results}):
        for kind in sorted(kind for e, kind in results if e == env):
            lines.append(row(env, kind, results[(env, kind)]))
        lines.append(row(env, "(all)", total(results, env)))
    lines.append(row("all", "", total(results)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=GRADING_DIR, help="folder of labelled *.jsonl files")
    parser.add_argument("--show-errors", action="store_true", help="print every misgraded line")
    parser.add_argument("--no-baseline", action="store_true", help="skip the math-verify comparison")
    args = parser.parse_args(argv)
    rows = load_rows(args.dir)
    results, notes = evaluate(rows)
    for note in notes:
        print(f"NOTE: {note}")
    print(format_table(results))
    overall = total(results)
    if args.show_errors or overall.false_positives:
        for error in overall.errors:
            print(f"{'FP' if not error['label'] else 'FN'} {error['where']}: {error['answer'][:80]!r} "
                  f"(gold {str(error['gold'])[:40]!r}; {error['why']})")
    baseline: dict[tuple[str, str], KindResult] = {}
    if not args.no_baseline:
        try:
            import math_verify  # noqa: F401
        except ImportError:
            print("NOTE: math-verify is not installed (pip install math-verify): no baseline comparison")
        else:
            baseline = evaluate_baseline(rows)
            print("\nOur graders next to math-verify on the same labelled lines (math answers only):")
            print(format_comparison(results, baseline))
            if args.show_errors:
                for error in total(baseline).errors:
                    print(f"math-verify {'FP' if not error['label'] else 'FN'} {error['where']}: "
                          f"{error['answer'][:80]!r} (gold {str(error['gold'])[:40]!r}; {error['why']})")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        record(results, baseline)
    return 1 if overall.false_positives else 0


def record(results: Mapping[tuple[str, str], KindResult],
           baseline: Mapping[tuple[str, str], KindResult] | None = None) -> None:
    """Write the table's per-env totals to ``benchmarks/results/grader_accuracy.json``, and math-verify's on
    the same lines where it ran."""
    from _results import figure, write_results

    figures = []
    for env in sorted({env for env, _ in baseline or {}}):
        cell = total(baseline or {}, env)
        figures.append(figure(f"math-verify on {env}: false-positive rate ({cell.false_positives} of {cell.negatives} "
                              "wrong answers accepted)", cell.fp_rate, unit="fraction"))
        figures.append(figure(f"math-verify on {env}: false-negative rate ({cell.false_negatives} of {cell.positives} "
                              "correct answers refused)", cell.fn_rate, unit="fraction"))
    for env in [*sorted({env for env, _ in results}), None]:
        cell = total(results, env)
        label = env or "all envs"
        figures.append(figure(f"{label}: false-positive rate ({cell.false_positives} of {cell.negatives} wrong answers "
                              "rewarded)", cell.fp_rate, unit="fraction", goal="0 false positives",
                              met=cell.false_positives == 0))
        figures.append(figure(f"{label}: false-negative rate ({cell.false_negatives} of {cell.positives} correct answers "
                              "refused)", cell.fn_rate, unit="fraction"))
        figures.append(figure(f"{label}: grading time per answer ({cell.n} answers)",
                              1000 * cell.seconds / cell.n if cell.n else 0.0, unit="ms (mean)"))
    write_results("grader_accuracy", figures)


if __name__ == "__main__":
    sys.exit(main())
