"""Docker images for SWE episodes: the sandbox base image plus one image per pinned library.

Images cannot be pulled on these machines, so everything is built locally. The base image
(``agentgym-sandbox:2``) is an empty root with /usr symlinks made by ``docker import`` (see
:func:`agentgym.tools.sandbox.ensure_docker_image`); the host's Python and pytest are mounted read-only at
run time, exactly as with bubblewrap. Each library image adds the pristine source tree at
``/opt/agentgym/repo``. Equivalent shell commands::

    # base: see agentgym.tools.sandbox.backends.ensure_docker_image
    printf 'FROM agentgym-sandbox:2\\nCOPY . /opt/agentgym/repo\\n' > ~/.cache/agentgym/swe/v1/src/toolz-1.2.0/Dockerfile
    docker build -t agentgym-swe-toolz:1.2.0-2 ~/.cache/agentgym/swe/v1/src/toolz-1.2.0
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from agentgym.tasks.swe.libraries import fetch_library, get_library
from agentgym.tasks.swe.workspace import PRISTINE

__all__ = ["ensure_library_image", "library_image"]

BASE_IMAGE = "agentgym-sandbox:2"


def library_image(name: str) -> str:
    lib = get_library(name)
    return f"agentgym-swe-{lib.name}:{lib.version}-{BASE_IMAGE.split(':')[1]}"  # rebuilt when the base changes


def ensure_library_image(name: str) -> str:
    """Build ``agentgym-swe-NAME:VERSION-BASE`` if it is missing; returns the image name."""
    from agentgym.tools.sandbox import SandboxUnavailable, ensure_docker_image

    image = library_image(name)
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False).returncode == 0:
        return image
    ensure_docker_image(BASE_IMAGE)
    tree = fetch_library(name)
    with tempfile.TemporaryDirectory(prefix="agentgym-image-") as ctx:
        shutil.copytree(tree, Path(ctx) / "repo", symlinks=True)
        (Path(ctx) / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY repo {PRISTINE}\n")
        result = subprocess.run(["docker", "build", "-q", "-t", image, ctx], capture_output=True, text=True,
                                check=False, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    if result.returncode != 0:
        raise SandboxUnavailable(f"could not build {image}: {result.stderr.strip()[-500:]}")
    return image

