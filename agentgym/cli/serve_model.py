"""``agentgym serve MODEL_DIR``: a local HF model as an OpenAI-compatible API, or a recording gateway.

With ``--proxy URL --record DIR`` it serves no model: it records the sessions of another OpenAI-compatible server
(e.g. ``vllm serve``). :mod:`agentgym.cli.serve` runs this command as ``python -m agentgym.serve``.
"""

from __future__ import annotations

import argparse

from agentgym.cli.arguments import positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("serve", help="serve a local HF model directory as an OpenAI-compatible API")
    p.add_argument("model_dir", nargs="?", default=None)
    p.add_argument("--record", default=None, metavar="DIR",
                   help="record every session's token-exact calls here (the recording gateway, agentgym.serving.gateway)")
    p.add_argument("--proxy", default=None, metavar="URL",
                   help="with --record: record the sessions of another OpenAI-compatible server (e.g. vllm serve)")
    p.add_argument("--tokenizer", default=None, help="with --proxy: tokenizer for servers that return no token ids")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=positive_int, default=8000)
    p.add_argument("--model-name", default=None, help="name clients use (default: the directory name)")
    p.add_argument("--max-batch-size", type=positive_int, default=32)
    _add_safety_arguments(p)
    p.set_defaults(func=run)


def _add_safety_arguments(p: argparse.ArgumentParser) -> None:
    """Who may use the model server and how much one request may ask of it (agentgym.serving.limits)."""
    from agentgym.serving.auth import API_KEY_ENV
    from agentgym.serving.limits import RequestLimits

    d = RequestLimits()
    g = p.add_argument_group("access and per-request limits (a bigger request is refused, the server stays up)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require this key (Authorization: Bearer KEY or x-api-key) on every route but /health; "
                        f"default: ${API_KEY_ENV}, else no key")
    g.add_argument("--max-body-bytes", type=positive_int, default=d.max_body_bytes, metavar="BYTES",
                   help=f"largest request body; bigger ones get 413 unread (default {d.max_body_bytes})")
    g.add_argument("--max-prompt-chars", type=positive_int, default=d.max_prompt_chars, metavar="CHARS",
                   help=f"most prompt characters per request, checked before tokenising (default {d.max_prompt_chars})")
    g.add_argument("--max-n", type=positive_int, default=d.max_n, metavar="N",
                   help=f"most choices (n) per request (default {d.max_n})")
    g.add_argument("--max-request-tokens", type=positive_int, default=d.max_request_tokens, metavar="TOKENS",
                   help=f"most tokens one request may make the model process, n * (prompt + max_tokens) "
                        f"(default {d.max_request_tokens})")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted: the model server, or with ``--proxy`` the recording gateway."""
    if args.proxy is not None:
        if args.record is None or args.model_dir is not None:
            raise ConfigError("--proxy URL records another server's sessions: give --record DIR and no MODEL_DIR.")
        from agentgym.serving.gateway import run_gateway

        run_gateway(args.proxy, args.record, host=args.host, port=args.port, tokenizer=args.tokenizer,
                    api_key=args.api_key, max_body_bytes=args.max_body_bytes)
        return 0
    if args.model_dir is None:
        raise ConfigError("agentgym serve needs a MODEL_DIR (or --proxy URL --record DIR to record another server).")
    from agentgym.serving.auth import resolve_api_key
    from agentgym.serving.limits import RequestLimits
    from agentgym.serving.openai_server import run_server

    _choose_cpu_threads()
    limits = RequestLimits(max_body_bytes=args.max_body_bytes, max_prompt_chars=args.max_prompt_chars,
                           max_n=args.max_n, max_request_tokens=args.max_request_tokens)
    run_server(args.model_dir, host=args.host, port=args.port, model_name=args.model_name,
               max_batch_size=args.max_batch_size, record_dir=args.record, limits=limits,
               api_key=resolve_api_key(args.api_key), announce=_announce)
    return 0


def _choose_cpu_threads() -> None:
    """On a CPU, set torch's thread count so that the server's decoding does not fight the machine's other work
    (:mod:`agentgym.utils.cpu_threads`), and say what was chosen."""
    import torch

    if torch.cuda.is_available():
        return
    from agentgym.utils.cpu_threads import apply_cpu_threads

    _announce(f"CPU: {apply_cpu_threads().reason}")


def _announce(line: str) -> None:
    """Progress while the model loads and the banner once it serves, on stderr (stdout stays free for pipes);
    paths and prompts come from files, so control characters are shown escaped."""
    import sys

    from agentgym.utils.terminal import terminal_safe

    sys.stderr.write(terminal_safe(line + "\n"))
    sys.stderr.flush()
