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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted: the model server, or with ``--proxy`` the recording gateway."""
    if args.proxy is not None:
        if args.record is None or args.model_dir is not None:
            raise ConfigError("--proxy URL records another server's sessions: give --record DIR and no MODEL_DIR.")
        from agentgym.serving.gateway import run_gateway

        run_gateway(args.proxy, args.record, host=args.host, port=args.port, tokenizer=args.tokenizer)
        return 0
    if args.model_dir is None:
        raise ConfigError("agentgym serve needs a MODEL_DIR (or --proxy URL --record DIR to record another server).")
    from agentgym.serving.openai_server import run_server

    run_server(args.model_dir, host=args.host, port=args.port, model_name=args.model_name,
               max_batch_size=args.max_batch_size, record_dir=args.record)
    return 0
