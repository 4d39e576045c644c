"""A recording gateway: black-box agents talk to a model through it, and their sessions become trajectories.

Why: many agents are programs we cannot change (written against the ``openai`` package, run by another
framework). To train the model they use, the gateway sits between such a program and an OpenAI-compatible
server (``agentgym serve`` in-process, or any server by URL, such as ``vllm serve``), forwards each call, and
records it *token-exactly*: the prompt ids the server conditioned on, the ids it sampled and their log-probs.
:func:`~agentgym.serving.sessions.sessions_to_trajectories` turns the recorded sessions into :class:`~agentgym.trajectory.Trajectory`
objects that the bundled trainers train on (:class:`agentgym.trainers.gateway.GatewayGrpoTrainer` runs the loop).

Sessions. Every call names its session, in one of three ways (the first that is present wins):

* the path: ``http://HOST:PORT/s/<session>/<token>/v1`` as the client's ``base_url`` (for agents that let you set
  nothing but a base URL; ``/s/<session>/v1`` with the token in the header works too);
* the header ``X-Agentgym-Session: <session>``;
* the request's ``user`` field (OpenAI's end-user id, which every client can set).

Session tokens. A session's name is not a credential (names are short and often guessable: ``alice``, ``s0-3``).
Every session carries an unguessable token (``secrets.token_urlsafe(32)``) issued when it is created, and every
later call on it (a model call that records into it, env reset and step, the reward, the summary) must present
it, in the base URL (above) or the header ``X-Agentgym-Session-Token``; a missing or wrong token is answered with
403 (the ``openai`` package raises ``PermissionDeniedError``), and nothing is recorded. The token reaches its
client in three ways: ``POST /v1/sessions`` answers with it and with a ``base_url`` that carries it (hand that URL
to an agent written against the ``openai`` package: ``OpenAI(base_url=...)`` is all it needs); from Python,
:meth:`Gateway.session_base_url` gives that URL for a session opened with :meth:`Gateway.open_session`; a session
created by its first model call gets the token that call presented (a client may pick its own, 22 to 256 URL-safe
characters) or else a new one, returned in that response's ``X-Agentgym-Session-Token`` header. Clients never see
where sessions are stored on disk. With an API key (``api_key=``, ``--api-key`` or ``$AGENTGYM_API_KEY``) every
route but ``/health`` also needs the key (``Authorization: Bearer <key>``: the ``openai`` package's ``api_key``),
so the key says who may use the gateway and the token says which session is whose.

A session the gateway has not seen is created on its first call. A session ends with its reward, in one of
two ways: the agent reports it (``POST .../v1/session/reward`` with ``{"reward": r, "success": bool}``), or the
gateway plays an env for the agent: a session opened with an env (``POST /v1/sessions`` with ``{"env": id,
"suite": name, "task_id": ...}``, or :meth:`Gateway.open_session`; a client's ``env_kwargs`` may set only
``max_turns``: other keyword arguments of an env can name server files) exposes ``POST .../v1/env/reset`` and
``POST .../v1/env/step`` (``{"action": text}``), and the env's outcome ends it. Both are plain JSON endpoints,
so an agent written only against the ``openai`` package reaches them with ``client.post(path, body=...,
cast_to=object)``; the model calls are ordinary ``client.chat.completions.create`` calls.

What is recorded. The gateway asks the upstream server for ``return_token_ids`` and log-probs (vLLM >= 0.10.2 and
``agentgym serve`` honour them), hands the client exactly the fields it asked for, and appends one JSON line per
call to ``<record_dir>/<session>.jsonl`` (``type: call``), one per env step (``type: step``) and one for the end
(``type: end``). When a server reports no prompt ids or no sampled ids, the gateway encodes them with its local
``tokenizer`` (if it has one) and marks the call ``ids_source: "tokenized"`` (not token-exact: the server may
have tokenised differently); with no tokenizer the call is recorded without ids (``ids_source: null``) and is
not trainable. A session opened with a seed gets a per-call ``seed`` (from the session seed and the call's index)
when the request has none, so replays sample the same.

Anthropic's Messages API. ``POST .../v1/messages`` (under the same three session prefixes) takes requests of the
``anthropic`` package, converts them to the chat form (:mod:`agentgym.serving.anthropic_messages`), forwards and
records them exactly as chat calls (``api: "anthropic"`` in the record), and answers in that API's shape, errors
included. An ``anthropic`` client's ``base_url`` is the session URL without ``/v1`` (the package appends it).

Sub-agents. A call with the header ``X-Agentgym-Parent-Session: <parent>`` makes its session a sub-agent of
``parent``: the parent's token must come with it (the call's own session token, or ``X-Agentgym-Parent-Token``), since
a child's turns join the parent's episode in training and nobody else may add turns to it. A new child session is
created on that call, with the token it presented or else the parent's; its head record names the parent and the
parent's file gets a ``subagent`` record. An existing session cannot be claimed as another's child, and an ended
parent takes no new ones.

Turning the recorded sessions into training sequences is :mod:`agentgym.serving.sessions` (it needs no web
framework, so a trainer reads sessions without the serving extras).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import hmac
import re
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError, did_you_mean
from agentgym.serving import anthropic_messages
from agentgym.serving.auth import ApiKeyMiddleware, resolve_api_key
from agentgym.serving.limits import BodySizeLimitMiddleware, RequestLimits
from agentgym.serving.http import bind_socket, import_uvicorn, serve, socket_url
from agentgym.serving.openai_protocol import APIError, json_body
from agentgym.serving.sessions import RecordedSessions, read_session, sessions_to_trajectories
from agentgym.suite import Task
from agentgym.trajectory import jsonable

try:
    import httpx
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from agentgym.errors import DependencyNotInstalled

    raise DependencyNotInstalled("fastapi", "serve", "the recording gateway") from exc

__all__ = ["PARENT_HEADER", "PARENT_TOKEN_HEADER", "SESSION_HEADER", "TOKEN_HEADER", "Gateway", "RecordedSessions", "create_gateway_app", "read_session",
           "run_gateway", "sessions_to_trajectories"]

logger = logging.getLogger(__name__)

#: The header that names a call's session.
SESSION_HEADER = "X-Agentgym-Session"
#: The header that carries a session's token (when the base URL does not).
TOKEN_HEADER = "X-Agentgym-Session-Token"
#: The header that makes a call's session a sub-agent of another session (its parent).
PARENT_HEADER = "X-Agentgym-Parent-Session"
#: The parent's token, when the call's own token (base URL or :data:`TOKEN_HEADER`) is not the parent's.
PARENT_TOKEN_HEADER = "X-Agentgym-Parent-Token"
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: A token a client picks for a session it creates: URL-safe, at least 128 bits as token_urlsafe writes them.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{22,256}$")
#: The env keyword arguments a client may set when it opens an env session (others can name server files).
_CLIENT_ENV_KWARGS = frozenset({"max_turns"})
_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")
#: Upstream paths the gateway forwards without recording (they generate nothing).
_PASSTHROUGH = ("models", "tokenize", "detokenize")


def _check_session_id(session: str) -> str:
    if not isinstance(session, str) or not _SESSION_RE.match(session):
        raise APIError(f"Session id {session!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', starting "
                       "with a letter or digit (it names the session's file).", param="session", code="bad_session")
    return session


def _call_seed(seed: int, index: int) -> int:
    """The seed of a session's ``index``-th call: a function of both, so replays sample the same."""
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31)


