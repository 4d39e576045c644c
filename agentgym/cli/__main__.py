"""``python -m agentgym.cli``: the same program as the ``agentgym`` command."""

import sys

from agentgym.cli.main import main

sys.exit(main())
