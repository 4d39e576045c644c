"""The learning studies (``benchmarks/studies``): every study's whole code path at the smoke scale (warm start,
agreement, each method and the control, the result file and the plot), the goal-scale sizing, the goal checks,
and the research pages generated from result files."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.helpers.scripts import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from studies import catalogue as cat  # noqa: E402
from studies import lr_tuning, research_pages  # noqa: E402
from studies import run as study_run  # noqa: E402


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workdir for every smoke study: studies on the same task share its smoke warm start."""
    return tmp_path_factory.mktemp("studies")


@pytest.mark.parametrize("name", list(cat.STUDIES))
def test_every_study_runs_its_whole_code_path_at_the_smoke_scale(name: str, workdir: Path, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    argv = [name, "--scale", "smoke", "--seeds", "1", "--out", str(tmp_path), "--workdir", str(workdir)]
    if name == "arpo_vs_grpo":  # one study through the command as documented: agentgym study NAME ...
        from agentgym.cli.main import main

        assert main(["study", *argv]) == 0
        command = json.loads((tmp_path / f"study_{name}.json").read_text())["command"]
        assert command.startswith("python benchmarks/studies/run.py arpo_vs_grpo")  # what a direct run records
    else:
        assert study_run.main(argv) == 0
    record = json.loads((tmp_path / f"study_{name}.json").read_text())
    assert (tmp_path / f"study_{name}.png").stat().st_size > 1000
    assert record["name"] == f"study_{name}" and record["git"]["commit"]
    assert len(record["machine"]["load_average_start"]) == 3
    details = record["details"]
    study = cat.STUDIES[name]
    assert [r["method"] for r in details["runs"]] == list(cat.runs_of(study))  # the methods, then the control
    assert details["control"] == study.control and details["failed"] == []
    for run in details["runs"]:
        assert [episodes for episodes, _ in run["curve"]] == [0, cat.SMOKE.rollouts_per_step]
        if cat.METHODS[run["method"]][0] in ("grpo", "grpo_shuffled", "gigpo", "arpo"):  # groups: a share of them
            assert 0.0 <= run["zero_signal_groups_mean"] <= 1.0
        if cat.METHODS[run["method"]][0] == "archer":  # the final critic, read on fresh held-out episodes
            fit = run["critic_held_out"]
            assert fit["episodes"] == cat.SMOKE.eval_tasks and fit["turns"] > 0 and fit["split"] == details["eval_split"]
            for oracle in ("distance_explained_variance", "move_explained_variance", "move_ranking"):
                value = fit[oracle]  # the maze's references for the critic's figure; None when no state shows a
                assert value is None or -1.0 <= value <= 1.0  # grid (an untrained smoke policy)
        if cat.counts_tool_calls(study):  # the final policy's own held-out evaluation again, its calls by outcome
            calls = run["tool_calls_by_outcome"]
            assert calls["episodes"] == cat.SMOKE.eval_tasks and calls["success"] == run["curve"][-1][1]
            assert calls["calls"] == pytest.approx(run["eval_mean_tool_calls"])
    assert set(details["summary"]) == set(cat.runs_of(study))
    if cat.counts_tool_calls(study):  # the training tool-call budget of both, ARPO's from the calls its envs ran
        assert details["summary"][study.methods[0]]["train_tool_calls_run"] is not None
        assert details["summary"]["grpo"]["train_tool_calls_run"] is not None
    assert {"token_correlation", "sign_disagreement", "step_episode_correlation", "grpo_drift_token_mean",
            "grpo_drift_seq_mean_token_mean"} <= set(details["agreement"])
    for method in cat.runs_of(study):  # a method's trainer overrides reach the run it trains (the loss weighting)
        trained = json.loads((workdir / f"{name}-smoke" / method / "seed0" / "study.json").read_text())["config"]
        overrides = cat.METHODS[method][1]
        assert {k: v for k, v in overrides.items() if k not in cat.SMOKE_CAPS}.items() <= trained.items(), method
        for key, cap in cat.SMOKE_CAPS.items():  # the prior episodes and critic fit, shrunk to the smoke scale
            assert key not in overrides or trained[key] == min(overrides[key], cap), (method, key)
    assert details["goals"] and all(isinstance(g["met"], bool) for g in details["goals"])
    assert record["note"].startswith("smoke scale")
    assert "GRPO vs GiGPO on" in capfd.readouterr().out
    if name == "gigpo_vs_grpo_babyai" and (workdir / "grpo_babyai-smoke").is_dir():  # grpo_babyai ran first
        shared = {r["method"]: r["shared_from"] for r in details["runs"] if r["shared_from"]}
        assert set(shared) == {"grpo", "grpo_shuffled"}, shared  # the same runs: copied, not trained again
        assert all("grpo_babyai-smoke" in source for source in shared.values())


def test_list_and_bad_names_through_the_command(capfd: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli.main import main

    assert main(["study", "--list"]) == 0
    listed = capfd.readouterr().out
    for name in cat.STUDIES:
        assert name in listed
    assert "h on 2 cores" in listed and "rollouts/step" in listed
    assert main(["study", "gigpo_vs_grp", "--scale", "smoke"]) == 2
    assert "did you mean 'gigpo_vs_grpo'" in capfd.readouterr().err
    assert main(["study", "arpo_vs_grpo", "--tune-learning-rate", "1e-4,1e-5"]) == 2  # passed on, checked there
    assert "has no tuning split" in capfd.readouterr().err


def test_goal_scale_is_sized_by_noise_and_held_out_error(tmp_path: Path) -> None:
    assert cat.held_out_needed() == 400 and cat.binomial_se(0.5, 400) == pytest.approx(0.025)
    scale, sizing = cat.goal_scale(cat.STUDIES["gigpo_vs_grpo"])
    assert scale.rollouts_per_step >= 1000 and scale.rollouts_per_step % cat.GROUP_SIZE == 0
    assert scale.eval_tasks == 400 and sizing["se_bound_met"] and sizing["noise_measured"]
    for name in ("grpo_babyai", "grpo_textworld", "archer_vs_filtered_bc"):  # the 400-task held-out splits
        scale, sizing = cat.goal_scale(cat.STUDIES[name])
        assert scale.eval_tasks == sizing["held_out_available"] == 400 and sizing["se_bound_met"], name
    assert [cat.eval_split_of(cat.STUDIES[n]) for n in ("grpo_babyai", "grpo_textworld", "archer_vs_filtered_bc")] \
        == ["test_large", "test_large", "validation_large"]
    assert cat.eval_split_of(cat.STUDIES["grpo_textworld"], "smoke") == "test"  # the smoke suite's own split
    guess_scale, guess = cat.goal_scale(cat.STUDIES["arpo_vs_grpo"])  # every one of the 100 secrets: exact
    assert guess_scale.eval_tasks == 100 and guess["held_out_se_at_p_0.5"] == 0.0 and guess["se_bound_met"]
    assert cat.binomial_se(0.5, 50, population=100) == pytest.approx(0.5 / 50 ** 0.5 * (50 / 99) ** 0.5)
    _, textworld = cat.goal_scale(cat.STUDIES["grpo_textworld"])  # sized from its own measurement
    assert textworld["noise_measured"] and "gradient_noise_textworld.json" in textworld["noise_source"]
    empty = tmp_path / "no-results"
    empty.mkdir()
    assert cat.noise_scale("textworld", "grpo", empty)[1].startswith("not measured: run python benchmarks/gradient_noise.py")


def test_a_tasks_own_noise_file_sizes_its_studies(tmp_path: Path) -> None:
    record = {"details": {"task": "babyai", "batches": 4, "rollouts_per_batch": 64,
                          "variants": {"grpo": {"noise_scale": 321.0}}}}
    (tmp_path / "gradient_noise_babyai.json").write_text(json.dumps(record))
    value, source = cat.noise_scale("babyai", "grpo", tmp_path)
    assert value == 321.0 and "gradient_noise_babyai.json (4 batches of 64 rollouts)" in source
    assert cat.noise_scale("maze", "grpo", tmp_path)[0] is None  # another task's file sizes nothing here


def test_a_labelled_noise_file_sizes_a_study_only_at_the_warm_start_of_the_tasks_own(tmp_path: Path) -> None:
    """``gradient_noise.py --label``: more variants at the warm start size studies; figures at a trained model never
    do (a study is sized before it trains)."""
    def write(name: str, model: str, variants: dict[str, float]) -> None:
        details = {"task": "babyai", "model": model, "batches": 6, "rollouts_per_batch": 256,
                   "variants": {k: {"noise_scale": v} for k, v in variants.items()}}
        (tmp_path / name).write_text(json.dumps({"details": details}))

    write("gradient_noise_babyai.json", "runs/studies/warm-babyai", {"grpo": 131.0})
    write("gradient_noise_babyai_step40.json", "runs/trained/model", {"grpo_seq_mean": 389.0})
    assert cat.noise_scale("babyai", "grpo_seq_mean", tmp_path)[0] is None  # only a trained model's figure
    write("gradient_noise_babyai_seq_mean.json", "runs/studies/warm-babyai", {"grpo_seq_mean": 300.0})
    value, source = cat.noise_scale("babyai", "grpo_seq_mean", tmp_path)
    assert value == 300.0 and "gradient_noise_babyai_seq_mean.json" in source and "warm-babyai" in source
    assert cat.noise_scale("babyai", "grpo", tmp_path)[0] == 131.0  # the task's own file first
    write("gradient_noise_babyai_twelve.json", "runs/studies/warm-babyai", {"grpo": 1307.0})
    (tmp_path / "gradient_noise_babyai_twelve.json").write_text(json.dumps({"details": {
        **json.loads((tmp_path / "gradient_noise_babyai_twelve.json").read_text())["details"], "batches": 12}}))
    value, source = cat.noise_scale("babyai", "grpo", tmp_path)  # the measurement on more rollouts wins
    assert value == 1307.0 and "gradient_noise_babyai_twelve.json (12 batches of 256" in source


def test_a_study_that_ran_keeps_the_noise_figure_it_was_sized_by() -> None:
    """A later, better measurement must not resize a study whose runs exist (they would be trained again at
    another size); its design line says both figures."""
    for name in ("grpo_babyai_mini_batches", "gigpo_vs_grpo_babyai_mini_batches_30_steps"):
        scale, sizing = cat.goal_scale(cat.STUDIES[name])
        assert scale.rollouts_per_step == 136 and sizing["noise_scale"] == 131.0
        assert "figure of record when the study ran; measured since:" in sizing["noise_source"]
    scale, sizing = cat.goal_scale(cat.STUDIES["grpo_babyai_noise_sized"])
    assert scale.rollouts_per_step > 136 and "measured today" not in sizing["noise_source"]


def test_studies_sized_by_other_noise_share_and_extend_no_runs() -> None:
    sized = cat.STUDIES["grpo_babyai_noise_sized"]
    assert sized.noise_variant == "grpo_seq_mean" and cat.rate_source(sized) == "grpo_babyai_mini_batches"
    assert cat.shared_runs(sized) == () and cat.extended_study(sized) is None
    gigpo = cat.STUDIES["gigpo_vs_grpo_babyai_noise_sized"]  # sized alike: GRPO's and the control's runs are its own
    assert cat.same_size(gigpo, sized) and cat.rate_source(gigpo) == cat.rate_source(sized)
    assert cat.shared_runs(gigpo) == ("grpo_seq_mean_mb4", "grpo_shuffled_seq_mean_mb4")
    assert cat.extended_study(cat.STUDIES["grpo_babyai_mini_batches_40_steps"]).name \
        == "grpo_babyai_mini_batches_30_steps"


def test_fewer_steps_make_a_labelled_scale_never_the_goal(capfd: pytest.CaptureFixture[str]) -> None:
    """The device script's run: the goal's rollouts a step and held-out size, fewer steps, named so."""
    goal, _ = cat.goal_scale(cat.STUDIES["gigpo_vs_grpo"])
    scale, name = study_run.override(goal, "goal", 2, 200)
    assert name == "goal, 2 steps" and scale.steps == 2 and scale.eval_every == 2 and scale.bc_steps == 200
    assert scale.rollouts_per_step == goal.rollouts_per_step and scale.eval_tasks == goal.eval_tasks
    assert study_run.override(goal, "goal", None, None) == (goal, "goal")
    with pytest.raises(SystemExit):
        study_run.parse_args(["gigpo_vs_grpo", "--steps", "0"])
    assert "--steps must be >= 1" in capfd.readouterr().err


def test_the_device_script_calls_the_study_as_it_parses_and_stops_at_once_without_a_gpu(tmp_path: Path) -> None:
    """The script runs only on a lent GPU, so here: every run.py call in it parses with its defaults filled in, and
    on a machine without CUDA it stops before any work, saying why, and writes nothing."""
    import os
    import re
    import shlex
    import subprocess

    script = REPO / "benchmarks" / "studies" / "device_headline.sh"
    text = script.read_text()
    defaults = dict(re.findall(r"^(\w+)=\$\{\w+:-([^}]*)\}$", text, flags=re.M))
    assert {"SEEDS", "STEPS", "BC_STEPS", "JOBS", "BUDGET_S", "RESULTS_DIR", "WORKDIR"} <= set(defaults)
    calls = re.findall(r"^[^#\n]*python benchmarks/studies/run\.py ((?:\\\n|[^\n])*)", text, flags=re.M)
    assert len(calls) == 2  # the smoke and the headline run
    for call in calls:
        words = shlex.split(re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), "x"),
                                   call.replace("\\\n", " ")))
        args = study_run.parse_args(words)
        assert args.name == "gigpo_vs_grpo" and args.device == "cuda"
    if __import__("torch").cuda.is_available():
        pytest.skip("a GPU is here: the script would run for minutes")
    env = {**os.environ, "RESULTS_DIR": str(tmp_path / "results"), "WORKDIR": str(tmp_path / "runs")}
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0 and "no CUDA device visible to torch" in done.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


