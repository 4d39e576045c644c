"""Any registered env as a network service that speaks OpenEnv's protocol (``agentgym serve-env``).

Why: a cluster scheduler scales env servers independently of the trainer, and any OpenEnv client (their
``EnvClient``/``GenericEnvClient``, TRL's OpenEnv integration) can drive an agentgym env without importing it.
We do not re-implement the protocol: the server is ``openenv-core``'s own :class:`HTTPEnvServer` (FastAPI: ``/ws``
sessions, ``/reset``, ``/step``, ``/state``, ``/health``, ``/schema``, ``/metadata``; one env per WebSocket
connection, a session limit answered with OpenEnv's ``CAPACITY_REACHED`` error) around an adapter,
:class:`AgentGymEnvironment`, that holds one ``gym.make(env_id)`` per session. The client,
:class:`AgentGymClient`, is an OpenEnv ``EnvClient`` subclass; :class:`agentgym.serving.remote_env.RemoteEnv`
(``gym.make("agentgym/Remote-v0", url=...)``) wraps it back into a Gymnasium env.

Wire format (the pydantic models below, published at ``/schema``):

* action: ``{"text": <the model's raw reply>}``. Other JSON values go through unchanged, so the env rejects them
  as ``invalid`` turns exactly as in-process; a value JSON cannot carry (``bytes``) is sent as
  ``{"text": null, "python_type": "bytes"}``.
* observation: ``{"text", "image_png", "info", "terminated", "truncated", "state_key"}`` plus OpenEnv's ``reward``
  and ``done`` (``terminated or truncated``). ``image_png`` is the base64 PNG of a GUI screenshot (lossless, our
  own codec: same pixels, same bytes); ``info`` is the env's ``info`` made JSON by
  :func:`agentgym.trajectory.jsonable` (the reset info carries ``instructions`` and ``tools``); ``state_key`` is the
  env's GiGPO anchor, kept out of ``info`` because the policy must never see it.
* reset: ``{"seed", "episode_id", "options"}`` with ``options`` ``{"task_id": ...}`` or ``{"task": Task.to_dict()}``.
  A client's options are data: :func:`agentgym.serving.reset_options.check_reset_options` refuses unknown fields
  and any field that names a location on the server (a SWE-bench task's ``repo_path``, a Harbor folder).
* state: ``env_id``, the observation space as JSON, the episode's ``task_id``, ``turn`` and OpenEnv's
  ``episode_id``/``step_count``.

Limits. One client cannot hold the server: a session idle for ``idle_timeout_s`` (default 600 s) is closed and its
env released, one remote address holds at most ``max_sessions_per_client`` sessions (default half the global
``max_sessions``), and refused clients get an OpenEnv error message saying which limit and which flag
(:mod:`agentgym.serving.env_guard`). With an API key (``--api-key`` or ``$AGENTGYM_API_KEY``) every route but
``/health`` needs it (:mod:`agentgym.serving.auth`): ``Authorization: Bearer <key>`` on HTTP and on the WebSocket
handshake (:class:`AgentGymClient` and ``RemoteEnv`` take ``api_key=``; OpenEnv's own ``EnvClient`` sends no
headers, so subclass its ``connect`` or use :class:`AgentGymClient`).

OpenEnv's HTTP ``/reset`` and ``/step`` are stateless by design (each builds and closes a fresh env); episodes live
in ``/ws`` sessions, and a request's mistake (an unknown task id, a ``/step`` with no episode) is answered 400 with
the env's message. openenv-core's ``/mcp`` route is off (404): it made sessions from plain HTTP POSTs, outside every
``/ws`` limit, and agentgym envs expose no MCP tools (see :func:`_turn_off_mcp`). ``openenv-core`` is an optional extra (``pip install 'agentgym[serve-env]'``), imported only
here, and its import costs seconds (it imports gradio), so ``import agentgym`` never touches it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import math
import re
import socket
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from agentgym.errors import AgentGymError, DependencyNotInstalled, EnvCrashed
from agentgym.serving.auth import ApiKeyMiddleware
from agentgym.serving.env_guard import (CLIENT_LIMIT_CLOSE_CODE, CLIENT_LIMIT_REACHED, IDLE_CLOSE_CODE,
                                        SESSION_IDLE_TIMEOUT, GuardStats, SessionGuard)
from agentgym.serving.http import bind_socket, serve
from agentgym.serving.reset_options import check_reset_options, family_of
from agentgym.utils.images import decode_png, encode_png
from agentgym.spaces import UnicodeText
from agentgym.trajectory import jsonable

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field
    from starlette.websockets import WebSocket  # module level: FastAPI resolves route annotations in globals
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise DependencyNotInstalled("openenv-core", "serve-env", "serving envs over OpenEnv's protocol") from exc

__all__ = [
    "AgentGymAction",
    "AgentGymClient",
    "AgentGymEnvironment",
    "AgentGymObservation",
    "AgentGymState",
    "DEFAULT_IDLE_TIMEOUT_S",
    "EnvServerError",
    "action_to_wire",
    "create_env_app",
    "observation_from_wire",
    "serve_env",
    "space_from_json",
    "space_to_json",
]

logger = logging.getLogger(__name__)

#: Seconds a session may wait for its client before the server closes it (a turn of a slow model fits easily).
DEFAULT_IDLE_TIMEOUT_S = 600.0


class EnvServerError(AgentGymError):
    """The env server answered a request with an error (bad request, env exception, capacity reached).

    Attributes:
        code: OpenEnv's error code (``CAPACITY_REACHED``, ``EXECUTION_ERROR``, ``VALIDATION_ERROR``, ...).
    """

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


# ---- wire types ------------------------------------------------------------------------------------------------
class AgentGymAction(Action):
    """One turn: the model's raw reply text (see the module docstring for non-text values)."""

    text: Any = Field(default="", description="The model's raw reply for this turn (a string).")
    python_type: Optional[str] = Field(
        default=None, description="Set when the client's action was not JSON (e.g. 'bytes'); text is then null.")


