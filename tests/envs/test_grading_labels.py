"""The labelled grading sets (tests/data/grading/*.jsonl) against the graders the envs reward with.

Runs benchmarks/grader_accuracy.py's check: no false positive anywhere (a wrong answer rewarded is what a
policy learns to exploit) and under 1% false negatives per env; and the coverage the sets must keep (at least
300 lines in all, every task kind of the code and games envs, both verdicts for each kind).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")
pytest.importorskip("champ_dataset")

from agentgym.envs.code_interpreter.answers import GRADERS as CODE_GRADERS
from agentgym.envs.code_interpreter.tasks import DATASETS
from tests.helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
GRADING = REPO / "tests" / "data" / "grading"
CODE_KINDS = {*DATASETS, "champ"}
GAMES_KINDS = {"calculator", "guess_number"}  # Maze has no free-form answer to grade


def _benchmark():
    return load_script("benchmarks/grader_accuracy.py")


@pytest.fixture(scope="module")
def bench():
    return _benchmark()


@pytest.fixture(scope="module")
def rows(bench):
    return bench.load_rows(GRADING)


@pytest.fixture(scope="module")
def results(bench, rows):
    from agentgym.envs.code_interpreter.answers import answers_equivalent

    # math-verify's first parse builds its LaTeX parser (about 1 s); on a loaded machine that start-up alone
    # could eat a 2 s grading budget and show up as a false negative that says nothing about the grader.
    assert answers_equivalent("\\log_2 8", "3")
    return bench.evaluate(rows)


def test_every_line_is_well_formed(rows) -> None:
    for row in rows:
        assert set(row) >= {"env", "kind", "task", "answer", "verdict", "why"}, row["_where"]
        assert set(row["task"]) >= {"id", "prompt", "answer", "metadata"}, row["_where"]
        assert isinstance(row["answer"], str) and isinstance(row["verdict"], bool), row["_where"]
        assert row["why"].strip(), row["_where"]


def test_coverage(rows) -> None:
    assert len(rows) >= 300
    code = [r for r in rows if r["env"] == "code"]
    games = [r for r in rows if r["env"] == "games"]
    assert len(code) >= 250
    for family, kinds in (("code", CODE_KINDS), ("games", GAMES_KINDS)):
        family_rows = [r for r in rows if r["env"] == family]
        for kind in kinds:
            verdicts = {r["verdict"] for r in family_rows if r["kind"] == kind}
            assert verdicts == {True, False}, f"{family}/{kind} needs right and wrong answers, has {verdicts}"
    assert {r["kind"] for r in code} <= CODE_KINDS and CODE_KINDS <= set(CODE_GRADERS)
    assert {r["kind"] for r in games} <= GAMES_KINDS


def test_code_tasks_are_real_suite_tasks(rows) -> None:
    """The labelled tasks are the shipped suites' own, metadata included, so the grader sees what the env sees."""
    from agentgym.registration.suites import load_suite

    suites = {"code": ("code-train", "code-test", "champ"), "games": ("games-calc", "games-guess")}
    for family, names in suites.items():
        shipped = {(t.id, t.prompt): t for name in names for t in load_suite(name)}  # ids repeat across suites
        for row in (r for r in rows if r["env"] == family):
            task = shipped.get((row["task"]["id"], row["task"]["prompt"]))
            assert task is not None, f"{row['_where']}: {row['task']['id']} is not a shipped {family} task"
            assert json.loads(json.dumps(task.to_dict()["metadata"])) == row["task"]["metadata"], row["_where"]
            assert task.answer == row["task"]["answer"], row["_where"]


def test_no_false_positives_and_few_false_negatives(bench, results) -> None:
    cells, notes = results
    print("\n" + bench.format_table(cells) + "".join(f"\nNOTE: {note}" for note in notes))
    for family in sorted({env for env, _ in cells}):
        summary = bench.total(cells, family)
        assert summary.false_positives == 0, [e for e in summary.errors if not e["label"]]
        assert summary.fn_rate < 0.01, [e for e in summary.errors if e["label"]]
    assert {"code", "games"} <= {env for env, _ in cells}


def test_benchmark_exits_non_zero_on_a_false_positive(bench, tmp_path) -> None:
    """A wrong answer labelled right must fail the script (its exit status is the CI gate)."""
    line = json.loads((GRADING / "games.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert line["verdict"] is True
    wrong = {**line, "answer": str(int(line["task"]["answer"]) + 1), "verdict": False, "why": "off by one"}
    (tmp_path / "games.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(wrong) + "\n", encoding="utf-8")
    assert bench.main(["--dir", str(tmp_path)]) == 0
    mislabelled = {**wrong, "verdict": False, "answer": line["answer"]}  # the right answer, labelled wrong
    (tmp_path / "games.jsonl").write_text(json.dumps(mislabelled) + "\n", encoding="utf-8")
    assert bench.main(["--dir", str(tmp_path)]) == 1


def test_a_family_without_a_grader_is_skipped_with_a_note(bench, rows) -> None:
    """A labelled file whose env's grade_answer does not exist yet is reported, not an error."""
    row = {**rows[0], "env": "no_such_env"}
    cells, notes = bench.evaluate([row])
    assert cells == {} and len(notes) == 1 and "no_such_env" in notes[0]


def test_the_set_holds_the_cases_graders_once_misjudged(rows) -> None:
    """Each once-misjudged form is a labelled line, right or wrong as constructed (and graded so above)."""
    def has(env: str, verdict: bool, predicate) -> bool:
        return any(r["env"] == env and r["verdict"] is verdict and predicate(r) for r in rows)

    assert has("code", False, lambda r: r["answer"].startswith("~"))  # "about 12"
    assert has("code", True, lambda r: r["answer"].startswith("The answer is "))
    assert has("code", True, lambda r: r["answer"].endswith(" apples"))
    assert has("code", True, lambda r: r["answer"].startswith("\\boxed{\\$"))
    assert has("code", True, lambda r: r["answer"] == "1\\frac{1}{2}")
    assert has("games", True, lambda r: r["kind"] == "calculator" and r["answer"].startswith("$"))
    for answer in ("USA", "U.S.", "the US", "America", "Suva, Fiji", "The capital of Fiji is Suva.", "yen (¥)"):
        assert has("search", True, lambda r, a=answer: r["answer"] == a), answer
    assert has("search", False, lambda r: r["answer"] == "USA or Canada")


def test_benchmark_prints_math_verify_next_to_ours(bench, rows, capsys) -> None:
    """The comparison table: our confusion counts and math-verify's on the same lines (real math-verify)."""
    pytest.importorskip("math_verify")
    sample = [r for r in rows if r["env"] == "code" and r["kind"] == "gsm_symbolic"][:12]
    sample += [r for r in rows if r["env"] == "code" and r["answer"].startswith("~")][:2]
    ours, _ = bench.evaluate(sample)
    theirs = bench.evaluate_baseline(sample)
    assert set(theirs) == set(ours)
    assert sum(cell.n for cell in theirs.values()) == len(sample)
    assert bench.math_verify_grade(bench.task_of(sample[0]), "12345678") is False
    table = bench.format_comparison(ours, theirs)
    assert "math-verify TP" in table and "ours TP" in table and "gsm_symbolic" in table
    for line in table.splitlines()[2:]:
        numbers = [int(x) for x in line.replace("|", " ").split()[2:]]
        assert numbers[0] == sum(numbers[1:5]) == sum(numbers[5:9]), line  # n = TP + FP + FN + TN, both sides