def _runs(finals: dict[str, list[float]], start: float = 0.3, calls: dict[str, float] | None = None,
          calls_run: dict[str, float] | None = None) -> list[dict]:
    return [{"method": m, "seed": s, "curve": [(0, start), (100, v)], "critic_explained_variance": 0.6,
             "critic_explained_variance_held_out": 0.55, "eval_mean_tool_calls": (calls or {}).get(m),
             "train_tool_calls_run_mean": (calls_run or {}).get(m)}
            for m, values in finals.items() for s, v in enumerate(values)]


def test_goals_need_the_bar_and_two_standard_errors() -> None:
    grpo = cat.STUDIES["grpo_sokoban"]
    clear = study_run.goals(grpo, study_run.summarize(_runs({"grpo": [0.45, 0.46, 0.47], "grpo_shuffled": [0.3, 0.31, 0.29]}), 400))
    assert [g["met"] for g in clear] == [True, True]
    noisy = study_run.goals(grpo, study_run.summarize(_runs({"grpo": [0.1, 0.8, 0.4], "grpo_shuffled": [0.3, 0.31, 0.29]}), 400))
    assert [g["met"] for g in noisy] == [False, False]  # +0.13 on average, but inside the seeds' spread
    arpo = cat.STUDIES["arpo_vs_grpo"]
    finals = {"arpo": [0.5] * 3, "grpo": [0.5] * 3, "grpo_shuffled": [0.1] * 3}
    rows = study_run.goals(arpo, study_run.summarize(_runs(finals, calls={"arpo": 3.0, "grpo": 5.0},
                                                           calls_run={"arpo": 4.0, "grpo": 6.0}), 64))
    assert [g["met"] for g in rows] == [True] * 4 and rows[2]["value"] == pytest.approx(0.6)
    assert rows[3]["value"] == pytest.approx(4 / 6) and "ARPO 4.00, GRPO 6.00" in rows[3]["note"]
    # ARPO runs logged before the sampler counted the calls its envs ran: the training-budget row is not met
    uncounted = study_run.goals(arpo, study_run.summarize(_runs(finals, calls={"arpo": 3.0, "grpo": 5.0},
                                                                calls_run={"grpo": 6.0}), 64))[3]
    assert uncounted["value"] is None and not uncounted["met"] and "not counted" in uncounted["note"]
    # a policy that never calls the tool (an untrained smoke model): counted, but there is nothing to divide by
    no_calls = study_run.goals(arpo, study_run.summarize(_runs(finals, calls_run={"arpo": 0.0, "grpo": 0.0}), 64))[3]
    assert no_calls["value"] is None and not no_calls["met"] and "made no tool call" in no_calls["note"]
    # Half the episodes fail at the 8-call cap: 0.8x of GRPO's 7.0 leaves (5.6 - 0.5 * 8) / 0.5 = 3.2 per solved one.
    runs = _runs({"arpo": [0.5] * 3, "grpo": [0.5] * 3, "grpo_shuffled": [0.1] * 3}, calls={"arpo": 6.0, "grpo": 7.0})
    for run in runs:
        run["tool_calls_by_outcome"] = {"calls_solved": 4.0 if run["method"] == "arpo" else 6.0, "calls_failed": 8.0}
    note = study_run.goals(arpo, study_run.summarize(runs, 64))[2]["note"]
    assert "per solved episode: ARPO 4.00, GRPO 6.00" in note and "solved episodes of <= 3.20 calls" in note, note
    # ARPO in another configuration leads its own study: the same rows, read from that method's runs
    one_fresh = cat.STUDIES["arpo_one_fresh_vs_grpo"]
    assert cat.counts_tool_calls(one_fresh) and not cat.counts_tool_calls(cat.STUDIES["grpo_sokoban"])
    finals = {"arpo_one_fresh": [0.5] * 3, "grpo": [0.5] * 3, "grpo_shuffled": [0.1] * 3}
    rows = study_run.goals(one_fresh, study_run.summarize(_runs(finals, calls={"arpo_one_fresh": 7.0, "grpo": 7.0},
                                                                calls_run={"arpo_one_fresh": 4.2, "grpo": 6.0}), 64))
    assert [g["met"] for g in rows] == [True, True, False, True] and rows[3]["value"] == pytest.approx(0.7)
    # seeds that disagree: 0.71x on average, but the seed-by-seed ratios (0.50, 0.92, 0.72) put 0.8 inside 2 se
    noisy = _runs(finals, calls={"arpo_one_fresh": 7.0, "grpo": 7.0}, calls_run={"grpo": 6.0})
    for run, calls_run in zip((r for r in noisy if r["method"] == "arpo_one_fresh"), (3.0, 5.5, 4.3)):
        run["train_tool_calls_run_mean"] = calls_run
    budget = study_run.goals(one_fresh, study_run.summarize(noisy, 64))[3]
    assert budget["value"] == pytest.approx(12.8 / 18) and budget["se"] == pytest.approx(0.1201, abs=1e-3)
    assert not budget["met"] and "(by more than 2 se)" in budget["goal"]


