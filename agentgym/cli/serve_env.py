"""``agentgym serve-env ENV_ID``: one env per session over HTTP/WebSocket, with OpenEnv's protocol.

The defaults keep one client from holding the server: sessions idle for 600 s are closed, and one remote address
holds at most half of ``--max-sessions``. ``--api-key`` (or ``$AGENTGYM_API_KEY``) makes every route but
``/health`` require the key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from agentgym.cli.arguments import non_negative_float, positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve-env`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("serve-env", help="serve an env over HTTP/WebSocket with OpenEnv's protocol (one env per session)")
    p.add_argument("env_id", nargs="?", default=None,
                   help="an id from 'agentgym list', e.g. agentgym/Calculator-v0, or an env id a suite YAML "
                        "registers (default: $AGENTGYM_ENV_ID)")
    p.add_argument("--suite", default=None, metavar="SUITE",
                   help="load this suite (name or .yaml) first: registers an env its YAML defines (entry_point)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 picks a free one; the URL is printed)")
    p.add_argument("--max-sessions", type=positive_int, default=64,
                   help="concurrent sessions (envs); more connections get OpenEnv's CAPACITY_REACHED error")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of gym.make keyword arguments, e.g. '{\"max_turns\": 5}'")
    p.add_argument("--max-sessions-per-client", type=positive_int, default=None,
                   help="sessions one remote address may hold at a time (default: half of --max-sessions, so one "
                        "client never fills the server; raise it when one trainer is the only client)")
    p.add_argument("--idle-timeout", type=non_negative_float, default=600.0,
                   help="close a session (and release its env) after this many seconds without a message from "
                        "its client after a reply; any message, e.g. a state request, restarts the wait "
                        "(agentgym/Remote-v0 sends one while its model thinks) (default 600; 0 keeps sessions "
                        "while connected)")
    p.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer KEY) on every route but /health "
                        "(default: $AGENTGYM_API_KEY; unset: open)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the id, port and kwargs, bind the socket, print the URL once listening, serve until interrupted."""
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the ids

    if args.env_id is None:
        args.env_id = os.environ.get("AGENTGYM_ENV_ID") or None
        if args.env_id is None:
            raise ConfigError("serve-env needs an env id: 'agentgym serve-env agentgym/Calculator-v0' (or set "
                              "AGENTGYM_ENV_ID, as the env-server images do); 'agentgym list' shows the ids.")
    if args.env_id not in gym.registry or args.suite is not None:
        from agentgym.cli.env_lookup import register_env_id

        # An id a suite YAML registers (found among the shipped and plugin suites, or --suite); unknown ids get a
        # ConfigError with "did you mean".
        register_env_id(args.env_id, getattr(args, "suite", None))
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0 picks a free port), got {args.port}.")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-kwargs must be a JSON object such as '{{\"max_turns\": 5}}', got {args.env_kwargs!r} "
                          f"({exc.msg}).") from None
    if not isinstance(env_kwargs, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object (keyword arguments for gym.make), got {args.env_kwargs!r}.")
    if args.max_sessions_per_client is not None and args.max_sessions_per_client > args.max_sessions:
        raise ConfigError(f"--max-sessions-per-client ({args.max_sessions_per_client}) cannot exceed --max-sessions "
                          f"({args.max_sessions}).")
    from agentgym.serving.auth import resolve_api_key
    from agentgym.serving.env_server import serve_env
    from agentgym.serving.http import bind_socket

    api_key = resolve_api_key(args.api_key)
    per_client = args.max_sessions_per_client or max(1, args.max_sessions // 2)

    sock = bind_socket(args.host, args.port)

    def ready(url: str) -> None:
        idle = f"idle timeout {args.idle_timeout:g} s" if args.idle_timeout else "no idle timeout"
        sys.stdout.write(f"agentgym env server: {args.env_id} on {url} (max {args.max_sessions} sessions, "
                         f"{per_client} per client, {idle}{', API key required' if api_key else ''}; "
                         f"OpenEnv clients connect to {url.replace('http', 'ws', 1)}/ws)\n")
        sys.stdout.flush()

    serve_env(args.env_id, env_kwargs=env_kwargs, max_sessions=args.max_sessions,
              idle_timeout_s=args.idle_timeout or None, max_sessions_per_client=per_client, api_key=api_key,
              sock=sock, on_ready=ready)
    return 0
