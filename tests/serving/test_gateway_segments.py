"""A session whose history the agent rewrote (a harness that compacts its context) is one trajectory in segments, as
the rollout engine makes one: its turns carry ``segment_index`` and ``token_views()`` is one row per segment, each
token-exact. Sub-agent sessions stay linked to their root's episode; ``split_segments`` gives the older form (one
trajectory per segment). Recorded session files are written by hand here: no server is needed to read them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentgym.serving.sessions import sessions_to_trajectories

END = {"type": "end", "outcome": {"success": True, "score": 1.0}, "end_reason": "answered", "source": "reported"}


def call(prompt: Sequence[int], sampled: Sequence[int], text: str) -> dict[str, Any]:
    return {"type": "call", "prompt_token_ids": list(prompt), "token_ids": list(sampled),
            "logprobs": [-0.5] * len(sampled), "text": text, "observation": f"before {text}", "temperature": 1.0,
            "ids_source": "server", "finish_reason": "stop"}


def write(folder: Path, sid: str, records: Sequence[dict[str, Any]], parent: str | None = None) -> None:
    head = {"type": "session", "session": sid, "group_id": "g0" if parent is None else None, "parent": parent}
    folder.mkdir(exist_ok=True)
    (folder / f"{sid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [head, *records]))


#: Two calls, then the agent compacts its history (the third prompt extends no earlier call), then one more.
COMPACTING = [call([1, 2], [3], "a1"), call([1, 2, 3, 4], [5], "a2"), call([1, 9], [6], "a3"),
              call([1, 9, 6, 7], [8], "a4")]


def test_a_compacted_session_is_one_trajectory_in_segments(tmp_path: Path) -> None:
    write(tmp_path, "s", [*COMPACTING, END])
    recorded = sessions_to_trajectories(tmp_path)
    assert (recorded.sessions, recorded.calls, recorded.segments, recorded.mismatches) == (1, 4, 2, 1)
    [trajectory] = recorded.trajectories
    assert [t.action for t in trajectory.turns] == ["a1", "a2", "a3", "a4"]
    assert [t.segment_index for t in trajectory.turns] == [0, 0, 1, 1] and trajectory.num_segments == 2
    views = trajectory.token_views()
    assert [list(v.input_ids) for v in views] == [[1, 2, 3, 4, 5], [1, 9, 6, 7, 8]]
    assert [list(v.loss_mask) for v in views] == [[0, 0, 1, 0, 1], [0, 0, 1, 0, 1]]
    assert [v.segment_index for v in views] == [0, 1] and {v.episode_id for v in views} == {"s"}
    assert trajectory.traj_id == "s" and trajectory.success and trajectory.group_id == "g0"
    assert trajectory.metadata["segments"] == 2 and trajectory.metadata["episode"] == "s"
    assert "segment" not in trajectory.metadata and trajectory.metadata["interleaved_calls"] == 0


def test_split_segments_keeps_one_trajectory_per_segment(tmp_path: Path) -> None:
    write(tmp_path, "s", [*COMPACTING, END])
    first, second = sessions_to_trajectories(tmp_path, split_segments=True).trajectories
    assert (first.traj_id, second.traj_id) == ("s#0", "s#1")
    assert [first.metadata["segment"], second.metadata["segment"]] == [0, 1]
    assert first.metadata["episode"] == second.metadata["episode"] == "s"
    assert first.num_segments == second.num_segments == 1
    assert list(second.token_view().input_ids) == [1, 9, 6, 7, 8]


def test_calls_that_go_back_to_an_earlier_segment_are_kept_in_segment_order(tmp_path: Path) -> None:
    """An agent that alternates two conversations in one session: each stays token-exact; the turns are grouped by
    segment (not in the order they were called), and the trajectory says how many calls went back."""
    write(tmp_path, "s", [call([1, 2], [3], "main1"), call([7], [8], "side1"), call([1, 2, 3, 4], [5], "main2"), END])
    [trajectory] = sessions_to_trajectories(tmp_path).trajectories
    assert [t.action for t in trajectory.turns] == ["main1", "main2", "side1"]
    assert [list(v.input_ids) for v in trajectory.token_views()] == [[1, 2, 3, 4, 5], [7, 8]]
    assert trajectory.metadata["interleaved_calls"] == 1


@pytest.mark.parametrize("mode", ["merge", "separate"])
def test_subagents_of_a_compacted_session_stay_linked(tmp_path: Path, mode: str) -> None:
    write(tmp_path, "root", [call([1, 2], [3], "r1"), {"type": "subagent", "session": "root-sub"},
                             call([1, 5], [6], "r2"), END])
    write(tmp_path, "root-sub", COMPACTING, parent="root")
    recorded = sessions_to_trajectories(tmp_path, subagents=mode)
    assert (recorded.sessions, recorded.subagent_sessions, recorded.segments, recorded.mismatches) == (1, 1, 4, 2)
    root, sub = recorded.trajectories
    assert (root.traj_id, root.num_segments, sub.traj_id, sub.num_segments) == ("root", 2, "root-sub", 2)
    assert sub.metadata["parent"] == "root"
    if mode == "merge":
        assert sub.metadata["episode"] == "root" and sub.group_id == "g0"
    else:
        assert sub.metadata["episode"] == "root-sub" and sub.group_id == "g0/sub"
