"""What a run amounts to: aggregate metrics of finished episodes, why an episode failed, and the live progress bar."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from agentgym.trajectory import Trajectory

__all__ = ["EpisodeProgress", "error_reason", "summarize"]


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Aggregate eval metrics: success rate, mean turns, tool calls, tokens, errors, time.

    ``mean_action_tokens`` averages over the episodes whose every turn recorded its sampled token ids; it is
    ``None`` when no episode did (chat-mode policies), so reports show "n/a" rather than a false 0.
    """
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    ends: dict[str, int] = defaultdict(int)
    by_type: dict[str, list[bool]] = defaultdict(list)  # outcome["type"], e.g. search comparisons (chance 50 %)
    for t in trajectories:
        ends[t.end_reason] += 1
        if t.outcome.get("type"):
            by_type[str(t.outcome["type"])].append(t.success)
    extra = {"success_by_type": {k: sum(v) / len(v) for k, v in sorted(by_type.items())}} if by_type else {}
    with_ids = [t for t in trajectories if t.turns and all(turn.action_token_ids is not None for turn in t.turns)]
    return extra | {
        "episodes": n,
        "success_rate": sum(t.success for t in trajectories) / n,
        "mean_score": sum(t.score for t in trajectories) / n,
        "mean_turns": sum(len(t.turns) for t in trajectories) / n,
        "mean_tool_calls": sum(t.num_tool_calls for t in trajectories) / n,
        # Chat-mode policies (an OpenAI server without token ids) record no action ids: "not measured", never 0.
        "mean_action_tokens": (sum(t.num_action_tokens for t in with_ids) / len(with_ids)) if with_ids else None,
        "errors": ends.get("error", 0),
        "end_reasons": dict(ends),
        "template_forks": sum(int(t.metadata.get("template_forks", 0)) for t in trajectories),
        "prompt_mismatches": sum(int(t.metadata.get("prompt_mismatches", 0)) for t in trajectories),
        "mean_episode_s": sum(float(t.timing.get("wall_s", 0.0)) for t in trajectories) / n,
    }


def error_reason(trajectory: Trajectory) -> str:
    """Why an episode ended with ``end_reason="error"``: the engine's own error, else the error the env reported on
    its last turn (a crashed browser, a dead sandbox), which ``Trajectory.error`` does not carry."""
    if trajectory.error:
        return trajectory.error
    errors = trajectory.turns[-1].info.get("errors") if trajectory.turns else None
    return str(errors[-1]) if errors else "the env ended the episode with end_reason='error' and gave no reason"


class EpisodeProgress:
    """Finished episodes and the running success rate, on the shared bar (:mod:`agentgym.utils.progress`)."""

    def __init__(self, total: int, enabled: bool | str) -> None:
        from agentgym.utils.progress import ProgressBar

        self.total = total
        self.done = 0
        self.successes = 0
        self._bar = ProgressBar(total, "episodes", enabled=enabled, unit="ep")

    def __enter__(self) -> EpisodeProgress:
        self._bar.__enter__()
        return self

    def advance(self, traj: Trajectory) -> None:
        self.done += 1
        self.successes += int(traj.success)
        if self._bar.enabled:  # the text is formatted only for a bar someone sees
            self._bar.advance(info=f"success {self.successes / self.done:.2f}")

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)
