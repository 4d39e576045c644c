"""Run untrusted, model-written Python with real isolation.

Usage::

    from agentgym.tools.sandbox import SandboxPool

    with SandboxPool() as pool, pool.session() as py:
        py.run("x = 21")
        print(py.run("x * 2").stdout)   # "42": state persists across calls, like a notebook

Backends: bubblewrap (all namespaces unshared, caps dropped, uid 65534, read-only Python, tmpfs work dir,
pids + memory cgroup, rlimits) and Docker (``--network none``, memory/pids/CPU limits). If neither works the
pool refuses with :class:`SandboxUnavailable`; code never runs unsandboxed.

Between episodes nothing from inside is trusted: the warm parent is the sandbox's PID 1 and not dumpable (it
cannot be stopped, traced or robbed of its descriptors), an episode holds only its own session socket, and
the host itself kills the episode's processes, empties the writable dirs and checks the cgroup against its
launch baseline before reusing a sandbox (:mod:`agentgym.tools.sandbox.hostside`); any doubt recycles it.
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