def _text_of(content: Any) -> str:
    """The text of an OpenAI message content (a string, or a list of parts of which the text ones count)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def _observation_of(body: Mapping[str, Any]) -> str:
    """What the model saw since its last turn: the text of the messages after the last assistant message."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else ""
    tail: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role") == "assistant":
            break
        tail.append(_text_of(message.get("content")))
    return "\n".join(reversed(tail))


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return list(value)
    return None


# ---- sessions and their files -------------------------------------------------------------------------
@dataclass
class _Session:
    """A session's state in the gateway (its record is the JSONL file)."""

    id: str
    token: str = ""
    env_id: str | None = None
    task: Task | None = None
    seed: int | None = None
    group_id: str = ""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    env: Any = None
    calls: int = 0
    steps: int = 0
    ended: bool = False
    total_reward: float = 0.0
    lock: asyncio.Lock | None = None


class Gateway:
    """The gateway's state: the session files and the envs it plays for agents (one per env session).

    Thread-safe: a trainer opens sessions from its own thread while the server's event loop records calls.

    Args:
        record_dir: Where each session's JSONL is written (created if missing).
        tokenizer: Optional local tokenizer, used only when the upstream server reports no token ids.
    """

    def __init__(self, record_dir: str | Path, *, tokenizer: Any = None) -> None:
        self.record_dir = Path(record_dir)
        self.record_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer = tokenizer
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    # -- opening and recording --
    def open_session(self, session: str | None = None, *, env_id: str | None = None, task: Task | None = None,
                     seed: int | None = None, group_id: str = "", env_kwargs: Mapping[str, Any] | None = None,
                     metadata: Mapping[str, Any] | None = None, token: str | None = None,
                     parent: str | None = None) -> str:
        """Open a session (an env episode when ``env_id`` is given; the env is built at the agent's reset).

        Args:
            token: The session's token (22-256 URL-safe characters); ``None`` issues a new unguessable one. Read
                it with :meth:`token` or hand the agent :meth:`session_base_url`.
            parent: Make this session a sub-agent of ``parent`` (an open session of this gateway): its head record
                names the parent, and the parent's file records where the sub-agent began.

        Returns:
            The session id (a new random one when ``session`` is ``None``).
        """
        sid = _check_session_id(session) if session is not None else uuid.uuid4().hex
        if token is not None and not (isinstance(token, str) and _TOKEN_RE.match(token)):
            raise APIError("A session token must be 22-256 URL-safe characters (letters, digits, '-', '_'); "
                           "leave it out and the gateway issues one.", param="token", code="bad_session_token")
        if env_id is not None:
            import gymnasium as gym

            import agentgym  # noqa: F401 - registers the ids

            if env_id not in gym.registry:
                raise APIError(f"Unknown env {env_id!r}.{did_you_mean(env_id, gym.registry)} See `agentgym list`.",
                               param="env", code="unknown_env")
        with self._lock:
            if sid in self._sessions or self.path(sid).exists():
                raise APIError(f"Session {sid!r} already exists; open each session once (pick a new id).",
                               status=409, param="session", code="session_exists")
            if parent is not None and parent not in self._sessions:
                raise APIError(f"No parent session {parent!r}: a sub-agent's parent must be an open session of this "
                               "gateway run.", status=404, param="parent", code="unknown_session")
            self._sessions[sid] = _Session(sid, token or secrets.token_urlsafe(32), env_id, task, seed,
                                           group_id or sid, dict(env_kwargs or {}), parent)
        self._append(sid, {"type": "session", "session": sid, "env_id": env_id,
                           "task_id": task.id if task is not None else None, "seed": seed, "group_id": group_id or sid,
                           "created": time.time(), "metadata": jsonable(dict(metadata or {})),
                           **({"parent": parent} if parent is not None else {})})
        if parent is not None:  # where in the parent's episode the sub-agent began, and how to find it
            self._append(parent, {"type": "subagent", "session": sid, "time": time.time()})
        return sid

    def path(self, session: str) -> Path:
        """Where ``session`` is recorded (server side only: never sent to clients)."""
        return self.record_dir / f"{session}.jsonl"

    def token(self, session: str) -> str:
        """``session``'s token (for the trusted code that opened it in-process)."""
        return self._session(session, create=False).token

    def session_base_url(self, root: str, session: str) -> str:
        """The ``base_url`` an ``openai`` client of ``session`` uses: ``<root>/s/<session>/<token>/v1``."""
        return f"{root.rstrip('/')}/s/{session}/{self.token(session)}/v1"

    def authorize(self, session: str, presented: str | None, *, create: bool = False) -> str | None:
        """Check that ``presented`` is ``session``'s token; with ``create``, make the session if it is new.

        Returns:
            The token when this call created the session (its creator must learn it), else ``None``.

        Raises:
            APIError: 403 for a missing or wrong token (compared in constant time); 404 for an unknown session
                when ``create`` is false (a name is not a secret: the token is).
        """
        sid = _check_session_id(session)
        with self._lock:
            state = self._sessions.get(sid)
        if state is None and create:
            if presented is not None and not _TOKEN_RE.match(presented):
                raise APIError("A session token must be 22-256 URL-safe characters (letters, digits, '-', '_').",
                               status=403, param="token", code="invalid_session_token")
            try:
                self.open_session(sid, token=presented)
                with self._lock:
                    return self._sessions[sid].token
            except APIError as exc:
                if exc.code != "session_exists":
                    raise
            state = self._opened_elsewhere(sid)
        if state is None:
            raise APIError(f"No session {sid!r}: open it first (POST /v1/sessions) or make a model call in it.",
                           status=404, param="session", code="unknown_session")
        if presented is None or not hmac.compare_digest(presented.encode(), state.token.encode()):
            raise APIError(f"Session {sid!r} needs its token: use the base_url the gateway gave when the session was "
                           f"opened (.../s/<session>/<token>/v1) or send the header {TOKEN_HEADER}. Each session's "
                           "token is given only to the client that created it.", status=403, param="token",
                           code="invalid_session_token", type="permission_error")
        return None

    def authorize_child(self, session: str, presented: str | None, parent: str, parent_token: str | None) -> str | None:
        """Check a sub-agent call: ``parent_token`` must be ``parent``'s token; a new ``session`` is created as
        ``parent``'s child (with the token the call presented, else the parent's); an existing one must already be
        ``parent``'s child and present its own token.

        Returns:
            The token when this call created the session, else ``None``.

        Raises:
            APIError: 403 for a wrong parent token, 404 for an unknown parent, 409 when the parent has ended or the
                session exists with another parent.
        """
        sid, parent = _check_session_id(session), _check_session_id(parent)
        if sid == parent:
            raise APIError(f"Session {sid!r} names itself as its parent in {PARENT_HEADER}; a sub-agent needs a "
                           "session id of its own.", param="session", code="bad_session")
        with self._lock:
            parent_state, state = self._sessions.get(parent), self._sessions.get(sid)
        if parent_state is None:
            raise APIError(f"No parent session {parent!r} ({PARENT_HEADER}): the parent must be an open session of "
                           "this gateway.", status=404, param="parent", code="unknown_session")
        if parent_token is None or not hmac.compare_digest(parent_token.encode(), parent_state.token.encode()):
            raise APIError(f"The parent session {parent!r} needs its token: send it in {PARENT_TOKEN_HEADER} (or use "
                           "the parent's token as this call's session token).", status=403, param="parent",
                           code="invalid_session_token", type="permission_error")
        if state is None:
            if parent_state.ended:
                raise APIError(f"The parent session {parent!r} has ended; start sub-agents before the episode's "
                               "reward is in.", status=409, param="parent", code="session_ended")
            if presented is not None and not _TOKEN_RE.match(presented):
                raise APIError("A session token must be 22-256 URL-safe characters (letters, digits, '-', '_').",
                               status=403, param="token", code="invalid_session_token")
            try:
                self.open_session(sid, token=presented or parent_state.token, parent=parent,
                                  group_id=parent_state.group_id)
                return self.token(sid)
            except APIError as exc:
                if exc.code != "session_exists":
                    raise
            state = self._opened_elsewhere(sid)
        if state.parent != parent:
            raise APIError(f"Session {sid!r} exists and is not a sub-agent of {parent!r}; give the sub-agent a new "
                           "session id.", status=409, param="session", code="session_exists")
        return self.authorize(sid, presented)

    def _session(self, sid: str, *, create: bool) -> _Session:
        sid = _check_session_id(sid)
        with self._lock:
            state = self._sessions.get(sid)
        if state is not None:
            return state
        if not create:
            raise APIError(f"No session {sid!r}: open it first (POST /v1/sessions) or make a model call in it.",
                           status=404, param="session", code="unknown_session")
        try:
            self.open_session(sid)
        except APIError as exc:
            if exc.code != "session_exists":
                raise
        return self._opened_elsewhere(sid)

    def _opened_elsewhere(self, sid: str) -> _Session:
        """The session another call opened first; 409 when it exists only as an earlier run's file."""
        with self._lock:
            state = self._sessions.get(sid)
        if state is None:  # recorded by an earlier gateway run: never append to another run's file
            raise APIError(f"Session {sid!r} was recorded by an earlier run of this gateway; use a new id.",
                           status=409, param="session", code="session_exists")
        return state

    def _append(self, sid: str, record: Mapping[str, Any]) -> None:
        """One JSON line, written with a single ``write`` so a crash never leaves half a record."""
        line = json.dumps(jsonable(dict(record)), ensure_ascii=False) + "\n"
        with open(self.path(sid), "a", encoding="utf-8") as f:
            f.write(line)

    def record_call(self, sid: str, record: Mapping[str, Any]) -> None:
        state = self._session(sid, create=True)
        self._append(sid, {"type": "call", "session": sid, "index": state.calls, **record})
        state.calls += 1

    def next_call_seed(self, sid: str) -> int | None:
        state = self._session(sid, create=True)
        return None if state.seed is None else _call_seed(state.seed, state.calls)

    # -- the env an agent plays through the gateway --
    def _lock_of(self, state: _Session) -> asyncio.Lock:
        if state.lock is None:
            state.lock = asyncio.Lock()
        return state.lock

    async def reset(self, sid: str) -> dict[str, Any]:
        state = self._session(sid, create=False)
        if state.env_id is None:
            raise APIError(f"Session {sid!r} has no env: open it with {{'env': ...}} (POST /v1/sessions) to play one, "
                           "or report the reward with POST .../v1/session/reward.", status=409, code="no_env")
        async with self._lock_of(state):
            if state.env is not None:
                raise APIError(f"Session {sid!r} was already reset: one session is one episode; open a new one.",
                               status=409, code="already_reset")

            def make_and_reset() -> tuple[Any, Any, Any]:
                import gymnasium as gym

                env = gym.make(state.env_id, **state.env_kwargs)
                options = {"task": state.task} if state.task is not None else None
                obs, info = env.reset(seed=state.seed, options=options)
                return env, obs, info

            state.env, observation, info = await asyncio.to_thread(make_and_reset)
        self._append(sid, {"type": "reset", "observation": observation, "task_id": info.get("task_id")})
        return {"observation": observation, "instructions": info.get("instructions", ""),
                "tools": jsonable(info.get("tools") or []), "task_id": info.get("task_id")}

    async def step(self, sid: str, action: str) -> dict[str, Any]:
        state = self._session(sid, create=False)
        if state.env is None:
            raise APIError(f"Session {sid!r} has no running env: call POST .../v1/env/reset first.", status=409,
                           code="not_reset")
        async with self._lock_of(state):
            if state.ended:
                raise APIError(f"Session {sid!r} has ended; open a new session for another episode.", status=409,
                               code="session_ended")
            observation, reward, terminated, truncated, info = await asyncio.to_thread(state.env.step, action)
            state.steps += 1
            state.total_reward += float(reward)
            turn = info.get("turn") or {}
            self._append(sid, {"type": "step", "action": action, "observation": observation, "reward": float(reward),
                               "terminated": bool(terminated), "truncated": bool(truncated), "turn": turn})
            outcome = info.get("outcome") if terminated or truncated else None
            if outcome is not None:
                self._end(state, {"source": "env", "outcome": outcome,
                                  "end_reason": outcome.get("end_reason", "answered")})
        return {"observation": observation, "reward": float(reward), "terminated": bool(terminated),
                "truncated": bool(truncated), "done": outcome is not None, "outcome": jsonable(outcome)}

    def report_reward(self, sid: str, reward: float, success: bool | None) -> dict[str, Any]:
        """End a session with the reward the agent program computed itself."""
        state = self._session(sid, create=False)
        if state.ended:
            raise APIError(f"Session {sid!r} has already ended.", status=409, code="session_ended")
        if state.env is not None:
            raise APIError(f"Session {sid!r} plays an env, whose outcome is its reward; step the env to its end "
                           "instead of reporting a reward.", status=409, code="env_session")
        outcome = {"success": bool(reward > 0) if success is None else bool(success), "score": float(reward),
                   "end_reason": "answered"}
        self._end(state, {"source": "agent", "outcome": outcome, "end_reason": "answered"})
        return {"session": sid, "ended": True, "outcome": outcome}

    def _end(self, state: _Session, record: Mapping[str, Any]) -> None:
        state.ended = True
        self._append(state.id, {"type": "end", **record})
        if state.env is not None:
            with contextlib.suppress(Exception):
                state.env.close()

    def summary(self, sid: str) -> dict[str, Any]:
        state = self._session(sid, create=False)
        return {"session": sid, "env": state.env_id, "task_id": state.task.id if state.task else None,
                "calls": state.calls, "steps": state.steps, "ended": state.ended}

    def close(self) -> None:
        """Close every env still open (sessions that never ended stay unended in their files)."""
        with self._lock:
            states = list(self._sessions.values())
        for state in states:
            if state.env is not None:
                with contextlib.suppress(Exception):
                    state.env.close()
                state.env = None


