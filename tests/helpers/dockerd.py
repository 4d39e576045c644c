"""Start a private Docker daemon for tests that need containers, and stop it afterwards.

No daemon runs on these machines by default and images cannot be pulled, so the daemon gets its own data
root and leaves the host network alone (``--iptables=false --bridge=none``); containers use
``--network none`` anyway.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def docker_daemon(timeout_s: float = 90.0) -> Iterator[str]:
    """Run a fresh dockerd with ``DOCKER_HOST`` pointing at it; skips when dockerd is missing or not root."""
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("dockerd is not installed (apt-get install docker.io; `make test` installs it)")
    if os.geteuid() != 0:
        pytest.skip("starting a private dockerd needs root")
    root = tempfile.mkdtemp(prefix="agd-", dir="/tmp")  # short: unix socket paths are limited to 108 bytes
    host = f"unix://{root}/docker.sock"
    log = open(os.path.join(root, "dockerd.log"), "wb")  # noqa: SIM115
    process = subprocess.Popen(
        ["dockerd", "--data-root", f"{root}/data", "--exec-root", f"{root}/exec", "-H", host,
         "--pidfile", f"{root}/dockerd.pid", "--iptables=false", "--ip6tables=false", "--bridge=none"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while subprocess.run(["docker", "-H", host, "version"], capture_output=True).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = open(os.path.join(root, "dockerd.log"), errors="replace").read()[-2000:]
                pytest.fail(f"dockerd did not start: {tail}")
            time.sleep(0.5)
        old_host = os.environ.get("DOCKER_HOST")
        os.environ["DOCKER_HOST"] = host
        try:
            yield host
        finally:
            if old_host is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = old_host
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
        log.close()
        subprocess.run(["umount", "-R", f"{root}/data"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def docker_host_with_pool_cleanup() -> Iterator[str]:
    """A private dockerd whose sandbox containers (agentgym's default Docker pools) go before the daemon does."""
    with docker_daemon() as host:
        try:
            yield host
        finally:
            from agentgym.tools.sandbox import pool as sandbox_pool

            for config, p in list(sandbox_pool._DEFAULT_POOLS.items()):
                if config.backend == "docker":
                    p.close()
