"""Recorded gateway sessions as trajectories: the offline half of :mod:`agentgym.serving.gateway`.

The gateway writes one JSONL file per session (``<record_dir>/<session>.jsonl``: a ``session`` record, then
``call``, ``reset``, ``step`` records and, once the reward is known, an ``end`` record).
:func:`sessions_to_trajectories` reads those files into :class:`~agentgym.trajectory.Trajectory` objects that the
bundled trainers train on.

Merging calls into training sequences. A session's calls form one training sequence while each call's prompt
starts exactly with an earlier call's prompt plus its sampled ids (the tokens in between are the observation and
template glue: loss mask 0). A call whose prompt extends no open sequence (the agent rewrote or truncated its
history, or the server re-rendered an earlier turn differently) starts a new sequence (a *segment*) and counts as
a mismatch. A session is one trajectory in segments, as the rollout engine makes an episode whose history a context
strategy rewrote: each turn carries its ``segment_index`` and :meth:`~agentgym.trajectory.Trajectory.token_views` is
one token-exact row per segment. The turns are grouped by segment, in the order the segments began; a call that
extends an earlier segment than the latest (an agent alternating two conversations in one session, not a compacting
harness) is counted in ``metadata["interleaved_calls"]``, since its turn then comes before turns called earlier.
``split_segments=True`` gives the older form instead: one trajectory per segment (``traj_id`` ``<session>#<k>``,
``metadata["segment"]``), linked by ``metadata["episode"]``.

Sub-agents. A session opened as another's sub-agent (the gateway's ``X-Agentgym-Parent-Session`` header) names its
parent in its head record, and the parent's file holds a ``subagent`` record for it. Its calls are read with its
root session (the top of the parent chain), never on their own, in one of two ways (``subagents``):

* ``merge`` (the default): the sub-agent's turns are part of the root's episode. Its trajectory has the root's
  outcome, group and ``episode`` id (``metadata["episode"]``), so a trainer gives it the episode's one return; a
  reward the sub-agent reported itself is ignored.
* ``separate``: each sub-agent session is an episode of its own (``episode`` is its session id), in the group
  ``<root group>/sub`` (sub-agents of one task's rollouts compare with each other), with the reward it reported
  itself, or else the root's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.trajectory import Trajectory, Turn

__all__ = ["SUBAGENT_MODES", "RecordedSessions", "read_session", "sessions_to_trajectories"]

#: How sub-agent sessions become trajectories (see the module docstring).
SUBAGENT_MODES = ("merge", "separate")


def read_session(path: str | Path) -> list[dict[str, Any]]:
    """The records of one session file, in order (a torn last line, from a crash mid-write, is skipped)."""
    records = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise AgentGymError(f"{path}:{i + 1} is not valid JSON; session files are append-only JSONL.") from None
    return records


@dataclass(frozen=True)
class RecordedSessions:
    """What :func:`sessions_to_trajectories` made of a set of sessions.

    Attributes:
        trajectories: One per ended session and per sub-agent session read with it, in segments (with
            ``split_segments``: one per segment of each, ordered by session, then segment).
        sessions: Sessions read that had ended (their reward is known).
        open_sessions: Sessions without an end record (skipped: no reward yet).
        calls: Calls of the ended sessions.
        segments: Training sequences made (segments of all sessions read; trainer rows).
        mismatches: Calls whose prompt extended no earlier call of their session (each began a segment).
        untrainable_calls: Calls recorded without token ids (skipped).
        tokenized_calls: Calls whose ids the gateway tokenised itself (not token-exact).
        subagent_sessions: Sub-agent sessions read with their root sessions.
    """

    trajectories: list[Trajectory]
    sessions: int = 0
    open_sessions: int = 0
    calls: int = 0
    segments: int = 0
    mismatches: int = 0
    untrainable_calls: int = 0
    tokenized_calls: int = 0
    subagent_sessions: int = 0

    def stats(self) -> dict[str, float]:
        return {f"gateway/{k}": float(getattr(self, k)) for k in (
            "sessions", "open_sessions", "calls", "segments", "mismatches", "untrainable_calls", "tokenized_calls",
            "subagent_sessions")}


def _segments(calls: Sequence[Mapping[str, Any]]) -> tuple[list[list[tuple[Mapping[str, Any], list[int]]]], int, int]:
    """Group calls into segments: each call extends the open segment whose full ids (prompt + sampled so far) are
    the longest prefix of its prompt; the new prompt tokens in between are its observation ids. Also counts the
    mismatches (calls that began a segment after the first) and the calls that extended an earlier segment than
    the latest one."""
    segments: list[list[tuple[Mapping[str, Any], list[int]]]] = []
    full: list[list[int]] = []
    mismatches = interleaved = 0
    for call in calls:
        prompt = call["prompt_token_ids"]
        best, best_len = None, -1
        for k, ids in enumerate(full):
            if len(ids) > best_len and len(ids) <= len(prompt) and prompt[:len(ids)] == ids:
                best, best_len = k, len(ids)
        if best is None:
            if segments:
                mismatches += 1
            segments.append([(call, list(prompt))])
            full.append(list(prompt) + list(call["token_ids"]))
        else:
            interleaved += best != len(segments) - 1
            segments[best].append((call, list(prompt[best_len:])))
            full[best] = list(prompt) + list(call["token_ids"])
    return segments, mismatches, interleaved


def _descendants(root: Path, records: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The sub-agent sessions under a session (depth first, in the order they began) and their records."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    seen: set[str] = set()
    stack = [str(r.get("session")) for r in reversed(records) if r.get("type") == "subagent"]
    while stack:
        child = stack.pop()
        path = root / f"{child}.jsonl"
        if child in seen or not path.is_file():
            continue
        seen.add(child)
        child_records = read_session(path)
        out.append((child, child_records))
        stack += [str(r.get("session")) for r in reversed(child_records) if r.get("type") == "subagent"]
    return out


def _session_trajectories(sid: str, records: Sequence[Mapping[str, Any]], head: Mapping[str, Any],
                          end: Mapping[str, Any], group_id: str, episode: str,
                          counts: dict[str, int], split_segments: bool = False) -> list[Trajectory]:
    """One session's calls as one trajectory in segments (``split_segments``: one per segment), with ``end``'s
    outcome, in ``group_id``."""
    calls: list[Mapping[str, Any]] = []
    step_of: dict[int, Mapping[str, Any]] = {}  # call position -> the env step it was the action of
    for r in records:
        if r.get("type") == "call":
            counts["calls"] += 1
            if r.get("prompt_token_ids") is None or r.get("token_ids") is None:
                counts["untrainable_calls"] += 1
                continue
            counts["tokenized_calls"] += r.get("ids_source") == "tokenized"
            calls.append(r)
        elif r.get("type") == "step" and calls and id(calls[-1]) not in step_of:
            step_of[id(calls[-1])] = r
    segments, mismatches, interleaved = _segments(calls)
    counts["mismatches"] += mismatches
    counts["segments"] += len(segments)
    outcome = dict(end.get("outcome") or {})
    own_head = next((r for r in records if r.get("type") == "session"), {})

    def turn_of(call: Mapping[str, Any], prompt_ids: list[int], segment: int) -> Turn:
        step = step_of.get(id(call), {})
        lps = call.get("logprobs")
        return Turn(
            observation=str(call.get("observation") or ""), action=str(call.get("text") or ""),
            reward=float(step.get("reward", 0.0)), info=step.get("turn") or {},
            prompt_token_ids=tuple(prompt_ids), action_token_ids=tuple(call["token_ids"]),
            action_logprobs=None if lps is None else tuple(float(v) for v in lps),
            finish_reason=call.get("finish_reason"), segment_index=segment)

    def trajectory(traj_id: str, turns: list[Turn], temperature: Any, own: dict[str, Any]) -> Trajectory:
        return Trajectory(
            env_id=str(head.get("env_id") or "gateway"), task_id=str(head.get("task_id") or head.get("session") or sid),
            seed=head.get("seed"), turns=tuple(turns), outcome=outcome,
            end_reason=str(end.get("end_reason") or outcome.get("end_reason") or "answered"),
            policy="gateway", traj_id=traj_id, group_id=group_id,
            metadata={"session": sid, **own, "segments": len(segments), "mismatches": mismatches,
                      "episode": episode, "parent": own_head.get("parent"),
                      "reward_source": end.get("source"), "temperature": temperature,
                      **({"final_observation": records[-2].get("observation")}
                         if len(records) > 1 and records[-2].get("type") == "step" else {})})

    if split_segments:
        return [trajectory(f"{sid}#{k}", [turn_of(call, ids, 0) for call, ids in segment],
                           segment[0][0].get("temperature"), {"segment": k})
                for k, segment in enumerate(segments)]
    if not segments:
        return []
    turns = [turn_of(call, ids, k) for k, segment in enumerate(segments) for call, ids in segment]
    return [trajectory(sid, turns, segments[0][0][0].get("temperature"), {"interleaved_calls": interleaved})]


def sessions_to_trajectories(record_dir: str | Path, sessions: Iterable[str] | None = None, *,
                             subagents: str = "merge", split_segments: bool = False) -> RecordedSessions:
    """Turn recorded sessions into trajectories (see the module docstring for how calls merge).

    Args:
        record_dir: The gateway's ``record_dir``.
        sessions: Session ids to read, in this order; ``None`` reads every ``*.jsonl`` in the directory (by name).
            The sub-agent sessions of each are read with it.
        subagents: ``merge`` (a sub-agent's turns belong to its root session's episode) or ``separate`` (each
            sub-agent session is an episode of its own); see the module docstring.
        split_segments: One trajectory per segment of a session (linked by ``metadata["episode"]``) instead of
            one trajectory in segments per session.

    Returns:
        The trajectories and counts. A session's turns carry the env's step reward and turn info (a call is the
        action of the env step that follows it); its outcome is the env's or the reported one.
    """
    if subagents not in SUBAGENT_MODES:
        raise ConfigError(f"subagents must be one of {', '.join(SUBAGENT_MODES)}, got {subagents!r}.")
    root = Path(record_dir)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory of recorded sessions (the gateway's --record DIR).")
    paths = sorted(root.glob("*.jsonl")) if sessions is None else [root / f"{s}.jsonl" for s in sessions]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"No recorded session file {missing[0]} ({len(missing)} missing): was the session opened "
                          "on this gateway with this record_dir?")
    out: list[Trajectory] = []
    counts = dict(sessions=0, open_sessions=0, calls=0, segments=0, mismatches=0, untrainable_calls=0,
                  tokenized_calls=0, subagent_sessions=0)
    for path in paths:
        records = read_session(path)
        head = next((r for r in records if r.get("type") == "session"), {})
        if head.get("parent") is not None and sessions is None:
            continue  # read with its root session
        end = next((r for r in records if r.get("type") == "end"), None)
        if end is None:
            counts["open_sessions"] += 1
            continue
        counts["sessions"] += 1
        sid = path.stem
        group = str(head.get("group_id") or sid)
        out += _session_trajectories(sid, records, head, end, group, sid, counts, split_segments)
        for child, child_records in _descendants(root, records):
            counts["subagent_sessions"] += 1
            if subagents == "merge":
                out += _session_trajectories(child, child_records, head, end, group, sid, counts, split_segments)
            else:
                own_end = next((r for r in child_records if r.get("type") == "end"), None)
                out += _session_trajectories(child, child_records, head, own_end or end, f"{group}/sub", child, counts,
                                             split_segments)
    return RecordedSessions(out, **counts)
