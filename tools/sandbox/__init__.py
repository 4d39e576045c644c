"""Run untrusted, model-written Python with real isolation.

Usage::

    from agentgym.tools.sandbox import SandboxPool

    with SandboxPool() as pool, pool.session() as py:
        py.run("x = 21")
        print(py.run("x * 2").stdout)   # "42": state persists across calls, like a notebook

Backends: bubblewrap (all namespaces unshared, caps dropped, uid 65534, read-only Python, tmpfs work dir,
pids + memory cgroup, rlimits) and Docker (``--network none``, memory/pids/CPU limits). If neither works the
pool refuses with :class:`SandboxUnavailable`; code never runs unsandboxed.
"""

from agentgym.tools.sandbox.backends import SandboxUnavailable, ensure_docker_image
from agentgym.tools.sandbox.config import SandboxConfig, SandboxLimits
from agentgym.tools.sandbox.pool import (
           ExecutionResult,
           SandboxError,
           SandboxPool,
           SandboxSession,
           default_pool,
)

__all__ = ["ExecutionResult", "SandboxConfig", "SandboxError", "SandboxLimits", "SandboxPool", "SandboxSession",
           "SandboxUnavailable", "default_pool", "ensure_docker_image"]
