"""Length bias of a judge: its score against answer length on a labelled set, content held fixed.

The labelled set pairs good answers (they state the facts asked for) with bad ones (they do not), each padded with
neutral filler sentences to several lengths, so length varies while content does not. A judge without length bias
scores each answer the same at every length and ranks good above bad. Two criteria are compared side by side with
the same judge: a checklist question (it names the facts to look for) and an open question ("is this a good
report?"), the baseline, which leaves the judge to its own taste, where length bias lives.

    python benchmarks/judge_bias.py                                   # the scripted stand-in judge
    python benchmarks/judge_bias.py --judge openai:http://127.0.0.1:8000/v1#judge   # your judge

Prints, per criterion, the mean score per length and label, the Pearson correlation of score with length, and the
labelled accuracy (good scored above bad at equal length); writes benchmarks/results/judge_bias.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

FACTS = [
    ("France", "Paris", "euro"), ("Japan", "Tokyo", "yen"), ("Peru", "Lima", "sol"), ("Kenya", "Nairobi", "shilling"),
    ("Norway", "Oslo", "krone"), ("Chile", "Santiago", "peso"), ("Egypt", "Cairo", "pound"), ("India", "New Delhi", "rupee"),
]
FILLER = ("It is a country with a long history and many visitors every year. ",
          "Its landscapes range from coasts to mountains, and its people speak of it with pride. ",
          "Travellers often remark on its food, its music and its festivals. ")
PADS = (0, 2, 5, 10)


def labelled_set() -> list[dict[str, object]]:
    """(country, answer, label, length) rows: a good and a bad answer per country, each at every padding."""
    rows = []
    for country, capital, currency in FACTS:
        good = f"{country}: the capital is {capital} and the currency is the {currency}. "
        bad = f"{country}: I could not find the capital or the currency. "
        for label, core in (("good", good), ("bad", bad)):
            for pad in PADS:
                text = core + "".join(FILLER[i % len(FILLER)] for i in range(pad))
                rows.append({"country": country, "capital": capital, "currency": currency, "label": label,
                             "pad": pad, "answer": text.strip()})
    return rows


def pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = sum((x - mx) ** 2 for x in xs) ** 0.5
    sy = sum((y - my) ** 2 for y in ys) ** 0.5
    return 0.0 if sx == 0 or sy == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judge", default="scripted-naive", help="judge policy spec (openai:URL#MODEL, hf:MODEL, ...)")
    args = p.parse_args(argv)
    from agentgym.rewards import JudgeCriterion, Rubric, RubricSample
    from agentgym.rollout.judging import PolicyJudge, judge_policy

    rows = labelled_set()
    judge = PolicyJudge(judge_policy(args.judge), retries=1)
    results: dict[str, dict[str, object]] = {}
    started = time.perf_counter()
    for name in ("checklist", "open"):
        scores = []
        for row in rows:
            question = (f"Does the report give the capital [{row['capital']}] and the currency [{row['currency']}]?"
                        if name == "checklist" else "Is this a good, informative report about the country?")
            rubric = Rubric(name, (JudgeCriterion("q", question),))
            sample = RubricSample(task_id=str(row["country"]), task=f"Write a short report on {row['country']}.",
                                  answer=str(row["answer"]))
            result = rubric.evaluate(sample, judge)
            scores.append(result.score)
        valid = [(len(str(r["answer"])), s, r) for r, s in zip(rows, scores) if s is not None]
        corr = pearson([float(n) for n, _, _ in valid], [float(s) for _, s, _ in valid])
        by = {(r["label"], r["pad"]): [] for r in rows}
        for _, s, r in valid:
            by[(r["label"], r["pad"])].append(s)
        table = {f"{label}/pad{pad}": statistics.fmean(v) if v else None for (label, pad), v in by.items()}
        wins = total = 0
        for country, *_ in FACTS:
            for pad in PADS:
                good = [s for _, s, r in valid if r["country"] == country and r["pad"] == pad and r["label"] == "good"]
                bad = [s for _, s, r in valid if r["country"] == country and r["pad"] == pad and r["label"] == "bad"]
                if good and bad:
                    total += 1
                    wins += good[0] > bad[0]
        # the worst case a padder exploits: a bad answer padded to the longest against a good answer left short
        long_bad = statistics.fmean(by[("bad", PADS[-1])]) if by[("bad", PADS[-1])] else None
        short_good = statistics.fmean(by[("good", 0)]) if by[("good", 0)] else None
        results[name] = {"length_correlation": corr, "accuracy": wins / total if total else None,
                         "errors": sum(s is None for s in scores), "by_label_and_pad": table,
                         "long_bad_minus_short_good": None if long_bad is None or short_good is None
                         else long_bad - short_good}
        print(f"{name:9s} score-length correlation {corr:+.3f}  labelled accuracy {results[name]['accuracy']}  "
              f"judge errors {results[name]['errors']}")
        for label in ("good", "bad"):
            print("   " + label + ": " + "  ".join(f"pad {pad}: {table[f'{label}/pad{pad}']}" for pad in PADS))
    ratio = (abs(results["checklist"]["length_correlation"]) / abs(results["open"]["length_correlation"])  # type: ignore[arg-type]
             if results["open"]["length_correlation"] else None)
    print(f"|length correlation| checklist / open: {ratio}; judge calls {judge.calls}; "
          f"{time.perf_counter() - started:.1f} s")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _results import figure, write_results

    workload = f"{len(rows)} labelled answers ({len(FACTS)} countries x good/bad x {len(PADS)} lengths), judge {args.judge}"
    write_results("judge_bias", [
        figure(f"{workload}: Pearson correlation of judge score with answer length",
               round(float(results["checklist"]["length_correlation"]), 4),  # type: ignore[arg-type]
               round(float(results["open"]["length_correlation"]), 4), ratio=ratio, unit="r",  # type: ignore[arg-type]
               goal="checklist |r| < open |r|", met=ratio is not None and ratio < 1,
               note="agentgym column: a checklist criterion; baseline: an open criterion, same judge; lower |r| is less "
                    "length bias"),
        figure(f"{workload}: labelled accuracy (good scored above bad at equal length)",
               results["checklist"]["accuracy"], results["open"]["accuracy"], unit="fraction"),  # type: ignore[arg-type]
    ], details=results, note="The scripted judge is a deliberately length-biased stand-in; run with --judge for a real one.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