# ---- what a call's response holds ------------------------------------------------------------------
def _chat_choice_record(choice: Mapping[str, Any]) -> dict[str, Any]:
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    text = message.get("content") or ""
    lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
    entries = lp.get("content") if isinstance(lp.get("content"), list) else []
    return {"text": text, "tool_calls": message.get("tool_calls"), "token_ids": _int_list(choice.get("token_ids")),
            "logprobs": [e.get("logprob") for e in entries if isinstance(e, Mapping)],
            "logprob_tokens": [e.get("token") for e in entries if isinstance(e, Mapping)],
            "finish_reason": choice.get("finish_reason")}


def _completion_choice_record(choice: Mapping[str, Any]) -> dict[str, Any]:
    lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
    return {"text": choice.get("text") or "", "token_ids": _int_list(choice.get("token_ids")),
            "logprobs": list(lp.get("token_logprobs") or []), "logprob_tokens": list(lp.get("tokens") or []),
            "finish_reason": choice.get("finish_reason"),
            "prompt_token_ids": _int_list(choice.get("prompt_token_ids"))}


class _UpstreamError(Exception):
    """The upstream server refused a call: its answer, for the client in the API it spoke."""

    def __init__(self, status: int, content: bytes, media_type: str) -> None:
        super().__init__(status)
        self.status, self.content, self.media_type = status, content, media_type