def test_the_critic_goal_reads_held_out_trajectories_not_its_own_batches() -> None:
    """A critic that fits its replay batches (0.9) but not fresh held-out episodes (0.2) misses the goal."""
    study = cat.STUDIES["archer_vs_filtered_bc"]
    runs = _runs({"archer_observation": [0.6] * 3, "archer": [0.4] * 3, "filtered_bc": [0.5] * 3,
                  "grpo_shuffled": [0.3] * 3})
    for r in runs:
        r.update(critic_explained_variance=0.9, critic_explained_variance_held_out=0.2)
    critic = study_run.goals(study, study_run.summarize(runs, 400))[-1]
    assert "held-out" in critic["goal"] and critic["value"] == pytest.approx(0.2) and not critic["met"]
    assert "0.900" in critic["note"] and "0.200, 0.200, 0.200" in critic["note"]


def test_research_pages_state_each_goal_from_goal_scale_files_only(tmp_path: Path) -> None:
    import torch
    import transformers

    study = cat.STUDIES["archer_vs_filtered_bc"]
    scale, sizing = cat.goal_scale(study)
    runs = _runs({"archer_observation": [0.6, 0.62, 0.64], "archer": [0.4, 0.42, 0.41], "filtered_bc": [0.5, 0.5, 0.52],
                  "grpo_shuffled": [0.3, 0.3, 0.3]})
    agreed = {"rollouts": 64, "token_correlation": 0.9, "sign_disagreement": 0.01, "zero_disagreement": 0.2,
              "step_episode_correlation": 0.8}
    study_run.write(study, "goal", scale, sizing, [0, 1, 2], "cpu", {}, agreed, runs, [], tmp_path, 1.0)
    text, plots = research_pages.render("archer", tmp_path)
    assert "**Status: met.**" in text and "| archer_observation | 0.300 | 0.620 ± 0.012 | 0.600, 0.620, 0.640 |" in text
    assert "correlate 0.900 per token" in text and plots == ["study_archer_vs_filtered_bc.png"]
    assert f"Packages: torch {torch.__version__}, transformers {transformers.__version__}" in text  # as installed
    assert "not yet run" in research_pages.render("gigpo", tmp_path)[0]
    smoke = json.loads((tmp_path / "study_archer_vs_filtered_bc.json").read_text())
    smoke["details"]["scale_name"] = "smoke"  # a smoke run measures nothing: the page still says not yet run
    (tmp_path / "study_archer_vs_filtered_bc.json").write_text(json.dumps(smoke))
    assert "not yet run" in research_pages.render("archer", tmp_path)[0]
    drift = {**agreed, "grpo_drift_token_mean": -0.078, "grpo_drift_seq_mean_token_mean": 0.0, "mean_abs_episode_level": 0.295,
             "tokens_solved_mean": 30.0, "tokens_failed_mean": 56.9}  # a record that measured the loss's length bias
    study_run.write(study, "goal", scale, sizing, [0, 1, 2], "cpu", {}, drift, runs, [], tmp_path, 1.0)
    assert "GRPO's net advantage on the batch's tokens is -0.078 under `token-mean`" in research_pages.render("archer", tmp_path)[0]


