"""``agentgym/Remote-v0``: a Gymnasium env whose real env runs in an env server (``agentgym serve-env``).

``gym.make("agentgym/Remote-v0", url="http://host:8000")`` opens one OpenEnv WebSocket session (one env on the
server) and behaves like the served env: same observations (text, or ``{"text", "image"}`` for GUI envs), rewards,
flags, ``info`` (reset info with ``instructions`` and ``tools``, per-turn ``info["turn"]``, the outcome) and
``state_key()``, so agents, the rollout engine and trainers work unchanged. It is built on OpenEnv's own client
(:class:`~agentgym.serving.env_server.AgentGymClient`, an ``EnvClient``, with OpenEnv's sync wrapper).

Failures: a server that dies, drops the connection or does not answer within ``timeout_s`` ends the current episode
with ``end_reason="error"`` (terminated, reward so that the episode's return is 0, like an in-process
:class:`~agentgym.errors.EnvCrashed`), never a hang; the next ``reset`` reconnects and raises ``EnvCrashed`` when
the server is still gone. Errors the server answers on purpose (a bad reset option, a full server, a refused API
key) raise :class:`~agentgym.serving.env_server.EnvServerError` with the server's message.

Idle time. The server closes a session that sends nothing for its ``--idle-timeout`` after a reply (the rule is in
:mod:`agentgym.serving.env_guard`). The server cannot see the client's model call, so while an episode waits for its
next action, :class:`RemoteEnv` sends OpenEnv's ``state`` request in the background every third of the server's
timeout (the server publishes it in its state), for up to ``keepalive_s`` per turn: a slow model turn keeps its
session, an abandoned episode still lets the server reclaim its env. A session that expired anyway ("session
expired", close code 4408) ends a running episode with ``end_reason="error"``; the next ``reset`` opens a new
session by itself and logs that it did.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym

from agentgym.errors import AgentGymError, EnvCrashed
from agentgym.spaces import UnicodeText

__all__ = ["EnvServerProcess", "RemoteEnv", "launch_env_server"]

logger = logging.getLogger(__name__)


class RemoteEnv(gym.Env):
    """One session of an agentgym env server, as a Gymnasium env.

    Args:
        url: The server's base URL (``http://127.0.0.1:8000``; ``ws://`` works too).
        env_id: The env id you expect the server to serve; a different one raises at once (``None``: any).
        connect_timeout_s: Longest wait to open the WebSocket session.
        timeout_s: Longest wait for one answer (reset, step); past it the episode ends with ``end_reason="error"``.
        api_key: The server's API key (``None``: ``$AGENTGYM_API_KEY`` if set, else none).
        keepalive_s: How long one turn may take on this side (the model thinking) while the session is kept alive
            with background ``state`` requests; past it the server's idle timeout applies. ``0``: never.

    Raises:
        EnvCrashed: No server answers at ``url``.
        EnvServerError: The server refused the session (e.g. it is at capacity).
        AgentGymError: The server serves another env id than ``env_id``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    forkable: ClassVar[bool] = False
    cheap_steps: ClassVar[bool] = False

    def __init__(self, url: str, env_id: str | None = None, *, connect_timeout_s: float = 10.0,
                 timeout_s: float = 60.0, api_key: str | None = None, keepalive_s: float = 1800.0) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise AgentGymError(f"url must be the env server's base URL such as 'http://127.0.0.1:8000', got {url!r}; "
                                "start a server with 'agentgym serve-env ENV_ID --port 8000'.")
        if connect_timeout_s <= 0 or timeout_s <= 0:
            raise AgentGymError(f"connect_timeout_s and timeout_s must be > 0, got {connect_timeout_s} and {timeout_s}.")
        if not keepalive_s >= 0:
            raise AgentGymError(f"keepalive_s must be >= 0 seconds (0: no keepalive), got {keepalive_s}.")
        from agentgym.serving import env_server

        self._wire = env_server
        self.url = url.rstrip("/")
        self.expected_env_id = env_id
        self.connect_timeout_s = float(connect_timeout_s)
        self.timeout_s = float(timeout_s)
        self._api_key = api_key if api_key is not None else (os.environ.get("AGENTGYM_API_KEY") or None)
        self._client: Any = None
        self._closed = False
        self._state_key: str | None = None
        self._last_obs: Any = None
        self._paid = 0.0
        self._turn = 0
        self._in_episode = False
        self.keepalive_s = float(keepalive_s)
        self._lock = threading.Lock()  # one request at a time on the session: the caller's or the keepalive's
        self._last_reply = time.monotonic()
        self._idle_timeout_s: float | None = None
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        state = self._connect()
        self.env_id: str = state.env_id
        if env_id is not None and env_id.split(":", 1)[-1] != self.env_id:
            self.close()
            raise AgentGymError(f"The env server at {url} serves {self.env_id!r}, not {env_id!r}; point url at a "
                                f"server started with 'agentgym serve-env {env_id}', or drop env_id.")
        self.observation_space = env_server.space_from_json(state.observation_space)
        self.action_space = UnicodeText()

    # ---- connection ------------------------------------------------------------------------------------------
    def _connect(self) -> Any:
        client = self._wire.AgentGymClient(base_url=self.url, connect_timeout_s=self.connect_timeout_s,
                                           message_timeout_s=self.timeout_s, api_key=self._api_key).sync()
        try:
            client.connect()
            state = client.state()
        except self._wire.EnvServerError:
            _close_quietly(client)
            raise
        except Exception as exc:  # noqa: BLE001 - any transport failure means "no server there"
            _close_quietly(client)
            raise EnvCrashed(f"No agentgym env server answered at {self.url} ({type(exc).__name__}: {exc}); start "
                             "one with 'agentgym serve-env ENV_ID --port PORT'.") from exc
        self._client = client
        self._idle_timeout_s = getattr(state, "idle_timeout_s", None)
        self._last_reply = time.monotonic()
        if self._idle_timeout_s and self.keepalive_s > 0 and self._keeper is None:
            self._keeper = threading.Thread(target=self._keep_alive, name="agentgym-remote-keepalive", daemon=True)
            self._keeper.start()
        return state

    def _keep_alive(self) -> None:
        """While an episode waits for its next action (for up to ``keepalive_s``), send a ``state`` request every
        third of the server's idle timeout, so time spent on this side does not expire the session."""
        while not self._stop.wait(max(0.05, float(self._idle_timeout_s or 0) / 3)):
            if not self._in_episode or time.monotonic() - self._last_reply > self.keepalive_s:
                continue
            if not self._lock.acquire(blocking=False):
                continue  # a request is under way: it keeps the session alive itself
            try:
                client = self._client
                if client is not None and self._in_episode:
                    client.state()
            except Exception:  # noqa: BLE001 - the next reset/step meets the same failure and handles it
                pass
            finally:
                self._lock.release()

    def _drop_connection(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            _close_quietly(client)

    # ---- gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        with self._lock:
            return self._reset(seed=seed, options=options)

    def _reset(self, *, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if self._closed:
            raise AgentGymError("This RemoteEnv is closed; make a new one with gym.make('agentgym/Remote-v0', url=...).")
        if self._client is None:
            self._connect()  # the last episode lost its server; try again (raises EnvCrashed if still gone)
            logger.warning("agentgym/Remote-v0: reconnected to %s (the previous session was lost)", self.url)
        payload: dict[str, Any] = {"seed": seed}
        if options is not None:
            payload["options"] = _options_to_wire(options)
        try:
            try:
                result = self._client.reset(**payload)
            except self._wire.EnvServerError as exc:
                if exc.code != self._wire.SESSION_IDLE_TIMEOUT:
                    raise
                # The server closed our idle session between episodes; a reset needs no old state: open another.
                self._drop_connection()
                self._connect()
                logger.warning("agentgym/Remote-v0: the session at %s expired (idle timeout); reconnected with a "
                               "new session for this reset", self.url)
                result = self._client.reset(**payload)
        except self._wire.EnvServerError:
            raise
        except Exception as exc:  # noqa: BLE001 - transport failure: the server is gone or hung
            self._drop_connection()
            raise EnvCrashed(f"The env server at {self.url} failed during reset ({type(exc).__name__}: {exc}).") from exc
        wire = result.observation
        self._paid = 0.0
        self._turn = 0
        self._in_episode = True
        self._last_reply = time.monotonic()
        self._state_key = wire.state_key
        self._last_obs = self._wire.observation_from_wire(wire, self.observation_space)
        return self._last_obs, dict(wire.info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        with self._lock:
            return self._step(action)

    def _step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._closed:
            raise AgentGymError("This RemoteEnv is closed; make a new one with gym.make('agentgym/Remote-v0', url=...).")
        if not self._in_episode:
            raise AgentGymError("Call reset() before step(): no episode is running (or the last one ended).")
        try:
            result = self._client.step(self._wire.action_to_wire(action))
        except self._wire.EnvServerError as exc:
            if exc.code != self._wire.SESSION_IDLE_TIMEOUT:
                raise
            self._drop_connection()  # the server released the episode's env: the episode cannot go on
            return self._error_end(exc)
        except Exception as exc:  # noqa: BLE001 - transport failure: end this episode as an infrastructure error
            self._drop_connection()
            return self._error_end(exc)
        wire = result.observation
        reward = self._wire.finite_or_zero(result.reward)
        self._paid += reward
        self._turn += 1
        self._last_reply = time.monotonic()
        self._state_key = wire.state_key
        self._last_obs = self._wire.observation_from_wire(wire, self.observation_space)
        if wire.terminated or wire.truncated:
            self._in_episode = False
        return self._last_obs, reward, bool(wire.terminated), bool(wire.truncated), dict(wire.info)

    def _error_end(self, exc: BaseException) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """The episode ends here with ``end_reason="error"``; the reward brings its return to the error score 0."""
        message = (f"Error: the env server at {self.url} stopped answering ({type(exc).__name__}: {exc}); "
                   "the episode ends.")
        reward = -self._paid
        self._in_episode = False
        self._state_key = None
        if isinstance(self._last_obs, Mapping):
            observation: Any = {**self._last_obs, "text": message}
        else:
            observation = message
        turn = {"index": self._turn, "kind": "invalid", "calls": [], "errors": [message], "tool_errors": [],
                "rewards": {"outcome": reward} if reward else {}}
        self._turn += 1
        info = {"turn": turn, "outcome": {"success": False, "score": 0.0, "end_reason": "error"}}
        return observation, reward, True, False, info

    def state_key(self) -> str | None:
        """The served env's anchor state (GiGPO), sent with every reset and step answer: no extra round trip."""
        return self._state_key

    def reference_solver(self) -> Any:
        """Not available: OpenEnv's protocol has no solver call. Play the reference solver on the same env id
        in-process with the same seed and task (the served env is deterministic, so its actions replay exactly)."""
        raise NotImplementedError("agentgym/Remote-v0 has no reference solver (OpenEnv's protocol carries reset, "
                                  "step and state only); run the solver on the same env id in-process with the same "
                                  "seed and replay its actions.")

    @property
    def turn(self) -> int:
        """Turns taken in the current episode."""
        return self._turn

    def close(self) -> None:
        """End the session (the server closes its env); idempotent, and bounded when the server is gone."""
        self._closed = True
        self._in_episode = False
        self._stop.set()
        with self._lock:
            self._drop_connection()
        super().close()


def _options_to_wire(options: Mapping[str, Any]) -> dict[str, Any]:
    """Reset options as JSON: a :class:`~agentgym.suite.Task` travels as its dict."""
    from agentgym.suite import Task
    from agentgym.trajectory import jsonable

    out = dict(options)
    if isinstance(out.get("task"), Task):
        out["task"] = out["task"].to_dict()
    return jsonable(out)


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - closing a dead connection has nothing left to release
        pass


class EnvServerProcess:
    """An ``agentgym serve-env`` child process (see :func:`launch_env_server`); a context manager that stops it.

    Attributes:
        url: The server's base URL (``http://127.0.0.1:PORT``).
        process: The ``subprocess.Popen`` of the server.
    """

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (uvicorn closes every session's env), then SIGKILL after ``timeout_s``; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return int(self.process.returncode)

    def kill(self) -> None:
        """SIGKILL, as a crashed machine would: nothing is closed gracefully."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def __enter__(self) -> EnvServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_env_server(env_id: str, *, max_sessions: int = 64, env_kwargs: Mapping[str, Any] | None = None,
                      host: str = "127.0.0.1", port: int = 0, extra_args: tuple[str, ...] = (),
                      timeout_s: float = 180.0, env: Mapping[str, str] | None = None,
                      max_sessions_per_client: int | None = None) -> EnvServerProcess:
    """Start ``agentgym serve-env`` in a child process and wait until it listens (port 0: a free one).

    Used by tests and benchmarks, and handy for local multi-process rollouts. The server's stderr goes to this
    process's stderr; its first stdout line gives the URL. The process that launches a server is its one client,
    so ``max_sessions_per_client`` defaults to ``max_sessions`` here (``agentgym serve-env``'s own default is
    half); pass an API key in ``env`` (``AGENTGYM_API_KEY``), not in ``extra_args``, where ``ps`` would show it.

    Raises:
        EnvCrashed: The server exited or did not print its URL within ``timeout_s`` (its import takes seconds:
            ``openenv-core`` imports gradio).
    """
    command = [sys.executable, "-m", "agentgym.cli", "serve-env", env_id, "--host", host, "--port", str(port),
               "--max-sessions", str(max_sessions), "--env-kwargs", json.dumps(dict(env_kwargs or {})),
               "--max-sessions-per-client", str(max_sessions if max_sessions_per_client is None
                                                else max_sessions_per_client), *extra_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=dict(env or os.environ))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline() if process.stdout else ""),
                     daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=0.2)
            break
        except queue.Empty:
            if process.poll() is not None or time.monotonic() > deadline:
                if process.poll() is None:
                    process.kill()
                process.wait()
                raise EnvCrashed(f"'agentgym serve-env {env_id}' did not start within {timeout_s} s (exit status "
                                 f"{process.returncode}); see its messages above.") from None
    marker = " on "
    if marker not in line:
        process.kill()
        process.wait()
        raise EnvCrashed(f"'agentgym serve-env {env_id}' printed {line!r} instead of its URL.")
    url = line.split(marker, 1)[1].split()[0]
    return EnvServerProcess(process, url)
