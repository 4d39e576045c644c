"""``agentgym serve-env ENV_ID``: one env per session over HTTP/WebSocket, with OpenEnv's protocol."""

from __future__ import annotations

import argparse
import json
import os
import sys

from agentgym.cli.arguments import positive_float, positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve-env`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("serve-env", help="serve an env over HTTP/WebSocket with OpenEnv's protocol (one env per session)")
    p.add_argument("env_id", nargs="?", default=None,
                   help="an id from 'agentgym list', e.g. agentgym/Calculator-v0 (default: $AGENTGYM_ENV_ID)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 picks a free one; the URL is printed)")
    p.add_argument("--max-sessions", type=positive_int, default=64,
                   help="concurrent sessions (envs); more connections get OpenEnv's CAPACITY_REACHED error")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of gym.make keyword arguments, e.g. '{\"max_turns\": 5}'")
    p.add_argument("--idle-timeout", type=positive_float, default=None,
                   help="close sessions idle this many seconds (default: keep them while connected)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the id, port and kwargs, bind the socket, print the URL once listening, serve until interrupted."""
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the ids
    from agentgym.registration.catalogue import get_entry

    if args.env_id is None:
        args.env_id = os.environ.get("AGENTGYM_ENV_ID") or None
        if args.env_id is None:
            raise ConfigError("serve-env needs an env id: 'agentgym serve-env agentgym/Calculator-v0' (or set "
                              "AGENTGYM_ENV_ID, as the env-server images do); 'agentgym list' shows the ids.")
    if args.env_id not in gym.registry:
        get_entry(args.env_id)  # unknown id: RegistrationError with "did you mean"
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0 picks a free port), got {args.port}.")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-kwargs must be a JSON object such as '{{\"max_turns\": 5}}', got {args.env_kwargs!r} "
                          f"({exc.msg}).") from None
    if not isinstance(env_kwargs, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object (keyword arguments for gym.make), got {args.env_kwargs!r}.")
    from agentgym.serving.env_server import serve_env
    from agentgym.serving.http import bind_socket

    sock = bind_socket(args.host, args.port)

    def ready(url: str) -> None:
        sys.stdout.write(f"agentgym env server: {args.env_id} on {url} (max {args.max_sessions} sessions; "
                         f"OpenEnv clients connect to {url.replace('http', 'ws', 1)}/ws)\n")
        sys.stdout.flush()

    serve_env(args.env_id, env_kwargs=env_kwargs, max_sessions=args.max_sessions, idle_timeout_s=args.idle_timeout,
              sock=sock, on_ready=ready)
    return 0