def test_every_study_has_a_research_page() -> None:
    paged = [name for _, names in research_pages.PAGES.values() for name in names]
    assert sorted(paged) == sorted(cat.STUDIES)


def test_the_index_goal_table_reads_each_study_and_the_sampler_from_their_result_files(tmp_path: Path) -> None:
    """One row per study: not yet run without a goal-scale file; with one, the lead method's start -> final (mean ±
    se, per seed), the baseline, the control and how many goals were met; the sampler row reads its ratio."""
    study = cat.STUDIES["arpo_vs_grpo"]
    scale, sizing = cat.goal_scale(study)
    runs = _runs({"arpo": [0.4, 0.42, 0.44], "grpo": [0.4, 0.4, 0.4], "grpo_shuffled": [0.2, 0.2, 0.2]})
    study_run.write(study, "goal", scale, sizing, [0, 1, 2], "cpu", {}, {}, runs, [], tmp_path, 1.0)
    page = "# Research\n\nbefore\n<!-- goals:start -->\nstale\n<!-- goals:end -->\nafter\n"
    text = research_pages.index_text(page, tmp_path)
    assert text.startswith("# Research\n\nbefore\n<!-- goals:start") and text.endswith("<!-- goals:end -->\nafter\n")
    assert "stale" not in text
    row = next(line for line in text.splitlines() if "[arpo_vs_grpo](study-arpo.md#arpo_vs_grpo)" in line)
    assert "arpo 0.300 -> **0.420 ± 0.012** (0.400, 0.420, 0.440); grpo 0.400; grpo_shuffled (control) 0.200" in row
    assert row.endswith("goals) |") and "| no (" in row
    assert "[grpo_sokoban](study-grpo.md#grpo_sokoban) | not yet run at the goal scale | - |" in text
    assert "| `benchmarks/sampler.py` | not yet run | - |" in text  # no sampler.json in tmp_path
    (tmp_path / "sampler.json").write_text(json.dumps({"figures": [
        {"what": "512 rollouts: continuous; baseline: the commit's sampler", "agentgym": 20.0, "baseline": 2.0,
         "ratio": 10.0, "goal": ">= 10x", "met": True},
        {"what": "the floor: ...", "agentgym": 1.0, "baseline": 12.0, "ratio": 12.0}]}))
    sampler = research_pages.index_text(page, tmp_path)
    assert "10.00x (20.0 against 2.0 rollouts/s, the commit's sampler); the most a float32 sampler could gain" in sampler
    assert "12.00x | yes |" in sampler
    with pytest.raises(ValueError, match="goal-table markers"):
        research_pages.index_text("# no markers\n", tmp_path)


def test_a_reduced_run_and_the_gpu_sampler_are_labelled_as_what_they_are(tmp_path: Path) -> None:
    """A run with fewer steps or seeds than the goal scale (a time-boxed device run) says so in the goal table and
    on its page, with its warm start beside it; the GPU sampler row reads sampler_gpu.json."""
    study = cat.STUDIES["arpo_vs_grpo"]
    scale, sizing = cat.goal_scale(study)
    scale = replace(scale, steps=2)
    runs = _runs({"arpo": [0.4], "grpo": [0.4], "grpo_shuffled": [0.2]})
    warm = {"bc_steps": 200, "train_success_curve": [[100, 0.0], [200, 0.125]], "target": 0.5, "demonstrations": 200,
            "device": "cuda"}
    study_run.write(study, "goal, 2 steps", scale, sizing, [0], "cuda", warm, {}, runs, [], tmp_path, 1.0)
    page = "<!-- goals:start -->\n<!-- goals:end -->\n"
    row = next(line for line in research_pages.index_text(page, tmp_path).splitlines() if "[arpo_vs_grpo]" in line)
    assert "*reduced run: 2 of 20 steps, 1 of 3 seeds*" in row and row.endswith("in a reduced run |")
    text, _ = research_pages.study_section(study, research_pages.load("arpo_vs_grpo", tmp_path), tmp_path)
    assert "**A reduced run**: 2 of the goal's 20 steps, 1 of its 3 seeds" in text
    assert "**Status: not met in a reduced run.**" in text
    assert "cloned for 200 BC steps on cuda: greedy success on 64 training tasks 0.125, short of its target 0.500" in text
    assert "| `benchmarks/sampler.py --device cuda` | not yet run on a GPU | - |" in research_pages.index_text(
        page, tmp_path)
    (tmp_path / "sampler_gpu.json").write_text(json.dumps({
        "date": "2026-11-30T17:48:12+00:00", "machine": {"gpu": "NVIDIA H200"},
        "details": {"matmul_gflops": {"model_shapes": 2000.0}},
        "figures": [{"what": "512 rollouts: continuous batching; baseline: today's reference loop", "agentgym": 42.0,
                     "baseline": 30.0, "ratio": 1.4, "unit": "rollouts/s"},
                    {"what": "model FLOP rate (estimate) against measured matmul", "agentgym": 120.0,
                     "baseline": 90.0, "unit": "GFLOP/s"},
                    {"what": "the floor: ...", "agentgym": 3.0, "baseline": 17.0, "ratio": 5.9, "unit": "s"}]}))
    gpu = research_pages.index_text(page, tmp_path)
    assert ("42.0 rollouts/s on NVIDIA H200, 1.40x today's reference loop there (30.0); 6% of its matmul rate at the "
            "model's shapes; the float32 floor: 5.90x | recorded (2026-11-30) |") in gpu