class _Proxy:
    """Forwards calls upstream, records them, and answers the client with what it asked for."""

    def __init__(self, gateway: Gateway, client: httpx.AsyncClient) -> None:
        self.gateway = gateway
        self.client = client

    @staticmethod
    def upstream_body(body: Mapping[str, Any], endpoint: str, seed: int | None) -> dict[str, Any]:
        out = dict(body)
        out["return_token_ids"] = True
        if endpoint == "chat":
            out["logprobs"] = True
        else:
            requested = body.get("logprobs")
            out["logprobs"] = max(1, requested if isinstance(requested, int) and not isinstance(requested, bool) else 0)
        if seed is not None and body.get("seed") is None:
            out["seed"] = seed
        return out

    @staticmethod
    def for_client(data: dict[str, Any], body: Mapping[str, Any], endpoint: str) -> dict[str, Any]:
        """Drop what the gateway asked for and the client did not (the client sees the server's own answer)."""
        if not body.get("return_token_ids"):
            data.pop("prompt_token_ids", None)
        wants_logprobs = bool(body.get("logprobs")) if endpoint == "chat" else body.get("logprobs") is not None
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if not body.get("return_token_ids"):
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            if not wants_logprobs:
                choice["logprobs"] = None
        return data

    def _fill_ids(self, body: Mapping[str, Any], endpoint: str, prompt_ids: list[int] | None,
                  rec: dict[str, Any]) -> dict[str, Any]:
        """Complete a choice's record: ids from ``token_id:N`` log-prob tokens or the local tokenizer when the
        server gave none, with ``ids_source`` saying which."""
        source = "server"
        ids = rec.get("token_ids")
        if ids is None:
            parsed = [_TOKEN_ID_RE.match(t) if isinstance(t, str) else None for t in rec.get("logprob_tokens") or []]
            if parsed and all(parsed):
                ids = [int(m.group(1)) for m in parsed]  # type: ignore[union-attr]
        tok = self.gateway.tokenizer
        if ids is None and tok is not None:
            ids, source = list(tok.encode(rec["text"], add_special_tokens=False)), "tokenized"
        if prompt_ids is None and tok is not None:
            prompt_ids, source = self._local_prompt_ids(body, endpoint), "tokenized"
        if ids is None or prompt_ids is None:
            source = None
        logprobs = rec.get("logprobs") or []
        if ids is None or len(logprobs) != len(ids) or not all(isinstance(v, (int, float)) for v in logprobs):
            logprobs = None
        rec.pop("logprob_tokens", None)
        return {**rec, "prompt_token_ids": prompt_ids, "token_ids": ids, "logprobs": logprobs, "ids_source": source}

    def _local_prompt_ids(self, body: Mapping[str, Any], endpoint: str) -> list[int] | None:
        tok = self.gateway.tokenizer
        if endpoint == "chat":
            from agentgym.policies.chat_messages import MessageError, normalize_messages

            try:  # rendered as the server renders it (vLLM's normalisation), or the ids are not the model's
                messages = normalize_messages(list(body.get("messages") or []), getattr(tok, "chat_template", None))
            except MessageError:
                return None
            text = tok.apply_chat_template(messages, tools=body.get("tools"), tokenize=False,
                                           add_generation_prompt=True)
            return list(tok.encode(text, add_special_tokens=False))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return list(tok.encode(prompt))
        return _int_list(prompt)

    def record(self, sid: str, body: Mapping[str, Any], endpoint: str, data: Mapping[str, Any], *,
               api: str = "openai") -> None:
        top_prompt = _int_list(data.get("prompt_token_ids"))
        for choice in data.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            if endpoint == "chat":
                rec, prompt_ids = _chat_choice_record(choice), top_prompt or _int_list(choice.get("prompt_token_ids"))
            else:
                rec = _completion_choice_record(choice)
                prompt_ids = rec.pop("prompt_token_ids") or top_prompt
            rec = self._fill_ids(body, endpoint, prompt_ids, rec)
            self.gateway.record_call(sid, {
                "endpoint": endpoint, "api": api, "choice": choice.get("index", 0), "model": body.get("model"),
                "observation": _observation_of(body), "temperature": body.get("temperature", 1.0),
                "top_p": body.get("top_p", 1.0), **rec, "time": time.time()})

    def prepare(self, body: Mapping[str, Any], endpoint: str, sid: str) -> dict[str, Any]:
        """The body sent upstream for ``body`` (ids and log-probs asked for, the session's per-call seed)."""
        return self.upstream_body(body, endpoint, self.gateway.next_call_seed(sid))

    async def complete(self, upstream: dict[str, Any], endpoint: str, sid: str, *,
                       api: str = "openai") -> dict[str, Any]:
        """One non-streamed call, recorded; the upstream's answer as JSON.

        Raises:
            _UpstreamError: the upstream refused the call (nothing is recorded).
        """
        response = await self.client.post("/chat/completions" if endpoint == "chat" else "/completions", json=upstream)
        if response.status_code != 200:
            raise _UpstreamError(response.status_code, response.content,
                                 response.headers.get("content-type", "application/json"))
        data = response.json()
        self.record(sid, upstream, endpoint, data, api=api)
        return data

    async def chunks(self, upstream: dict[str, Any], endpoint: str, sid: str, *,
                     api: str = "openai") -> AsyncIterator[dict[str, Any] | str]:
        """A streamed call: the upstream's parsed chunks (and ``"[DONE]"``), the whole call recorded at its end.

        Raises:
            _UpstreamError: before the first chunk, when the upstream refused the call.
        """
        path = "/chat/completions" if endpoint == "chat" else "/completions"
        response = await self.client.send(self.client.build_request("POST", path, json=upstream), stream=True)
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            raise _UpstreamError(response.status_code, content,
                                 response.headers.get("content-type", "application/json"))

        async def relay() -> AsyncIterator[dict[str, Any] | str]:
            merged: dict[str, Any] = {"choices": {}}
            try:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[len("data: "):]
                    if payload.strip() == "[DONE]":
                        yield "[DONE]"
                        continue
                    chunk = json.loads(payload)
                    self._accumulate(merged, chunk, endpoint)
                    yield chunk
            finally:
                await response.aclose()
            self.record(sid, upstream, endpoint, self._as_response(merged, endpoint), api=api)

        return relay()

    async def generate(self, body: Mapping[str, Any], endpoint: str, sid: str) -> Response:
        upstream = self.prepare(body, endpoint, sid)
        try:
            if body.get("stream"):
                return await self._stream(body, upstream, endpoint, sid)
            data = await self.complete(upstream, endpoint, sid)
        except _UpstreamError as exc:
            return Response(exc.content, status_code=exc.status, media_type=exc.media_type)
        return JSONResponse(self.for_client(data, body, endpoint))

    async def _stream(self, body: Mapping[str, Any], upstream: dict[str, Any], endpoint: str, sid: str) -> Response:
        chunks = await self.chunks(upstream, endpoint, sid)

        async def relay() -> AsyncIterator[str]:
            async for chunk in chunks:
                if chunk == "[DONE]":
                    yield "data: [DONE]\n\n"
                else:
                    yield f"data: {json.dumps(self.for_client(chunk, body, endpoint), ensure_ascii=False)}\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def messages(self, body: Mapping[str, Any], sid: str) -> Response:
        """An Anthropic Messages call (``body`` already converted to the chat form), answered in that API's shape."""
        upstream = self.prepare(body, "chat", sid)
        try:
            if not body.get("stream"):
                data = await self.complete(upstream, "chat", sid, api="anthropic")
                return JSONResponse(anthropic_messages.to_message(data, body))
            chunks = await self.chunks(upstream, "chat", sid, api="anthropic")
        except _UpstreamError as exc:
            return anthropic_messages.error_response(anthropic_messages.upstream_error(exc.status, exc.content))

        async def events() -> AsyncIterator[str]:
            stream = anthropic_messages.MessageStream(body)
            async for chunk in chunks:
                if isinstance(chunk, dict):
                    for event in stream.feed(chunk):
                        yield event
            for event in stream.finish():
                yield event

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @staticmethod
    def _accumulate(merged: dict[str, Any], chunk: Mapping[str, Any], endpoint: str) -> None:
        """Fold one SSE chunk into the whole response (text, ids, log-probs, calls, finish reason per choice)."""
        if _int_list(chunk.get("prompt_token_ids")):
            merged["prompt_token_ids"] = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            acc = merged["choices"].setdefault(choice.get("index", 0), {
                "index": choice.get("index", 0), "text": "", "token_ids": [], "lp": [], "tokens": [],
                "tool_calls": [], "finish_reason": None, "prompt_token_ids": None, "has_ids": False})
            if endpoint == "chat":
                delta = choice.get("delta") if isinstance(choice.get("delta"), Mapping) else {}
                acc["text"] += delta.get("content") or ""
                acc["tool_calls"] += list(delta.get("tool_calls") or [])
                lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
                for entry in lp.get("content") or []:
                    acc["lp"].append(entry.get("logprob"))
                    acc["tokens"].append(entry.get("token"))
            else:
                acc["text"] += choice.get("text") or ""
                lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
                acc["lp"] += list(lp.get("token_logprobs") or [])
                acc["tokens"] += list(lp.get("tokens") or [])
                if _int_list(choice.get("prompt_token_ids")):
                    acc["prompt_token_ids"] = choice["prompt_token_ids"]
            ids = _int_list(choice.get("token_ids"))
            if ids is not None:
                acc["token_ids"] += ids
                acc["has_ids"] = True
            if choice.get("finish_reason") is not None:
                acc["finish_reason"] = choice["finish_reason"]

    @staticmethod
    def _as_response(merged: Mapping[str, Any], endpoint: str) -> dict[str, Any]:
        choices = []
        for acc in merged["choices"].values():
            ids = acc["token_ids"] if acc["has_ids"] else None
            if endpoint == "chat":
                logprobs = {"content": [{"token": t, "logprob": v} for t, v in zip(acc["tokens"], acc["lp"])]}
                message = {"role": "assistant", "content": acc["text"], "tool_calls": acc["tool_calls"] or None}
                choices.append({"index": acc["index"], "message": message, "logprobs": logprobs, "token_ids": ids,
                                "finish_reason": acc["finish_reason"]})
            else:
                choices.append({"index": acc["index"], "text": acc["text"], "token_ids": ids,
                                "prompt_token_ids": acc["prompt_token_ids"], "finish_reason": acc["finish_reason"],
                                "logprobs": {"token_logprobs": acc["lp"], "tokens": acc["tokens"]}})
        return {"prompt_token_ids": merged.get("prompt_token_ids"), "choices": choices}


