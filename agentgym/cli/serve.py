"""``python -m agentgym.serve MODEL_DIR ...``: the older spelling of ``agentgym serve``.

Both spellings run one command (the ``serve`` subcommand, :mod:`agentgym.cli.serve_model`, dispatched by
:mod:`agentgym.cli.main`), so their arguments, checks and messages cannot drift apart: ``python -m agentgym.serve
ARGS`` is ``agentgym serve ARGS``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agentgym.cli.main import main as agentgym_main

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agentgym serve`` with ``argv`` (default: this process's arguments); returns the exit status."""
    return agentgym_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