def test_committed_research_pages_are_generated_from_the_committed_results() -> None:
    assert research_pages.main(["--check"]) == 0, "run python benchmarks/studies/research_pages.py and commit"


def test_agreement_alone_through_the_command(workdir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``agentgym study NAME --agreement`` measures GRPO vs GiGPO on the study's rollouts and trains nothing."""
    from agentgym.cli.main import main

    assert main(["study", "arpo_vs_grpo", "--scale", "smoke", "--agreement", "--out", str(tmp_path),
                 "--workdir", str(workdir)]) == 0
    assert "GRPO vs GiGPO on 8 rollouts" in capfd.readouterr().out
    assert not list(tmp_path.glob("study_*.json"))  # no result file: nothing was trained


def test_maze_oracles_explain_returns_that_depend_on_the_distance_and_the_move() -> None:
    from types import SimpleNamespace

    from studies.critic_fit import maze_oracles

    def grid(row: int) -> str:  # @ in column 1 of row `row`, the exit two columns right of it in row 4, no walls
        cells = [["."] * 5 for _ in range(5)]
        cells[row][1], cells[4][3] = "@", "E"
        return "You moved.\n" + "\n".join(["#" * 7] + ["#" + "".join(r) + "#" for r in cells] + ["#" * 7])

    def turn(row: int, to: int, mc_return: float, state: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(state=state or grid(row), next_state=grid(to), mc_return=mc_return, terminated=False,
                               reward=0.0)

    def explained(turns: list[SimpleNamespace]) -> tuple[float | None, float | None]:
        oracles = maze_oracles(turns)
        return oracles["distance_explained_variance"], oracles["move_explained_variance"]

    # the return is a function of the distance alone: both explain all of it
    distance, move = explained([turn(r, r, 0.9 ** (4 - r)) for r in (0, 2, 4) for _ in range(3)])
    assert distance == pytest.approx(1.0) and move == pytest.approx(1.0)
    # one distance, the return set by the move (south heads for the exit, north leads away): only the move oracle
    distance, move = explained([turn(2, 3, 1.0), turn(2, 1, 0.0)] * 4)
    assert distance == pytest.approx(0.0, abs=1e-6) and move == pytest.approx(1.0)
    # coin flips at one distance and move: nothing to explain; an error observation (no grid) is its own group
    flips = [turn(0, 0, float(i % 2)) for i in range(8)]
    assert explained(flips) == (pytest.approx(0.0, abs=1e-6), pytest.approx(0.0, abs=1e-6))
    with_error = flips + [turn(0, 0, 0.0, state="Error: no tool call found.")] * 4
    assert 0.0 < explained(with_error)[0] < 1.0
    assert explained([turn(0, 0, 1.0, state="no maze here")] * 3) == (None, None)


def test_learning_rate_tuning_never_looks_at_the_held_out_split(workdir: Path, tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    """The smoke tuning: the lead method at each rate on the tuning split, a result file the study then reads."""
    argv = ["grpo_babyai", "--scale", "smoke", "--tune-learning-rate", "1e-3,1e-4", "--tune-steps", "1",
            "--out", str(tmp_path), "--workdir", str(workdir)]
    assert study_run.main(argv) == 0
    details = json.loads((tmp_path / "lr_tuning_grpo_babyai.json").read_text())["details"]
    assert details["split"] == "tune" != cat.eval_split_of(cat.STUDIES["grpo_babyai"])
    assert [c["learning_rate"] for c in details["candidates"]] == [1e-3, 1e-4]
    assert details["chosen"] in (1e-3, 1e-4) and "<- chosen" in capfd.readouterr().out
    for rate in ("0.001", "0.0001"):  # each rate its own folder, evaluated on the tuning split
        config = json.loads((workdir / "grpo_babyai-smoke" / "lr-tuning" / f"lr{rate}" / "grpo" / "seed0" /
                             "config.json").read_text())
        assert config["eval_split"] == "tune" and config["learning_rate"] == float(rate)
    rate, source = lr_tuning.learning_rate_of(cat.STUDIES["grpo_babyai"], tmp_path)
    assert rate == details["chosen"] and "lr_tuning_grpo_babyai.json" in source
    assert lr_tuning.learning_rate_of(cat.STUDIES["arpo_vs_grpo"], tmp_path)[1].endswith("not tuned for this study")


def test_learning_rate_choice_and_its_errors(capfd: pytest.CaptureFixture[str]) -> None:
    runs = [{"learning_rate": r, "curve": [(0, 0.3), (100, v)]} for r, v in ((1e-4, 0.2), (3e-5, 0.35), (1e-5, 0.35))]
    assert lr_tuning.choose(runs)["learning_rate"] == 1e-5  # a tie goes to the gentler step
    assert lr_tuning.parse_rates("1e-5, 1e-4") == [1e-4, 1e-5]
    for bad, message in (("1e-4", "at least two"), ("1e-4,x", "'x' is not a number"), ("1e-4,0", "must be > 0")):
        with pytest.raises(ValueError, match=message):
            lr_tuning.parse_rates(bad)
    assert lr_tuning.workdir_name(cat.STUDIES["grpo_babyai"], "goal", 1e-4) == "grpo_babyai-goal"  # runs resume
    assert lr_tuning.workdir_name(cat.STUDIES["grpo_babyai"], "goal", 3e-5) == "grpo_babyai-goal-lr3e-05"
    for argv, message in ((["arpo_vs_grpo", "--tune-learning-rate", "1e-4,1e-5"], "has no tuning split"),
                          (["grpo_babyai", "--tune-learning-rate", "1e-4,1e-5", "--learning-rate", "1e-4"],
                           "exclude each other"),
                          (["grpo_babyai", "--learning-rate", "-1"], "must be > 0")):
        with pytest.raises(SystemExit):
            study_run.parse_args(argv)
        assert message in capfd.readouterr().err


def test_a_run_is_shared_between_studies_only_at_identical_settings(tmp_path: Path) -> None:
    config = {"trainer": "grpo", "learning_rate": 1e-5, "seed": 0, "output_dir": "a"}
    donor = tmp_path / "grpo_babyai-goal-lr1e-05" / "grpo" / "seed0"
    donor.mkdir(parents=True)
    (donor / "summary.json").write_text("{}")
    (donor / "study.json").write_text(json.dumps({"config": config, "seconds": 12.0}))
    out = tmp_path / "gigpo_vs_grpo_babyai-goal-lr1e-05" / "grpo" / "seed0"
    same = {**config, "output_dir": str(out)}  # another folder, the same run
    assert study_run.finished_twin(tmp_path, "grpo", 0, same, out) == donor
    assert study_run.finished_twin(tmp_path, "grpo", 0, {**same, "learning_rate": 1e-4}, out) is None
    assert study_run.finished_twin(tmp_path, "grpo", 1, same, out) is None  # another seed
    assert study_run.finished_twin(tmp_path, "grpo_shuffled", 0, same, out) is None  # another method
    # a twin begun from the warm start before it was cloned further is another run; one recorded before the
    # warm start's steps were kept counts as the same
    assert study_run.finished_twin(tmp_path, "grpo", 0, same, out, start_steps=275) == donor
    (donor / "study.json").write_text(json.dumps({"config": config, "seconds": 12.0, "warm_start_bc_steps": 275}))
    assert study_run.finished_twin(tmp_path, "grpo", 0, same, out, start_steps=275) == donor
    assert study_run.finished_twin(tmp_path, "grpo", 0, same, out, start_steps=400) is None
    (donor / "summary.json").unlink()  # unfinished: nothing to copy
    assert study_run.finished_twin(tmp_path, "grpo", 0, same, out, start_steps=275) is None


def test_a_study_borrowing_a_borrowed_rate_trains_at_the_tuned_one() -> None:
    for study in cat.STUDIES.values():  # every chain ends at a study that tunes its own rate
        assert cat.STUDIES[cat.rate_source(study)].learning_rate_from is None
    longer = cat.STUDIES["gigpo_vs_grpo_babyai_mini_batches_30_steps"]
    assert longer.learning_rate_from == "grpo_babyai_mini_batches_30_steps"  # which borrows it in turn
    assert cat.rate_source(longer) == "grpo_babyai_mini_batches"
    assert lr_tuning.learning_rate_of(longer) == lr_tuning.learning_rate_of(cat.STUDIES["grpo_babyai_mini_batches"])
    assert lr_tuning.learning_rate_of(longer)[0] == 3e-4


def test_a_lead_rate_only_study_trains_its_baseline_and_control_at_the_default_rate(
        workdir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """An SGD actor's rate (about 1) would wreck an AdamW run: the study's rate reaches its lead method alone."""
    study = cat.STUDIES["archer_sgd_vs_filtered_bc"]
    assert study.lead_rate_only and cat.METHODS[study.methods[0]][1]["actor_optimizer"] == "sgd"
    argv = [study.name, "--scale", "smoke", "--seeds", "1", "--workdir", str(workdir), "--out", str(tmp_path),
            "--learning-rate", "0.5"]
    assert study_run.main(argv) == 0
    assert "every other run trains at the benchmark's default, 0.0001" in capfd.readouterr().out
    folder = workdir / lr_tuning.workdir_name(study, "smoke", 0.5)
    rates = {m: json.loads((folder / m / "seed0" / "study.json").read_text())["config"]["learning_rate"]
             for m in cat.runs_of(study)}
    assert rates == {study.methods[0]: 0.5, study.baseline: lr_tuning.DEFAULT_LEARNING_RATE,
                     study.control: lr_tuning.DEFAULT_LEARNING_RATE}
    said = research_pages.tuning_lines(study, tmp_path, None)[0]  # and its page says whose rate it is
    assert f"{study.methods[0]} alone" in said and "default, 0.0001" in said


def test_a_longer_study_extends_the_finished_shorter_run_of_the_same_settings(tmp_path: Path) -> None:
    config = {"trainer": "grpo", "learning_rate": 1e-5, "seed": 0, "steps": 20, "output_dir": "a"}
    for steps in (10, 20):
        donor = tmp_path / f"study-goal-{steps}" / "grpo" / "seed0"
        (donor / "checkpoints").mkdir(parents=True)
        (donor / "checkpoints" / "latest").write_text(f"step-{steps:06d}")
        (donor / "summary.json").write_text("{}")
        (donor / "study.json").write_text(json.dumps({"config": {**config, "steps": steps}, "seconds": 12.0,
                                                          "warm_start_bc_steps": 75}))
    out = tmp_path / "longer-goal" / "grpo" / "seed0"
    longer = {**config, "steps": 30, "output_dir": str(out)}
    ten, twenty = (tmp_path / f"study-goal-{steps}" / "grpo" / "seed0" for steps in (10, 20))
    assert study_run.shorter_twin(tmp_path, "grpo", 0, longer, out, start_steps=75) == twenty
    assert study_run.shorter_twin(tmp_path, "grpo", 0, {**longer, "steps": 15}, out, start_steps=75) == ten
    assert study_run.shorter_twin(tmp_path, "grpo", 0, {**longer, "steps": 10}, out, start_steps=75) is None
    assert study_run.shorter_twin(tmp_path, "grpo", 0, {**longer, "learning_rate": 1e-4}, out, start_steps=75) is None
    assert study_run.shorter_twin(tmp_path, "grpo", 0, longer, out, start_steps=400) is None  # another warm start
    (twenty / "checkpoints" / "latest").unlink()  # nothing to resume from: the longest one left
    assert study_run.shorter_twin(tmp_path, "grpo", 0, longer, out, start_steps=75) == ten


def test_a_study_given_more_steps_trains_only_the_steps_it_adds(tmp_path: Path) -> None:
    name, workdir = "grpo_babyai_mini_batches", tmp_path / "runs"
    argv = [name, "--scale", "smoke", "--seeds", "1", "--out", str(tmp_path), "--workdir", str(workdir)]
    assert study_run.main(argv) == 0
    shorter = {r["method"]: r for r in json.loads((tmp_path / f"study_{name}.json").read_text())["details"]["runs"]}
    assert study_run.main([*argv, "--steps", "2"]) == 0
    runs = json.loads((tmp_path / f"study_{name}.json").read_text())["details"]["runs"]
    assert [r["method"] for r in runs] == list(cat.runs_of(cat.STUDIES[name]))
    for run in runs:
        assert run["extended_from"] == f"{workdir / (name + '-smoke') / run['method'] / 'seed0'} (1 steps)"
        per_step = cat.SMOKE.rollouts_per_step
        assert [episodes for episodes, _ in run["curve"]] == [0, per_step, 2 * per_step]
        assert run["curve"][:2] == shorter[run["method"]]["curve"], "the shorter run's curve is this one's start"
        assert run["seconds"] > shorter[run["method"]]["seconds"], "a run's time counts the steps it extends"


def test_only_a_full_goal_scale_run_writes_the_committed_results_by_default(workdir: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """A newcomer's smoke run (as the research pages suggest) must not replace the measured result its page shows."""
    committed = tmp_path / "committed"
    monkeypatch.setattr(study_run, "RESULTS", committed)
    assert study_run.results_folder(None, "goal", workdir) == committed
    assert study_run.results_folder(None, "goal, 2 steps", workdir) == workdir / "results"
    assert study_run.results_folder(None, "goal", workdir, forced_rate=True) == workdir / "results"
    assert study_run.results_folder(str(tmp_path / "mine"), "smoke", workdir) == tmp_path / "mine"
    assert study_run.main(["gigpo_vs_grpo_babyai", "--scale", "smoke", "--seeds", "1", "--workdir", str(workdir)]) == 0
    assert not committed.exists()
    assert (workdir / "results" / "study_gigpo_vs_grpo_babyai.json").is_file()
    assert (workdir / "results" / "study_gigpo_vs_grpo_babyai.png").is_file()
    assert "results go to" in capfd.readouterr().out


def test_a_study_with_a_failed_run_never_replaces_the_committed_result(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """A run killed or interrupted part-way leaves a record with no goal checked; written to benchmarks/results it
    would replace the measurement the research page shows."""
    committed = tmp_path / "committed"
    monkeypatch.setattr(study_run, "RESULTS", committed)
    monkeypatch.setattr(study_run, "start_model", lambda *args, **kwargs: (tmp_path / "model", {}))
    monkeypatch.setattr(study_run, "agreement", lambda *args, **kwargs: {})
    monkeypatch.setattr(study_run, "format_agreement", lambda agreed: "not measured here")

    def interrupted(jobs, call, model, n_jobs, failed):  # noqa: ANN001, ANN202
        failed.append("grpo seed 0: TrainingInterrupted: interrupted at step 3/20")
        return [None] * len(jobs)

    monkeypatch.setattr(study_run, "run_jobs", interrupted)
    assert study_run.main(["grpo_babyai", "--seeds", "1", "--workdir", str(tmp_path / "work")]) == 1
    assert not committed.exists() or not any(committed.iterdir())
    assert (tmp_path / "work" / "results" / "study_grpo_babyai.json").is_file()
    assert "not benchmarks/results" in capfd.readouterr().out


def test_measured_hours_count_the_warm_start_and_own_runs_shared_among_the_jobs(tmp_path: Path) -> None:
    study = cat.STUDIES["gigpo_vs_grpo_babyai"]
    assert cat.measured_hours(study, tmp_path) is None  # never run: the page and --list say so
    runs = [{"method": "gigpo_equal_scale", "seed": 0, "seconds": 3600.0, "shared_from": None},
            {"method": "gigpo_equal_scale", "seed": 1, "seconds": 1800.0, "shared_from": None},
            {"method": "grpo", "seed": 0, "seconds": 9000.0, "shared_from": "runs/studies/grpo_babyai/grpo/seed0"}]
    record = {"command": "python benchmarks/studies/run.py gigpo_vs_grpo_babyai --jobs 2", "date": "2026-11-29T01:00",
              "details": {"scale_name": "goal", "runs": runs, "warm_start": {"seconds": 900.0}}}
    (tmp_path / "study_gigpo_vs_grpo_babyai.json").write_text(json.dumps(record))
    last = cat.measured_hours(study, tmp_path)
    assert last is not None and last["runs"] == 2 and last["jobs"] == 2
    assert last["hours"] == pytest.approx((900 + (3600 + 1800) / 2) / 3600)  # the copied run costs nothing here
    record["command"] = "agentgym study gigpo_vs_grpo_babyai --jobs=2"
    (tmp_path / "study_gigpo_vs_grpo_babyai.json").write_text(json.dumps(record))
    assert cat.measured_hours(study, tmp_path)["jobs"] == 2  # type: ignore[index]
    record["details"]["scale_name"] = "smoke"  # a smoke or reduced run measures nothing about the goal scale
    (tmp_path / "study_gigpo_vs_grpo_babyai.json").write_text(json.dumps(record))
    assert cat.measured_hours(study, tmp_path) is None
    # a run copied only because another study on the same task happened to train it first: run alone, this study
    # trains it, so it counts
    arpo = cat.STUDIES["arpo_vs_grpo"]
    runs = [{"method": "arpo", "seed": 0, "seconds": 1800.0, "shared_from": None},
            {"method": "grpo", "seed": 0, "seconds": 1800.0, "shared_from": "runs/studies/arpo_one_fresh_vs_grpo-goal"}]
    (tmp_path / "study_arpo_vs_grpo.json").write_text(json.dumps(
        {"command": "agentgym study arpo_vs_grpo", "details": {"scale_name": "goal", "runs": runs, "warm_start": {}}}))
    assert cat.measured_hours(arpo, tmp_path)["hours"] == pytest.approx(1.0)  # type: ignore[index]


def test_sokoban_studies_clone_their_warm_start_further_than_the_others() -> None:
    """At 0.25 training success most Sokoban groups fail every rollout and the gradient showed no signal."""
    for name in ("grpo_sokoban", "gigpo_vs_grpo"):
        assert cat.goal_scale(cat.STUDIES[name])[0].bc_target == cat.SOKOBAN_BC_TARGET == 0.5
    assert cat.goal_scale(cat.STUDIES["grpo_babyai"])[0].bc_target == 0.25


def test_a_run_under_way_shows_its_steps_and_the_hours_it_still_needs(tmp_path: Path) -> None:
    study = cat.STUDIES["grpo_sokoban"]
    scale, _ = cat.goal_scale(study)
    assert cat.progress_on_disk(study, scale, 3, tmp_path / "grpo_sokoban-goal") is None
    run = tmp_path / "grpo_sokoban-goal" / "grpo" / "seed0"
    run.mkdir(parents=True)
    rows = [{"step": 0, "eval/success_rate": 0.1}, {"step": 1, "time/step_s": 500.0},
            {"step": 2, "time/step_s": 300.0}, {"step": 2, "time/step_s": 400.0}]  # step 2 again after a resume
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n{\"step\": 3, \"ti")  # cut short
    now = cat.progress_on_disk(study, scale, 3, tmp_path / "grpo_sokoban-goal")
    assert now == {"steps_done": 2, "steps": 2 * 3 * scale.steps, "step_s": 450.0}
    line = next(x for x in study_run.list_text(str(tmp_path)).splitlines() if x.startswith("grpo_sokoban "))
    left = (2 * 3 * scale.steps - 2) * 450 / 2 / 3600
    assert f"2/{2 * 3 * scale.steps} training steps, 450 s a step (2 at once) -> ~{left:.1f} h more" in line
    tuned = cat.STUDIES["grpo_babyai_noise_sized"]  # at a tuned rate: its folder names the rate
    folder = study_run.lr_tuning.workdir_name(tuned, "goal", study_run.lr_tuning.learning_rate_of(tuned)[0])
    assert folder.endswith("-lr0.0003")
    (tmp_path / folder / "grpo_seq_mean_mb4" / "seed0").mkdir(parents=True)
    (tmp_path / folder / "grpo_seq_mean_mb4" / "seed0" / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    line = next(x for x in study_run.list_text(str(tmp_path)).splitlines() if x.startswith("grpo_babyai_noise_sized "))
    assert "1/120 training steps, 500 s a step" in line
    # a study that copies its GRPO and control runs counts only the runs it trains itself
    both = cat.STUDIES["gigpo_vs_grpo_babyai_noise_sized"]
    assert set(cat.shared_runs(both)) == {"grpo_seq_mean_mb4", "grpo_shuffled_seq_mean_mb4"}
    root = tmp_path / study_run.lr_tuning.workdir_name(both, "goal", study_run.lr_tuning.learning_rate_of(both)[0])
    for method in ("grpo_seq_mean_mb4", "gigpo_equal_scale_seq_mean_mb4"):
        (root / method / "seed0").mkdir(parents=True)
        (root / method / "seed0" / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    assert cat.progress_on_disk(both, scale, 3, root) == {"steps_done": 1, "steps": 3 * scale.steps, "step_s": 500.0}


def test_the_textworld_study_keeps_one_context_strategy_in_every_rollout(tmp_path: Path) -> None:
    """Demonstrations, the warm start's checks, training and evaluation all rewrite TextWorld's long history the
    same way; a warm start cached with another strategy is not reused."""
    import argparse

    import credit_assignment as credit

    from agentgym.trainers.config import config_from_dict

    task = cat.task_of("textworld")
    assert task.context == cat.TEXTWORLD_CONTEXT
    args = argparse.Namespace(**{**vars(credit.parse_args([])), "steps": 1})
    config = config_from_dict(credit.run_config(task, "grpo", 0, tmp_path / "m", tmp_path / "out", args))
    assert dict(config.context) == cat.TEXTWORLD_CONTEXT
    assert "context" not in credit.run_config(cat.task_of("maze"), "grpo", 0, tmp_path / "m", tmp_path / "o", args)

    cached = tmp_path / "warm-textworld"
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    (cached / "warm_start.json").write_text(json.dumps({"bc_steps": 400, "train_success_curve": [[400, 0.5]],
                                                        "seconds": 1.0, "context": None}))
    said: list[str] = []

    class Rebuilt(Exception):
        pass

    def log(line: str) -> None:
        said.append(line)
        raise Rebuilt

    with pytest.raises(Rebuilt):
        credit.warm_start(task, tmp_path, target=0.25, max_bc_steps=400, log=log)
    assert "cloned with another context strategy" in said[0]


def test_a_resumed_run_counts_the_time_its_earlier_processes_spent(tmp_path: Path) -> None:
    """A run stopped and resumed across sessions records its whole time, not the last process's: the logged step,
    evaluation and prior-episode times up to the checkpoint it resumed from (steps after it are trained again), and for a run
    extended from a shorter one only the steps after that run's end."""
    out = tmp_path / "run"
    (out / "checkpoints" / "step-000003").mkdir(parents=True)
    (out / "checkpoints" / "step-000003" / "state.json").write_text(json.dumps({"step": 3}))
    (out / "checkpoints" / "latest").write_text("step-000003")
    records = [{"step": 0, "time/prior_s": 6.0, "time/critic_prior_s": 2.0}, {"step": 0, "eval/wall_s": 5.0},
               {"step": 1, "time/step_s": 10.0}, {"step": 2, "time/step_s": 20.0},
               {"step": 2, "eval/wall_s": 4.0}, {"step": 3, "time/step_s": 30.0}, {"step": 4, "time/step_s": 99.0}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 5, "ti')
    assert study_run.logged_seconds(out) == 77.0  # the episodes and critic fit before step 1 included
    assert study_run.logged_seconds(out, after_step=2) == 30.0
    assert study_run.logged_seconds(tmp_path / "never-ran") == 0.0


def test_the_advantage_agreement_is_measured_once_per_warm_start_and_settings(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A study resumed across sessions reads its agreement back instead of sampling the batch again; another warm
    start or other settings measure again."""
    import argparse

    calls = []
    monkeypatch.setattr(study_run, "agreement", lambda *args: calls.append(args) or {"rollouts": len(calls)})
    study = cat.STUDIES["grpo_babyai"]
    scale, _ = cat.goal_scale(study)
    model = tmp_path / "warm"
    model.mkdir()
    (model / "warm_start.json").write_text(json.dumps({"bc_steps": 50}))
    settings = argparse.Namespace(tasks_per_step=16, group_size=8, jobs=1)

    def measure(**changes: object) -> dict:
        return study_run.cached_agreement(study, scale, "goal", model, argparse.Namespace(**{**vars(settings), **changes}),
                                          tmp_path)

    assert measure() == {"rollouts": 1}
    assert measure(jobs=3) == {"rollouts": 1} and len(calls) == 1  # how many run at once changes nothing measured
    assert measure(group_size=4) == {"rollouts": 2}
    (model / "warm_start.json").write_text(json.dumps({"bc_steps": 75}))  # cloned further in place
    assert measure(group_size=4) == {"rollouts": 3}
