"""``benchmarks/studies/held_out_replica.py``: a finished study's models scored again task by task, the paired
errors, the replay check against what the runs logged, and the cache beside each run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.helpers.scripts import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from studies import catalogue as cat  # noqa: E402
from studies import held_out_replica as replica  # noqa: E402
from studies import run as study_run  # noqa: E402


def test_paired_errors_over_seeds_and_tasks() -> None:
    a = [[1, 1, 0, 0], [1, 0, 1, 0]]  # two seeds, four tasks
    b = [[0, 0, 0, 0]]  # the warm start: one model
    numbers = replica.paired(a, b)
    assert numbers["difference"] == pytest.approx(0.5)
    assert numbers["se_seeds"] == pytest.approx(0.0)  # both seeds solve half
    per_task = [1.0, 0.5, 0.5, 0.0]  # the seed-mean gain on each task
    spread = math.sqrt(sum((d - 0.5) ** 2 for d in per_task) / 3)
    assert numbers["se_tasks"] == pytest.approx(spread / 2)
    assert numbers["se"] == pytest.approx(spread / 2)
    uneven = replica.paired([[1, 1, 1, 1], [0, 0, 0, 0]], b)  # seeds that disagree entirely
    assert uneven["se_seeds"] == pytest.approx(0.5)
    assert uneven["se_tasks"] == pytest.approx(0.0)  # every task's seed-mean gain is the same 0.5
    bar = replica.Comparison("x", "start", 0.10, "gain")
    assert replica.judge(bar, {"difference": 0.12, "se": 0.05})
    assert not replica.judge(bar, {"difference": 0.12, "se": 0.07}), "needs more than 2 se"
    assert not replica.judge(bar, {"difference": 0.09, "se": 0.01}), "needs the bar"


def test_the_goal_comparisons_follow_the_study() -> None:
    grpo = replica.comparisons(cat.STUDIES["grpo_babyai_mini_batches_30_steps"])
    assert [(c.a, c.b, c.bar) for c in grpo[:2]] == [("grpo_seq_mean_mb4", "grpo_shuffled_seq_mean_mb4", 0.0),
                                                     ("grpo_seq_mean_mb4", "start", 0.10)]
    gigpo = replica.comparisons(cat.STUDIES["gigpo_vs_grpo_babyai_mini_batches_30_steps"])
    assert (gigpo[1].a, gigpo[1].b, gigpo[1].bar) == ("gigpo_equal_scale_seq_mean_mb4", "grpo_seq_mean_mb4", 0.10)


def test_a_finished_smoke_study_is_scored_again_on_two_splits(tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    name, workdir = "grpo_babyai_mini_batches", tmp_path / "runs"
    argv = ["--scale", "smoke", "--seeds", "1", "--workdir", str(workdir), "--out", str(tmp_path)]
    assert replica.main([name, *argv]) == 2  # nothing trained yet: says which command trains it
    assert "train the study first: agentgym study grpo_babyai_mini_batches --scale smoke" in capfd.readouterr().err
    assert study_run.main([name, *argv]) == 0
    scored = [name, *argv, "--split", "test_large", "--split", "test_replica", "--jobs", "1"]
    assert replica.main(scored) == 0
    printed = capfd.readouterr().out
    assert "its run logged" in printed and "DIFFERENT" not in printed  # the replay equals the runs' own evaluation
    record = json.loads((tmp_path / f"held_out_{name}.json").read_text())
    details = record["details"]
    assert details["replayed_equal_logged"] and details["splits"] == ["test_large", "test_replica"]
    tasks = details["tasks"]
    assert set(details["outcomes"]) == {f"{m}/seed0/{s}" for m in ("start", *cat.runs_of(cat.STUDIES[name]))
                                        for s in ("test_large", "test_replica")}
    assert all(len(o) == tasks and set(o) <= {"0", "1"} for o in details["outcomes"].values())
    assert {r["split"] for r in details["comparisons"]} == {"test_large", "test_replica", "pooled"}
    assert all(r["tasks"] == 2 * tasks for r in details["comparisons"] if r["split"] == "pooled")
    cached = {json.loads(p.read_text())["success"] for p in (workdir / "held_out_cache").glob("*.json")}
    assert details["outcomes"]["grpo_seq_mean_mb4/seed0/test_replica"] in cached
    # one file per weights and split: runs whose weights are the same (an untrained smoke step) share theirs
    models = replica.study_models(cat.STUDIES[name], "smoke", workdir, 1)
    keys = {replica.cache_key(m, s, tasks) for m in models for s in ("test_large", "test_replica")}
    assert {p.stem for p in (workdir / "held_out_cache").glob("*.json")} == keys
    assert replica.main([*scored, "--split", "no_such_split"]) == 2
    assert "has no such split" in capfd.readouterr().err
    # a run whose logged evaluation the replay does not reproduce is named, and the command fails
    metrics = workdir / f"{name}-smoke" / "grpo_seq_mean_mb4" / "seed0" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    last = max(i for i, r in enumerate(records) if "eval/success_rate" in r)
    records[last]["eval/success_rate"] += 0.5
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert replica.main(scored) == 1
    assert "grpo_seq_mean_mb4 seed 0:" in capfd.readouterr().err
    records[last]["eval/success_rate"] -= 0.5
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    from agentgym.cli.main import main

    # the same through the study command: its own split only at the smoke scale, every outcome from the cache
    assert main(["study", name, *argv, "--held-out-again"]) == 0
    again = json.loads((tmp_path / f"held_out_{name}.json").read_text())["details"]
    assert again["splits"] == ["test_large"] and again["replayed_equal_logged"]
    assert again["outcomes"] == {k: v for k, v in details["outcomes"].items() if k.endswith("/test_large")}
    with pytest.raises(SystemExit):  # what it would score is not what those flags describe
        study_run.parse_args([name, "--held-out-again", "--steps", "2"])
    assert "drop --steps" in capfd.readouterr().err
    assert replica.main([*scored, "--learning-rate", "0.5"]) == 2  # no runs were trained at that rate
    assert "--learning-rate 0.5" in capfd.readouterr().err


def test_the_further_held_out_splits_are_as_large_as_the_first_and_share_no_seed_with_it() -> None:
    pytest.importorskip("minigrid")
    from agentgym.registration.suites import load_suite

    suite = load_suite("babyai-goto")
    splits = ["test_large", *cat.FURTHER_HELD_OUT_SPLITS["babyai"]]
    seeds = [{t.metadata["seed"] for t in suite.split(name)} for name in splits]
    assert [len(s) for s in seeds] == [400] * len(splits)
    assert sum(len(s) for s in seeds) == len(set().union(*seeds))


def test_the_goal_table_reads_the_pooled_verdict_where_the_models_were_held_out_again(tmp_path: Path) -> None:
    import shutil

    from studies import research_pages

    name = "grpo_babyai_mini_batches_30_steps"
    shutil.copy(research_pages.RESULTS / f"study_{name}.json", tmp_path)
    details = json.loads((tmp_path / f"study_{name}.json").read_text())["details"]
    for goal in details["goals"]:
        goal["met"] = True
    (tmp_path / f"study_{name}.json").write_text(json.dumps({"details": details}))
    assert research_pages._study_row(name, tmp_path).endswith("| yes |")  # the study's own split: met

    def row(split: str, met: bool, is_goal: bool = True) -> dict[str, object]:
        return {"a": "grpo_seq_mean_mb4", "b": "start", "bar": 0.10, "is_goal": is_goal, "split": split, "tasks": 800,
                "difference": 0.089, "se": 0.020, "se_seeds": 0.003, "se_tasks": 0.019, "a_mean": 0.336,
                "b_mean": 0.247, "a_per_seed": [0.3], "met": met}

    again = {"scale": "goal", "splits": ["test_large", "test_replica"], "tasks": 400, "replayed_equal_logged": True,
             "comparisons": [row("test_large", True), row("pooled", False), row("pooled", True, is_goal=False)]}
    (tmp_path / f"held_out_{name}.json").write_text(json.dumps({"details": again}))
    text = research_pages._study_row(name, tmp_path)
    assert "held out again on 800 rooms (test_large, test_replica), paired: grpo_seq_mean_mb4 - start +0.089" in text
    assert text.endswith("| no on the 800 rooms pooled (0 of 1 goals); yes on `test_large` alone |")
    page, _ = research_pages.study_section(cat.STUDIES[name], research_pages.load(name, tmp_path), tmp_path)
    assert "**Status: not met on the 800 held-out rooms it was scored on again (below); met on `test_large` alone.**" \
        in page
    again["comparisons"][1]["met"] = True
    (tmp_path / f"held_out_{name}.json").write_text(json.dumps({"details": again}))
    assert research_pages._study_row(name, tmp_path).endswith("| yes |")
    again["scale"] = "smoke"  # a smoke scoring measures nothing
    (tmp_path / f"held_out_{name}.json").write_text(json.dumps({"details": again}))
    assert "held out again" not in research_pages._study_row(name, tmp_path)
