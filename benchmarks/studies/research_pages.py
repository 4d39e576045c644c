"""Write the research pages of the learning studies, ``docs/research/study-<method>.md``, from their result files.

Each page states every goal of its method's studies as met, not met, or not yet run, with the numbers: mean ± se
over seeds, the per-seed values, the shuffled-advantage control, and the GRPO-vs-GiGPO agreement measured before
training. Only goal-scale result files count; a smoke run checks the code path and measures nothing, so its
study still reads "not yet run". Plots are copied next to the pages (MkDocs serves only ``docs/``).

    python benchmarks/studies/research_pages.py           # rewrite the pages
    python benchmarks/studies/research_pages.py --check   # exit 1, naming the stale files, when any would change
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from studies import catalogue as cat  # noqa: E402
from studies import lr_tuning  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs" / "research"

PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "grpo": ("GRPO against its shuffled control", ("grpo_sokoban", "grpo_babyai", "grpo_textworld")),
    "gigpo": ("GiGPO against GRPO at equal scale", ("gigpo_vs_grpo", "gigpo_vs_grpo_babyai")),
    "archer": ("ArCHer against filtered BC", ("archer_vs_filtered_bc", "archer_sampled_vs_filtered_bc",
                                                    "archer_joint_vs_filtered_bc", "archer_grid_vs_filtered_bc")),
    "arpo": ("ARPO's tool calls against GRPO's", ("arpo_vs_grpo",)),
}
"""Method -> (page title, its studies)."""


def _num(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def load(name: str, results: Path) -> dict[str, Any] | None:
    """The goal-scale result of a study (the full goal scale, or its rollouts a step and held-out size with fewer
    steps, as the device script runs it: the page names the steps), or ``None`` (no file, or only a smoke run)."""
    path = results / f"study_{name}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    details = record.get("details") or {}
    return record if str(details.get("scale_name", "")).startswith("goal") else None


def tuning_lines(study: cat.Study, results: Path, record: dict[str, Any] | None) -> list[str]:
    """The learning rate a study trains at (the one its result file records, once it has run) and, when it was
    tuned, the tuning runs behind the choice."""
    sizing = ((record or {}).get("details") or {}).get("sizing") or {}
    rate, source = lr_tuning.learning_rate_of(study, results)
    if "learning_rate" in sizing and sizing["learning_rate"] != rate:  # run at another rate than today's choice
        rate, source = sizing["learning_rate"], sizing["learning_rate_source"]
    lines = [f"**Learning rate.** {rate:g}, every method and the control ({source}).", ""]
    tuned = study.learning_rate_from or study.name
    path = results / f"lr_tuning_{tuned}.json"
    if path.is_file():
        details = json.loads(path.read_text(encoding="utf-8"))["details"]
        lines += [f"Tuned with `agentgym study {tuned} --tune-learning-rate ...`: {details['method']}, seed 0, "
                  f"{details['steps']} steps of {details['rollouts_per_step']} rollouts at each rate, greedy success "
                  f"on {details['eval_tasks']} tasks of the `{details['split']}` split (drawn like the training tasks; "
                  "the held-out split is not looked at).", "",
                  "| learning rate | start | after | change |", "|---|---|---|---|"]
        for c in details["candidates"]:
            chosen = " (chosen)" if c["learning_rate"] == details["chosen"] else ""
            lines.append(f"| {c['learning_rate']:g}{chosen} | {_num(c['curve'][0][1])} | {_num(c['curve'][-1][1])} | "
                         f"{c['gain']:+.3f} |")
        lines.append("")
    return lines


def _took(study: cat.Study, results: Path) -> str:
    """How long the committed goal-scale run took in all, as a clause (empty when there is none)."""
    last = cat.measured_hours(study, results)
    if last is None:
        return ""
    return (f": the last goal-scale run took {last['hours']:.1f} h on 2 cores in all (its warm start and "
            f"{last['runs']} runs of its own, {last['jobs']} at a time)")


def _context_line(study: cat.Study) -> str:
    """How the task's rollouts keep a long history, where they do not keep all of it."""
    context = cat.task_of(study.task).context
    if not context:
        return ""
    settings = ", ".join(f"{key} {value!r}" for key, value in context.items() if key != "strategy")
    return (f" Every rollout (demonstrations, training, evaluation) keeps its context with `{context['strategy']}`"
            f"{f' ({settings})' if settings else ''}, up to {cat.task_of(study.task).max_context_tokens} tokens a "
            "segment.")