class AgentGymObservation(Observation):
    """What the env answered: text, an optional screenshot, the env's info and the episode flags."""

    text: str = Field(default="", description="The observation text.")
    image_png: Optional[str] = Field(default=None, description="Base64 PNG of the screenshot (GUI envs), else null.")
    info: dict[str, Any] = Field(default_factory=dict, description="The env's info dict, as JSON.")
    terminated: bool = Field(default=False, description="The episode reached an end state.")
    truncated: bool = Field(default=False, description="The episode was stopped from outside (turn limit).")
    state_key: Optional[str] = Field(default=None, description="The env's anchor state (GiGPO); not for the policy.")


class AgentGymState(State):
    """Session state: which env, its observation space, and where the episode is."""

    env_id: str = ""
    observation_space: dict[str, Any] = Field(default_factory=dict)
    task_id: Optional[str] = None
    turn: int = 0
    done: bool = False
    idle_timeout_s: Optional[float] = Field(
        default=None, description="Seconds the server waits for this session's next message before closing it "
                                  "(null: no limit); any message, a state request included, restarts the wait.")


# ---- spaces as JSON ------------------------------------------------------------------------------------------
def space_to_json(space: Any) -> dict[str, Any]:
    """The JSON description of an env's observation space (text, or ``{"text", "image"}`` for GUI envs).

    Raises:
        AgentGymError: The space is of a kind the wire format does not carry.
    """
    from gymnasium import spaces

    if isinstance(space, UnicodeText):
        return {"type": "text", "min_length": space.min_length, "max_length": space.max_length}
    if isinstance(space, spaces.Dict):
        return {"type": "dict", "spaces": {k: space_to_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, spaces.Box) and space.dtype == np.uint8:
        return {"type": "image", "shape": list(space.shape)}
    raise AgentGymError(f"The env server cannot describe an observation space of type {type(space).__name__} "
                        f"({space}); agentgym envs observe UnicodeText or Dict(text=UnicodeText, image=Box(uint8)).")


def space_from_json(data: Mapping[str, Any]) -> Any:
    """The Gymnasium space that :func:`space_to_json` described."""
    from gymnasium import spaces

    kind = data.get("type")
    if kind == "text":
        return UnicodeText(int(data["max_length"]), min_length=int(data["min_length"]))
    if kind == "dict":
        return spaces.Dict({k: space_from_json(v) for k, v in dict(data["spaces"]).items()})
    if kind == "image":
        return spaces.Box(0, 255, shape=tuple(int(n) for n in data["shape"]), dtype=np.uint8)
    raise AgentGymError(f"Unknown observation space description {dict(data)!r} from the env server; the client and "
                        "server agentgym versions differ (upgrade the older one).")


# ---- observations --------------------------------------------------------------------------------------------
def _to_wire(observation: Any, info: Mapping[str, Any], *, reward: float | None, terminated: bool, truncated: bool,
             state_key: str | None) -> AgentGymObservation:
    if isinstance(observation, str):
        text, image = observation, None
    elif isinstance(observation, Mapping):
        extra = set(observation) - {"text", "image"}
        if extra:
            raise AgentGymError(f"The env server carries observations that are a str or {{'text', 'image'}}; this env "
                                f"returned extra keys {sorted(extra)}.")
        text = str(observation.get("text", ""))
        pixels = observation.get("image")
        image = None if pixels is None else base64.b64encode(encode_png(pixels)).decode("ascii")
    else:
        raise AgentGymError(f"The env server carries str or dict observations; this env returned "
                            f"{type(observation).__name__}.")
    return AgentGymObservation(text=text, image_png=image, info=jsonable(dict(info)), terminated=terminated,
                               truncated=truncated, state_key=state_key, reward=reward,
                               done=terminated or truncated)


def observation_from_wire(observation: AgentGymObservation, space: Any) -> Any:
    """The Gymnasium observation again: a ``str``, or ``{"text", "image": uint8[H, W, C]}`` for a dict space."""
    from gymnasium import spaces

    if not isinstance(space, spaces.Dict):
        return observation.text
    out: dict[str, Any] = {"text": observation.text}
    if "image" in space.spaces:
        if observation.image_png is None:
            raise AgentGymError("The env server sent no image for an env whose observations have one.")
        out["image"] = decode_png(base64.b64decode(observation.image_png))
    return out


# ---- the server-side adapter -----------------------------------------------------------------------------------
_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@functools.lru_cache(maxsize=64)
def _stand_in_type(name: str) -> type:
    """A class named like the client's non-JSON action type, so the env's 'got bytes' message is unchanged."""
    return type(name, (), {"__repr__": lambda self: f"<{name} sent by a remote client>"})


class _EnvCounter:
    """Live envs (made and not yet closed) in this process: the leak check of tests and the load benchmark."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live = 0
        self.made = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.live += n
            self.made += max(n, 0)


LIVE_ENVS = _EnvCounter()


class AgentGymEnvironment(Environment):
    """OpenEnv's ``Environment`` around one agentgym env, made with ``gym.make(env_id, **env_kwargs)``.

    The env is made on the first reset (in the session's own worker thread, where it also steps and closes:
    browser envs need that), so OpenEnv's ``/metadata`` and ``/state`` calls, which build a throwaway instance,
    cost nothing. One instance per WebSocket session, so sessions never share state.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any], observation_space: Mapping[str, Any],
                 inline: bool = False, family: str = "", idle_timeout_s: float | None = None) -> None:
        super().__init__()
        self.env_id = env_id
        self.family = family
        self.env_kwargs = dict(env_kwargs)
        self._space = dict(observation_space)
        self._inline = bool(inline)
        self._executor: ThreadPoolExecutor | None = None
        self._env: Any = None
        self._closed = False
        self._idle_timeout_s = idle_timeout_s
        self._state = AgentGymState(env_id=env_id, observation_space=self._space, idle_timeout_s=idle_timeout_s)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run an env call: inline on the event loop for ``cheap_steps`` envs (microseconds of pure computation, as
        the rollout engine does), else in this session's own worker thread, where the env is made, steps and
        closes (browser envs need one thread)."""
        if self._inline:
            return fn(*args, **kwargs)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentgym-env")
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def reset_async(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
                          options: Optional[dict[str, Any]] = None, **kwargs: Any) -> AgentGymObservation:
        return await self._call(self.reset, seed=seed, episode_id=episode_id, options=options, **kwargs)

    async def step_async(self, action: AgentGymAction, timeout_s: Optional[float] = None,
                         **kwargs: Any) -> AgentGymObservation:
        return await self._call(self.step, action, timeout_s=timeout_s, **kwargs)

    def _ensure_env(self) -> Any:
        if self._closed:
            raise AgentGymError("This session's env is closed; open a new session (a new WebSocket connection).")
        if self._env is None:
            import gymnasium as gym

            import agentgym  # noqa: F401 - registers the ids

            self._env = gym.make(self.env_id, **self.env_kwargs)
            LIVE_ENVS.add(1)
        return self._env

    def _key(self) -> str | None:
        method = getattr(self._env.unwrapped, "state_key", None)
        try:
            return None if method is None else str(method())
        except Exception:  # noqa: BLE001 - a broken key is a missing anchor, as in the rollout engine
            return None

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              options: Optional[dict[str, Any]] = None, **kwargs: Any) -> AgentGymObservation:
        if kwargs:
            raise AgentGymError(f"Unknown reset field(s) {sorted(kwargs)}; the env server takes seed, episode_id and "
                                "options ({'task_id': ...} or {'task': {...}}).")
        options = check_reset_options(options, self.family)  # before the env sees them: clients send data only
        env = self._ensure_env()
        observation, info = env.reset(seed=seed, options=options)
        self._state = AgentGymState(env_id=self.env_id, observation_space=self._space, episode_id=episode_id,
                                    task_id=info.get("task_id"), step_count=0, turn=0, done=False,
                                    idle_timeout_s=self._idle_timeout_s)
        return _to_wire(observation, info, reward=None, terminated=False, truncated=False, state_key=self._key())

    def step(self, action: AgentGymAction, timeout_s: Optional[float] = None, **kwargs: Any) -> AgentGymObservation:
        if self._env is None:
            raise AgentGymError("Call reset before step: this session has no episode yet (OpenEnv's HTTP /step is "
                                "stateless; play episodes over the /ws session endpoint).")
        value = action.text
        if action.python_type is not None:
            if not _TYPE_NAME.match(action.python_type):
                raise AgentGymError(f"python_type must be a Python identifier, got {action.python_type!r}.")
            value = _stand_in_type(action.python_type)()
        observation, reward, terminated, truncated, info = self._env.step(value)
        self._state.step_count += 1
        self._state.turn = int(getattr(self._env.unwrapped, "turn", self._state.step_count))
        self._state.done = bool(terminated or truncated)
        return _to_wire(observation, info, reward=float(reward), terminated=bool(terminated),
                        truncated=bool(truncated), state_key=self._key())

    @property
    def state(self) -> AgentGymState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        from agentgym.registration.catalogue import get_entry

        try:
            description = get_entry(self.env_id).summary
        except AgentGymError:
            description = f"agentgym env {self.env_id}"
        return EnvironmentMetadata(name=self.env_id, description=description, version=_version(),
                                   documentation_url="https://github.com/agentgym/agentgym#serving-envs")

    def close(self) -> None:
        self._closed = True
        env, self._env = self._env, None
        executor, self._executor = self._executor, None
        try:
            if env is not None:
                LIVE_ENVS.add(-1)
                if executor is not None:
                    executor.submit(env.close).result()
                else:
                    env.close()
        finally:
            if executor is not None:
                executor.shutdown(wait=False)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentgym")
    except PackageNotFoundError:
        return "0"


def create_env_app(env_id: str, *, env_kwargs: Mapping[str, Any] | None = None, max_sessions: int = 64,
                   idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S, max_sessions_per_client: int | None = None,
                   api_key: str | None = None) -> Any:
    """The FastAPI app serving ``env_id``: OpenEnv's routes plus ``GET /sessions`` (sessions and live envs).

    One env is made and closed first, to fail here (not at the first client) on a bad id or bad kwargs, and to read
    its observation space.

    Args:
        env_id: A registered id (``agentgym list``).
        env_kwargs: Keyword arguments for ``gym.make`` (e.g. ``{"max_turns": 5}``).
        max_sessions: Concurrent WebSocket sessions (one env each); the next connection gets OpenEnv's
            ``CAPACITY_REACHED`` error.
        idle_timeout_s: Close a session whose client sent nothing for this long while the server waited for it
            (its env is released); ``None`` keeps sessions while their connection lives. A client that
            disconnects frees its env at once either way.
        max_sessions_per_client: Sessions one remote address may hold at a time (default ``max_sessions // 2``,
            at least 1, so one client never fills the server); the next gets ``CLIENT_LIMIT_REACHED``.
        api_key: Require this key on every route but ``/health`` (``None``: open). Callers that read
            ``$AGENTGYM_API_KEY`` resolve it with :func:`agentgym.serving.auth.resolve_api_key` first.

    Raises:
        RegistrationError: Unknown id. AgentGymError: bad arguments or an env whose observations cannot be served.
    """
    import gymnasium as gym
    from fastapi import FastAPI
    from openenv.core.env_server.types import ConcurrencyConfig

    import agentgym  # noqa: F401 - registers the ids
    from agentgym.registration.catalogue import get_entry

    kwargs = dict(env_kwargs or {})
    if not isinstance(max_sessions, int) or max_sessions < 1:
        raise AgentGymError(f"max_sessions must be an integer >= 1, got {max_sessions!r}.")
    if idle_timeout_s is not None and not (isinstance(idle_timeout_s, (int, float)) and idle_timeout_s > 0):
        raise AgentGymError(f"idle_timeout_s must be a number > 0 or None, got {idle_timeout_s!r}.")
    if max_sessions_per_client is None:
        max_sessions_per_client = max(1, max_sessions // 2)
    if not isinstance(max_sessions_per_client, int) or max_sessions_per_client < 1:
        raise AgentGymError(f"max_sessions_per_client must be an integer >= 1, got {max_sessions_per_client!r}.")
    if env_id not in gym.registry:
        get_entry(env_id)  # raises RegistrationError with "did you mean"
    if env_id.split(":", 1)[-1] == "agentgym/Remote-v0":
        raise AgentGymError("Serving agentgym/Remote-v0 would proxy a proxy; serve the env it points at instead.")
    probe = gym.make(env_id, **kwargs)
    try:
        space = space_to_json(probe.observation_space)
        inline = bool(getattr(probe.unwrapped, "cheap_steps", False))
        family = family_of(probe)
    finally:
        probe.close()

    app = FastAPI(title=f"agentgym env server: {env_id}", version=_version(),
                  description="An agentgym env behind OpenEnv's protocol (openenv-core's HTTPEnvServer).")
    factory = functools.partial(AgentGymEnvironment, env_id=env_id, env_kwargs=kwargs, observation_space=space,
                                inline=inline, family=family, idle_timeout_s=idle_timeout_s)
    # The idle timeout is ours (SessionGuard), not OpenEnv's reaper: the reaper counts a long step as idleness
    # and closes the env under it, and it leaves the connection open.
    server = HTTPEnvServer(factory, AgentGymAction, AgentGymObservation,
                           concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                                session_timeout=None))
    server.register_routes(app)
    _turn_off_mcp(app)
    _answer_env_errors_with_4xx(app)
    guard = GuardStats()

    @app.get("/sessions", tags=["Health"], summary="Sessions, capacity and live envs of this server")
    async def sessions() -> dict[str, Any]:
        status = server.get_capacity_status()
        return {"env_id": env_id, "active_sessions": status.active_sessions, "max_sessions": status.max_sessions,
                "max_sessions_per_client": max_sessions_per_client, "idle_timeout_s": idle_timeout_s,
                "idle_closed": guard.idle_closed, "refused_per_client": guard.refused,
                "live_envs": LIVE_ENVS.live, "envs_made": LIVE_ENVS.made}

    # Added last = outermost: a request without the key is refused before it counts against its client's cap.
    # A per-client cap as large as the global one never binds first: leave it out, so a full server answers with
    # OpenEnv's own CAPACITY_REACHED.
    app.add_middleware(SessionGuard, idle_timeout_s=idle_timeout_s, stats=guard,
                       max_per_client=max_sessions_per_client if max_sessions_per_client < max_sessions else None)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.state.env_server = server
    app.state.session_guard = guard
    return app


MCP_OFF_CLOSE_CODE = 4404
"""WebSocket close code for ``/mcp`` (application range, RFC 6455 section 7.4.2; echoes HTTP's 404)."""

_MCP_OFF = ("This env server does not serve MCP: agentgym envs take their tool calls as the text of a step action "
            "on a /ws session (OpenEnv's EnvClient/GenericEnvClient, or gym.make('agentgym/Remote-v0', url=...)).")


def _turn_off_mcp(app: Any) -> None:
    """Replace openenv-core's ``/mcp`` routes (HTTP POST and WebSocket) with a 404 that says where to go.

    Why: its ``openenv/session/create`` method makes a server session from a plain HTTP POST. Such sessions sit
    outside the ``/ws`` connection that the per-client cap and the idle timeout watch, so a few anonymous POSTs
    filled a server for good. agentgym envs expose no MCP tools (their tools run inside ``step``), so the route
    served nothing else.
    """
    from fastapi.responses import JSONResponse

    app.router.routes = [route for route in app.router.routes if getattr(route, "path", None) != "/mcp"]

    @app.post("/mcp", include_in_schema=False)
    async def mcp_off() -> Any:
        return JSONResponse(status_code=404, content={"detail": _MCP_OFF, "code": "MCP_NOT_SERVED"})

    @app.websocket("/mcp")
    async def mcp_ws_off(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(json.dumps({"type": "error", "data": {"code": "MCP_NOT_SERVED",
                                                                        "message": _MCP_OFF}}))
        await websocket.close(code=MCP_OFF_CLOSE_CODE, reason="MCP is not served")


def _answer_env_errors_with_4xx(app: Any) -> None:
    """HTTP ``/reset`` and ``/step`` answer a client's mistake with 400 and the env's message, not a bare 500.

    The env raises :class:`AgentGymError` for what the request got wrong (an unknown task id, a step with no
    episode: OpenEnv's HTTP ``/step`` builds a fresh env per request, so it never has one); an env that crashed
    (:class:`EnvCrashed`) is the server's failure, answered 502. WebSocket sessions send their errors as OpenEnv
    error messages already and do not pass through here.
    """
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.exception_handler(AgentGymError)
    async def env_error(request: Request, exc: AgentGymError) -> Any:
        crashed = isinstance(exc, EnvCrashed)
        return JSONResponse(status_code=502 if crashed else 400,
                            content={"detail": str(exc), "code": "ENV_CRASHED" if crashed else type(exc).__name__})


def _drop_close_after_disconnect(record: logging.LogRecord) -> bool:
    """Drop uvicorn's "Exception in ASGI application" for a client that left first: openenv-core's /ws handler
    closes the socket after destroying the session and catches only RuntimeError, so every client that closes
    first logs a WebSocketDisconnect traceback although nothing went wrong (its env is already closed)."""
    exc = record.exc_info[1] if record.exc_info else None
    return type(exc).__name__ not in ("WebSocketDisconnect", "ClientDisconnected")


def serve_env(env_id: str, *, host: str = "127.0.0.1", port: int = 8000, env_kwargs: Mapping[str, Any] | None = None,
              max_sessions: int = 64, idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
              max_sessions_per_client: int | None = None, api_key: str | None = None,
              sock: socket.socket | None = None, on_ready: Any = None) -> None:
    """Serve ``env_id`` until interrupted (SIGINT/SIGTERM close every session's env before exiting).

    Args:
        sock: An already bound socket (see :func:`agentgym.serving.http.bind_socket`); otherwise one is bound on
            ``host:port``.
        on_ready: Called with the server URL once the app is built and the socket listens.
        Other arguments: as :func:`create_env_app`.
    """
    app = create_env_app(env_id, env_kwargs=env_kwargs, max_sessions=max_sessions, idle_timeout_s=idle_timeout_s,
                         max_sessions_per_client=max_sessions_per_client, api_key=api_key)
    sock = sock or bind_socket(host, port)

    def ready(url: str) -> None:
        if on_ready is not None:
            on_ready(url)
        logger.info("serving %s on %s (max %d sessions)", env_id, url, max_sessions)

    serve(app, sock, log_level="warning", on_ready=ready, log_filter=_drop_close_after_disconnect,
          ws_max_size=100 * 2**20, timeout_graceful_shutdown=10)


# ---- the client ------------------------------------------------------------------------------------------------
class AgentGymClient(EnvClient[AgentGymAction, AgentGymObservation, AgentGymState]):
    """OpenEnv's ``EnvClient`` for an agentgym env server (async; ``.sync()`` gives OpenEnv's sync wrapper).

    Args:
        base_url: The server's URL (``http://...`` or ``ws://...``).
        api_key: The server's API key, sent as ``Authorization: Bearer <key>`` on the WebSocket handshake
            (OpenEnv's own ``connect`` sends no headers); ``None``: none.
        Other keyword arguments: as OpenEnv's ``EnvClient``.

    Errors the server sends back raise :class:`EnvServerError` (a capacity error says how to raise the limit; a
    refused key has code ``UNAUTHORIZED``; a session the server closed for idleness ``SESSION_IDLE_TIMEOUT``);
    a connection that drops or times out raises what ``websockets``/``asyncio`` raise, which
    :class:`~agentgym.serving.remote_env.RemoteEnv` turns into an episode that ends with ``end_reason="error"``.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._api_key = api_key

    async def connect(self) -> AgentGymClient:
        """Open the session's WebSocket, with the API key in the handshake's ``Authorization`` header."""
        if self._ws is not None:
            return self
        from websockets.asyncio.client import connect as ws_connect
        from websockets.exceptions import InvalidStatus

        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
        local = any(host in self._ws_url.lower() for host in ("://localhost", "://127.0.0.1", "://[::1]"))
        try:
            # Loopback never goes through a proxy (as OpenEnv's own connect arranges); other hosts use the
            # environment's proxy settings.
            self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                        max_size=self._max_message_size, additional_headers=headers,
                                        proxy=None if local else True)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                hint = ("pass the server's key (api_key=... or $AGENTGYM_API_KEY)" if not self._api_key
                        else "the key given is not the server's")
                raise EnvServerError(f"The env server at {self._ws_url} refused the connection (HTTP {status}): "
                                     f"missing or wrong API key; {hint}.", "UNAUTHORIZED") from None
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - OpenEnv's own connect raises ConnectionError for every failure
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    def _step_payload(self, action: AgentGymAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"}, exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AgentGymObservation]:
        fields = dict(payload.get("observation") or {})
        observation = AgentGymObservation(**fields, reward=payload.get("reward"), done=bool(payload.get("done")))
        return StepResult(observation=observation, reward=payload.get("reward"), done=bool(payload.get("done")))

    def _parse_state(self, payload: dict[str, Any]) -> AgentGymState:
        return AgentGymState(**payload)

    async def _buffered_error(self) -> dict[str, Any]:
        """The message the server sent before closing (its reason), if one is still buffered; else ``{}``."""
        try:
            return dict(json.loads(await asyncio.wait_for(self._ws.recv(), timeout=1.0)))
        except Exception:  # noqa: BLE001 - nothing buffered: the connection really is gone
            return {}

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            await self._send(message)
        except ConnectionClosed as exc:
            # A server that refuses or closes the session (capacity, per-client limit, idle timeout) says why in
            # one message before closing, possibly before our message goes out: that answer is still buffered.
            response = await self._buffered_error()
            if response.get("type") != "error":
                response = _close_reason(exc)
                if response is None:
                    raise
        else:
            try:
                response = await self._receive()
            except ConnectionClosed as exc:
                response = _close_reason(exc)
                if response is None:
                    raise
        if response.get("type") == "error":
            data = response.get("data") or {}
            code = str(data.get("code", "UNKNOWN"))
            text = str(data.get("message", "unknown error"))
            if code == "CAPACITY_REACHED":
                text = (f"{text} Start the server with a larger --max-sessions, run more servers, or close idle "
                        "clients.")
            raise EnvServerError(f"The env server at {self._ws_url} answered with {code}: {text}", code)
        return response


def _close_reason(exc: Any) -> dict[str, Any] | None:
    """The error a close code of :mod:`agentgym.serving.env_guard` stands for (its message was lost), else None."""
    rcvd = getattr(exc, "rcvd", None)
    code = getattr(rcvd, "code", None)
    names = {IDLE_CLOSE_CODE: SESSION_IDLE_TIMEOUT, CLIENT_LIMIT_CLOSE_CODE: CLIENT_LIMIT_REACHED}
    if code not in names:
        return None
    reason = f"the server closed the session ({rcvd.reason})."
    return {"type": "error", "data": {"code": names[code], "message": reason}}


def finite_or_zero(value: Any) -> float:
    """A reward from the wire as a finite float (None, the reset's reward, is 0.0)."""
    if value is None:
        return 0.0
    number = float(value)
    if not math.isfinite(number):
        raise EnvCrashed(f"The env server sent a non-finite reward {value!r}.")
    return number


def action_to_wire(action: Any) -> AgentGymAction:
    """The wire form of any action the client was given (see the module docstring)."""
    try:
        json.dumps(action, allow_nan=False)
    except (TypeError, ValueError):
        return AgentGymAction(text=None, python_type=type(action).__name__)
    return AgentGymAction(text=action)
