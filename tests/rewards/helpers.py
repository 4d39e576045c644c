"""Trajectories with a text answer, as an env that ends with ``answer(text)`` records them."""

from __future__ import annotations

from agentgym.trajectory import Trajectory, Turn


def answered(answer: str, *, task: str = "Write a short report on the Eiffel Tower.", score: float = 1.0,
             group: str = "g0", traj_id: str = "t0", task_id: str = "eiffel") -> Trajectory:
    """One finished episode: a search turn, then an answer turn whose rewards sum to ``score``."""
    turns = (
        Turn(observation=task, action='search("eiffel")', reward=0.0,
             info={"kind": "tool_call", "calls": [{"name": "search", "arguments": {"query": "eiffel"}}]}),
        Turn(observation="The tower was finished in 1889 in Paris.", action=f"answer({answer!r})", reward=score,
             info={"kind": "answer", "calls": [{"name": "answer", "arguments": {"text": answer}}],
                   "rewards": {"outcome": score}}),
    )
    return Trajectory(env_id="agentgym/Test-v0", task_id=task_id, seed=0, turns=turns,
                      outcome={"success": score == 1.0, "score": score, "end_reason": "answered"},
                      end_reason="answered", traj_id=traj_id, group_id=group)