# ---- the app ----------------------------------------------------------------------------------------
def create_gateway_app(upstream: str | FastAPI, record_dir: str | Path, *, tokenizer: Any = None,
                       timeout_s: float = 600.0, api_key: str | None = None,
                       max_body_bytes: int = RequestLimits.max_body_bytes) -> FastAPI:
    """Build the gateway app in front of ``upstream``.

    Args:
        upstream: The base URL of an OpenAI-compatible server (``http://host:port/v1``, e.g. ``vllm serve``), or
            an app of :func:`agentgym.serving.openai_app.create_app`, served in-process (no second socket; its lifespan runs
            inside the gateway's).
        record_dir: Where session files go.
        tokenizer: Optional local tokenizer for servers that report no token ids (see the module docstring).
        timeout_s: How long an upstream call may take.
        api_key: Require this key on every route but ``/health`` (``None``: open; see the module docstring).
        max_body_bytes: Largest request body the gateway reads (413 beyond it, before anything is read or
            forwarded), the same limit and default as ``agentgym serve``'s ``--max-body-bytes``.

    Returns:
        The app; ``app.state.gateway`` is the :class:`Gateway` (open sessions from Python with it). An in-process
        upstream's ``state`` fields (``stats``, ``policy``, ``model_name``) are copied onto it.
    """
    gateway = Gateway(record_dir, tokenizer=tokenizer)
    inner: FastAPI | None = None
    if isinstance(upstream, str):
        if not upstream.startswith(("http://", "https://")):
            raise ConfigError(f"upstream must be a server's base URL such as http://127.0.0.1:8000/v1, got {upstream!r}.")
        base = upstream.rstrip("/")
        client = httpx.AsyncClient(base_url=base, timeout=timeout_s)
    else:
        inner = upstream
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=inner), base_url="http://upstream/v1",
                                   timeout=timeout_s)
    proxy = _Proxy(gateway, client)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if inner is not None:
                await stack.enter_async_context(inner.router.lifespan_context(inner))
            try:
                yield
            finally:
                await client.aclose()
                gateway.close()

    app = FastAPI(title="agentgym recording gateway", lifespan=lifespan)
    app.state.gateway = gateway
    if inner is not None:
        for key in ("stats", "policy", "model_name"):
            if hasattr(inner.state, key):
                setattr(app.state, key, getattr(inner.state, key))

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    def session_name(request: Request, body: Mapping[str, Any] | None = None) -> str:
        sid = request.path_params.get("session") or request.headers.get(SESSION_HEADER)
        if not sid and body is not None and isinstance(body.get("user"), str) and body["user"]:
            sid = body["user"]
        if not sid:
            raise APIError(f"This call names no session. Put it in the base URL (http://HOST:PORT/s/<session>/<token>"
                           f"/v1), the header {SESSION_HEADER}, or the request's 'user' field.", code="no_session")
        return _check_session_id(sid)

    def session_of(request: Request, body: Mapping[str, Any] | None = None, *,
                   create: bool = False) -> tuple[str, str | None]:
        """The call's session, checked against the token it presents; and the token if this call created it."""
        sid = session_name(request, body)
        presented = request.path_params.get("token") or request.headers.get(TOKEN_HEADER)
        parent = request.headers.get(PARENT_HEADER)
        if parent and create:  # a sub-agent's model call: linked to its parent, which its token must prove
            return sid, gateway.authorize_child(sid, presented, parent,
                                                request.headers.get(PARENT_TOKEN_HEADER) or presented)
        return sid, gateway.authorize(sid, presented, create=create)

    async def generation(request: Request, endpoint: str) -> Response:
        body = await json_body(request)
        sid, issued = session_of(request, body, create=True)
        response = await proxy.generate(body, endpoint, sid)
        if issued is not None:  # this call created the session: its client needs the token for the next ones
            response.headers[TOKEN_HEADER] = issued
        return response

    async def chat(request: Request) -> Response:
        return await generation(request, "chat")

    async def completions(request: Request) -> Response:
        return await generation(request, "completions")

    async def messages(request: Request) -> Response:
        """Anthropic's Messages API: converted to the chat form, recorded as chat calls, answered in its shape."""
        try:
            body = await json_body(request)
            chat_body = anthropic_messages.to_chat_request(body)
            sid, issued = session_of(request, chat_body, create=True)
            response = await proxy.messages(chat_body, sid)
        except APIError as exc:
            return anthropic_messages.error_response(exc)
        if issued is not None:
            response.headers[TOKEN_HEADER] = issued
        return response

    async def env_reset(request: Request) -> JSONResponse:
        sid, _ = session_of(request)
        return JSONResponse(await gateway.reset(sid))

    async def env_step(request: Request) -> JSONResponse:
        body = await json_body(request)
        sid, _ = session_of(request)
        action = body.get("action")
        if not isinstance(action, str):
            raise APIError(f"'action' must be the model's text for this turn (a string), got {action!r}.",
                           param="action")
        return JSONResponse(await gateway.step(sid, action))

    async def reward(request: Request) -> JSONResponse:
        body = await json_body(request)
        sid, _ = session_of(request)
        value = body.get("reward")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise APIError(f"'reward' must be a number, got {value!r}.", param="reward")
        success = body.get("success")
        if success is not None and not isinstance(success, bool):
            raise APIError(f"'success' must be true, false or absent, got {success!r}.", param="success")
        return JSONResponse(gateway.report_reward(sid, float(value), success))

    async def session_info(request: Request) -> JSONResponse:
        sid, _ = session_of(request)
        return JSONResponse(gateway.summary(sid))

    async def passthrough(request: Request) -> Response:
        name = request.url.path.rsplit("/", 1)[-1]
        # /tokenize and /detokenize sit at the server root in vLLM (and agentgym serve), /models under /v1
        url = f"/{name}" if name != "models" else "/models"
        if name == "models":
            response = await client.get(url)
        else:
            root = str(client.base_url).rstrip("/").removesuffix("/v1")
            response = await client.post(root + url, content=await request.body(),
                                         headers={"content-type": "application/json"})
        return Response(response.content, status_code=response.status_code,
                        media_type=response.headers.get("content-type", "application/json"))

    for prefix in ("/v1", "/s/{session}/v1", "/s/{session}/{token}/v1"):
        app.add_api_route(prefix + "/chat/completions", chat, methods=["POST"])
        app.add_api_route(prefix + "/completions", completions, methods=["POST"])
        app.add_api_route(prefix + "/messages", messages, methods=["POST"])
        app.add_api_route(prefix + "/env/reset", env_reset, methods=["POST"])
        app.add_api_route(prefix + "/env/step", env_step, methods=["POST"])
        app.add_api_route(prefix + "/session/reward", reward, methods=["POST"])
        app.add_api_route(prefix + "/session", session_info, methods=["GET"])
        app.add_api_route(prefix + "/models", passthrough, methods=["GET"])
    for name in ("tokenize", "detokenize"):
        app.add_api_route(f"/{name}", passthrough, methods=["POST"])

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})  # where sessions are stored stays on the server

    @app.post("/v1/sessions")
    async def open_session(request: Request) -> JSONResponse:
        body = await json_body(request)
        allowed = {"session", "env", "suite", "split", "task_id", "seed", "group", "env_kwargs", "metadata"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise APIError(f"Unknown field(s) {unknown} for /v1/sessions.{did_you_mean(unknown[0], allowed)} "
                           f"Allowed: {sorted(allowed)}.", param=unknown[0])
        env_id, task, suite_kwargs = body.get("env"), None, {}
        if body.get("suite") is not None:
            task, suite_env, suite_kwargs = _suite_task(body["suite"], body.get("split", "train"), body.get("task_id"))
            env_id = env_id or suite_env
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise APIError(f"'seed' must be an integer, got {seed!r}.", param="seed")
        client_kwargs = body.get("env_kwargs") or {}
        if not isinstance(client_kwargs, Mapping) or set(map(str, client_kwargs)) - _CLIENT_ENV_KWARGS:
            raise APIError(f"'env_kwargs' from a client may set only {sorted(_CLIENT_ENV_KWARGS)} (other keyword "
                           "arguments of an env can name files on the server); put the rest in a suite.",
                           param="env_kwargs")
        if body.get("suite") is not None:
            client_kwargs = {**suite_kwargs, **client_kwargs}
        sid = gateway.open_session(body.get("session"), env_id=env_id, task=task, seed=seed,
                                   group_id=str(body.get("group") or ""), env_kwargs=client_kwargs,
                                   metadata=body.get("metadata"))
        root = str(request.base_url).rstrip("/")
        return JSONResponse({"session": sid, "token": gateway.token(sid),
                             "base_url": gateway.session_base_url(root, sid), "env": env_id,
                             "task_id": task.id if task is not None else None})

    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    if api_key:  # added last, so it runs first: a client without the key gets 401 before its body is read
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    return app


def _suite_task(suite_name: Any, split: Any, task_id: Any) -> tuple[Task, str, dict[str, Any]]:
    from agentgym.registration.suites import load_suite

    try:
        suite = load_suite(str(suite_name))
        tasks = suite.split(str(split))
    except AgentGymError as exc:
        raise APIError(str(exc), param="suite") from exc
    if task_id is None:
        raise APIError("With 'suite', name the task: 'task_id' (an id of the split).", param="task_id")
    by_id = {t.id: t for t in tasks}
    if str(task_id) not in by_id:
        raise APIError(f"No task {task_id!r} in {suite.name}[{split}].{did_you_mean(str(task_id), by_id)}",
                       param="task_id")
    return by_id[str(task_id)], suite.env_id, dict(suite.env_kwargs)


def run_gateway(upstream: str | FastAPI, record_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000,
                tokenizer: str | None = None, api_key: str | None = None,
                max_body_bytes: int = RequestLimits.max_body_bytes) -> None:
    """Serve the gateway until interrupted (``agentgym serve --record DIR [--proxy URL]``).

    Args:
        api_key: The key clients must send; ``None`` reads ``$AGENTGYM_API_KEY`` (unset: open).
    """
    import_uvicorn()  # a missing extra fails before the tokenizer loads
    api_key = resolve_api_key(api_key)
    tok = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    app = create_gateway_app(upstream, record_dir, tokenizer=tok, api_key=api_key, max_body_bytes=max_body_bytes)
    sock = bind_socket(host, port)
    where = upstream if isinstance(upstream, str) else "the local model"
    logger.info("Recording gateway for %s on %s/v1 (sessions in %s)", where, socket_url(sock), record_dir)
    serve(app, sock, log_level="info")
