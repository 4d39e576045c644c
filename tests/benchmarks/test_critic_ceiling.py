"""benchmarks/critic_ceiling.py: the explained variance the true Q reaches, estimated from repeated keys."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from tests.helpers.scripts import load_script


@dataclass
class Turn:
    state: str
    mc_return: float
    episode: str


def _ceiling():  # noqa: ANN202
    return load_script("benchmarks/critic_ceiling.py")


def test_returns_fixed_by_their_key_leave_no_noise() -> None:
    turns = [Turn(s, r, f"0:{e}") for e in range(3) for s, r in (("a", 1.0), ("b", 0.0))]
    out = _ceiling().return_ceiling(turns, key=lambda t: t.state, stratum=lambda t: None)
    assert out["ceiling"] == pytest.approx(1.0) and out["repeated_turns"] == 1.0


def test_known_ceiling_is_recovered_from_sampled_returns() -> None:
    """Q_k = k/100 for 100 keys, G = Q_k + N(0, 0.3^2), 20 episodes a key: Var(Q) / Var(G) = 0.0833 / 0.1733."""
    rng = random.Random(0)
    turns = [Turn(str(k), k / 100 + rng.gauss(0, 0.3), f"0:{e}") for k in range(100) for e in range(20)]
    out = _ceiling().return_ceiling(turns, key=lambda t: t.state, stratum=lambda t: None)
    truth = (99 * 101 / 12 / 100**2) / (99 * 101 / 12 / 100**2 + 0.09)
    assert out["ceiling"] == pytest.approx(truth, abs=0.03)
    assert out["ceiling_pooled"] == pytest.approx(out["ceiling"])  # one stratum: the two estimates agree


def test_a_key_repeated_within_one_episode_measures_no_noise() -> None:
    """A wall bumped twice shares its episode's future: those near-equal returns are not independent draws."""
    turns = [Turn("a", 1.0, "0:0"), Turn("a", 0.95, "0:0"), Turn("b", 0.0, "0:1")]
    out = _ceiling().return_ceiling(turns, key=lambda t: t.state, stratum=lambda t: None)
    assert out["ceiling"] is None and out["noise_dof"] == 0 and out["repeated_turns"] == 0.0


def test_noise_is_weighted_by_each_turns_stratum() -> None:
    """Each turn takes its own stratum's noise (a stratum far from the exit scatters more than one next to it);
    one pooled figure weights the strata by their repeats instead."""
    noisy = [Turn("far", r, f"0:{e}") for e, r in enumerate((0.0, 1.0, 0.0, 1.0))]
    quiet = [Turn("near", r, f"0:{e}") for e, r in enumerate((0.9, 0.9, 0.9, 0.9))]
    out = _ceiling().return_ceiling(noisy + quiet, key=lambda t: t.state, stratum=lambda t: t.state)
    total = _pvariance([t.mc_return for t in noisy + quiet])
    assert out["ceiling"] == pytest.approx(1 - (4 * (1 / 3) + 4 * 0.0) / 8 / total)
    assert out["ceiling_pooled"] == pytest.approx(1 - (3 * (1 / 3)) / 6 / total)


def _pvariance(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / len(xs)


@pytest.mark.parametrize("argv, message", [
    (["--run", "nowhere"], "no config.json there"),
    (["--per-task", "1"], "--per-task must be >= 2"),
    (["--policies", "bogus"], "neither 'start', 'final' nor a model directory"),
])
def test_bad_arguments_say_how_to_fix_them(argv: list[str], message: str, tmp_path, capsys) -> None:  # noqa: ANN001
    (tmp_path / "config.json").write_text("{}")
    args = argv if argv[0] == "--run" else ["--run", str(tmp_path), *argv]
    with pytest.raises(SystemExit):
        _ceiling().parse_args(args)
    assert message in capsys.readouterr().err


def test_a_stratum_without_repeats_takes_the_overall_noise() -> None:
    turns = [Turn("far", r, f"0:{e}") for e, r in enumerate((0.0, 1.0))] + [Turn("near", 0.5, "0:9")]
    out = _ceiling().return_ceiling(turns, key=lambda t: t.state, stratum=lambda t: t.state)
    assert out["ceiling"] == pytest.approx(out["ceiling_pooled"])
    assert out["repeated_turns"] == pytest.approx(2 / 3)