def study_section(study: cat.Study, record: dict[str, Any] | None, results: Path = RESULTS) -> tuple[str, str | None]:
    """``(markdown, plot file name or None)`` of one study."""
    scale, sizing = cat.goal_scale(study)
    hours = cat.expected_hours(study, scale, 3)
    lines = [f"## {study.name}", "", f"**Question.** {study.question}", "", f"**Goal.** {study.goal}.", "",
             f"**Design.** Task `{study.task}` (held-out split `{cat.eval_split_of(study)}`), methods "
             f"{', '.join(f'`{m}`' for m in study.methods)}, control `{study.control}` (GRPO whose advantages are "
             "permuted across the batch: the same size and spread, no credit), 3 seeds, a shared BC warm start. "
             f"Goal scale: {scale.rollouts_per_step} rollouts a step (noise scale {sizing['noise_scale']:.0f}: "
             f"{sizing['noise_source']}), {scale.steps} steps, {scale.eval_tasks} held-out tasks (one evaluation's se "
             f"{sizing['held_out_se_at_p_0.5']:.3f} at p = 0.5" +
             (f": the split is the task's whole space of {sizing['task_space']} tasks, so a greedy policy's success on it "
              "is exact" if sizing.get("task_space") and scale.eval_tasks >= sizing["task_space"] else "") +
             ("" if sizing["se_bound_met"] else
              f"; above the 0.025 target: the split has only {sizing['held_out_available']} tasks") +
             f"). Sampling alone takes about {hours:.1f} h on 2 idle cores at today's sampler rate on Sokoban (this "
             "task's episodes may run longer or shorter); the updates and evaluations come on top" +
             _took(study, results) + "." + _context_line(study), "",
             f"Run: `agentgym study {study.name}` (`--device cuda` on a GPU; `--scale smoke` checks the code path).", "",
             *tuning_lines(study, results, record)]
    if record is None:
        lines += ["**Status: not yet run** at the goal scale.", ""]
        return "\n".join(lines), None
    details = record["details"]
    goals = details.get("goals") or []
    status = ("met" if goals and all(g["met"] for g in goals) else "not met") if goals else "not met (runs failed)"
    machine = record.get("machine") or {}
    lines += [f"**Status: {status}.** Measured {record.get('date')} on commit "
              f"`{(record.get('git') or {}).get('commit', '')[:10]}`, {machine.get('cpu_count')} cores, "
              f"GPU {machine.get('gpu') or 'none'}, load average {machine.get('load_average_start')} at start "
              f"({details.get('scale_name')} scale: {len(details.get('seeds') or [])} seed(s), "
              f"{details.get('rollouts_per_step')} rollouts a step, {(details.get('scale') or {}).get('steps')} steps, "
              f"device {details.get('device')}).", ""]
    agreed = details.get("agreement") or {}
    if agreed:
        lines += [f"Before training, on {agreed.get('rollouts')} rollouts: GRPO and GiGPO advantages correlate "
                  f"{_num(agreed.get('token_correlation'))} per token, have opposite signs on "
                  f"{_num(agreed.get('sign_disagreement'), '.2%')} of tokens and one is zero where the other is not "
                  f"on {_num(agreed.get('zero_disagreement'), '.2%')}; GiGPO's step part correlates "
                  f"{_num(agreed.get('step_episode_correlation'))} with its episode part.", ""]
    lines += ["| goal | measured | se | met | note |", "|---|---|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | {_num(g['value'])} | {_num(g['se'])} | {'yes' if g['met'] else 'no'} | "
                     f"{g['note']} |")
    lines += ["", "| method | start | final (mean ± se) | per seed |", "|---|---|---|---|"]
    for method, s in (details.get("summary") or {}).items():
        lines.append(f"| {method}{' (control)' if method == study.control else ''} | {_num(s['start_mean'])} | "
                     f"{_num(s['final_mean'])} ± {_num(s['final_se'])} | {', '.join(_num(v) for v in s['final'])} |")
    plot = f"study_{study.name}.png"
    lines += ["", f"![held-out success of {study.name}](studies/{plot})", ""]
    return "\n".join(lines), plot


def render(method: str, results: Path) -> tuple[str, list[str]]:
    """A page's text and the plots it shows."""
    title, names = PAGES[method]
    parts = [f"# {title}", "",
             "<!-- generated by benchmarks/studies/research_pages.py from benchmarks/results/study_*.json -->", "",
             "A study is sized by its measured gradient noise (rollouts a step) and by the held-out error one "
             "evaluation may have (se <= 0.025: 400 tasks at p = 0.5); each goal is met only when the difference "
             "exceeds two standard errors over seeds. See `agentgym study --list`.", ""]
    plots = []
    for name in names:
        text, plot = study_section(cat.STUDIES[name], load(name, results), results)
        parts.append(text)
        if plot:
            plots.append(plot)
    return "\n".join(parts).rstrip() + "\n", plots


def expected_files(results: Path = RESULTS, docs: Path = DOCS) -> dict[Path, bytes]:
    """Every file the generator owns (the pages and the plots they show) with the bytes it should hold."""
    files: dict[Path, bytes] = {}
    for method in PAGES:
        text, plots = render(method, results)
        files[docs / f"study-{method}.md"] = text.encode()
        for plot in plots:
            source = results / plot
            if source.is_file():
                files[docs / "studies" / plot] = source.read_bytes()
    return files


def main(argv: list[str] | None = None) -> int:
    """Rewrite the stale pages, or with ``--check`` only name them (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    parser.add_argument("--results", default=str(RESULTS), help="folder of study_*.json (default benchmarks/results)")
    parser.add_argument("--docs", default=str(DOCS), help="folder of the pages (default docs/research)")
    args = parser.parse_args(argv)
    files = expected_files(Path(args.results), Path(args.docs))
    stale = [p for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
    if args.check:
        if stale:
            print("stale: " + ", ".join(str(p) for p in stale) + "; run python benchmarks/studies/research_pages.py",
                  file=sys.stderr)
            return 1
        return 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
