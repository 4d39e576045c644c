"""How a SWE episode's submission is scored: a grader reply becomes the episode's grading record and message.

Two reward rules (:data:`REWARD_RULES`), over f, the share of FAIL_TO_PASS tests that pass, and G, the guarded tests
(PASS_TO_PASS plus the visible tests that already pass on the buggy tree, measured once per process when the
spec does not record them):

* ``"resolved"``: 1 when every FAIL_TO_PASS test passes and no test of G fails, else 0. This is SWE-bench's
  "resolved" (Jimenez et al., 2024, "SWE-bench: Can Language Models Resolve Real-World GitHub Issues?"), so the mean
  reward over a suite is a resolved rate that can stand next to published ones;
* ``"partial"``: ``f * (1 - regressions / |G|)``, a denser signal for training that is *not* a resolved rate.

See :func:`score_submission`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REWARD_RULES", "known_visible_pass", "remember_visible_pass", "score_submission", "submission_message"]

REWARD_RULES = ("resolved", "partial")
_VISIBLE_PASS: dict[str, tuple[str, ...]] = {}


def _spec_key(spec: Any) -> str:
    import json

    return json.dumps([spec.id, spec.library, spec.version, spec.mutation.to_dict()], sort_keys=True)


def known_visible_pass(spec: Any) -> tuple[str, ...] | None:
    """Visible tests that pass on the buggy tree: from the spec when it has them, else measured once per process."""
    stored = getattr(spec, "visible_pass", None)
    if stored is None:
        stored = spec.extra.get("visible_pass")
    if stored is not None:
        return tuple(stored)
    return _VISIBLE_PASS.get(_spec_key(spec))


def remember_visible_pass(spec: Any, baseline: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The visible tests that passed on ``spec``'s buggy tree, as measured by its first grading in this process
    (a later grading of the same spec reuses the first measurement)."""
    return _VISIBLE_PASS.setdefault(_spec_key(spec), tuple(baseline))


def score_submission(spec: Any, graded: dict[str, Any], problem: str = "", rule: str = "partial") -> dict[str, Any]:
    """Turn a grader reply into the episode's grading record (what ``info["turn"]["grading"]`` shows).

    With f = passing FAIL_TO_PASS / all FAIL_TO_PASS and G = PASS_TO_PASS plus the visible tests that pass on
    the buggy tree: success = f == 1, no regression and no problem; reward = 1.0 if success else 0.0 under
    ``rule="resolved"``, f * (1 - regressions / |G|) under ``rule="partial"``. A test with no reported outcome
    counts as failed; test ids in SWE-bench's Django and bare-name forms are matched to pytest's node ids
    (:func:`agentgym.tasks.swe.test_ids.resolve_outcome`).
    """
    from agentgym.tasks.swe.test_ids import resolve_outcome

    if rule not in REWARD_RULES:
        raise ValueError(f"unknown reward rule {rule!r}; use one of {REWARD_RULES}")
    outcomes: dict[str, str] = dict(graded.get("outcomes") or {})
    problem = problem or str(graded.get("problem") or "")
    applied = bool(graded.get("applied"))
    ran = applied and not graded.get("skipped")
    f2p = sum(resolve_outcome(t, outcomes) == "passed" for t in spec.fail_to_pass)
    guarded = list(dict.fromkeys([*spec.pass_to_pass, *graded.get("visible_pass", ())]))
    regressions = [t for t in guarded if resolve_outcome(t, outcomes) != "passed"] if ran else []
    kept = 1.0 - len(regressions) / len(guarded) if guarded else 1.0
    success = applied and f2p == len(spec.fail_to_pass) and not regressions and not problem
    partial = f2p / len(spec.fail_to_pass) * kept
    return {"rule": rule, "partial_reward": partial, "applied": applied, "tests_ran": ran, "f2p_passed": f2p, "f2p_total": len(spec.fail_to_pass),
            "regressions": regressions, "guarded_total": len(guarded),
            "graded_paths": list(graded.get("graded") or []), "ignored_paths": list(graded.get("ignored") or []),
            "tampered": list(graded.get("tampered") or []), "problem": problem,
            "reward": partial if rule == "partial" else float(success), "resolved": success, "success": success}


def submission_message(grading: dict[str, Any], package_dir: str) -> str:
    """What the agent reads after submit: counts, regressions and ignored paths, never the hidden tests' output."""
    if not grading["applied"]:
        return ("Submitted, but nothing was graded: "
                + (grading["problem"] or "the patch is empty (no change to the repository)") + ".")
    lines = [f"Submitted. Hidden tests: {grading['f2p_passed']}/{grading['f2p_total']} of the failing tests now pass."]
    regressions = grading["regressions"]
    if not grading["tests_ran"]:
        lines.append("The patch changes no source module of the library, so the tree is the buggy one.")
    elif regressions:
        shown = ", ".join(regressions[:10]) + (f" and {len(regressions) - 10} more" if len(regressions) > 10 else "")
        lines.append(f"{len(regressions)} of {grading['guarded_total']} tests that passed before now fail: {shown}.")
    elif grading["guarded_total"]:
        lines.append(f"No regressions in {grading['guarded_total']} tests that passed before.")
    ignored = grading["ignored_paths"]
    if ignored:
        shown = ", ".join(ignored[:10]) + (f" and {len(ignored) - 10} more" if len(ignored) > 10 else "")
        lines.append(f"Ignored changes to: {shown} (only source modules under {package_dir}/ are graded; tests, "
                     "conftest files and settings are restored from the original repository).")
    if grading["tampered"]:
        lines.append(f"{len(grading['tampered'])} test(s) reported passed without their test body returning; "
                     "counted as failed.")
    if grading["problem"]:
        lines.append(f"Problem: {grading['problem']}.")
    return " ".join(lines)
