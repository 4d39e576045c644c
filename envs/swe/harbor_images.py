"""Docker images of Harbor tasks, built locally and never pulled: every ``FROM`` image must already be in the local
image store; each ``environment/`` is built once per content hash (:func:`build_environment_image`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from agentgym.errors import EnvCrashed, TaskError

from agentgym.envs.swe.harbor_tasks import HarborTask

__all__ = ["base_images", "build_environment_image", "image_config", "run_docker"]

logger = logging.getLogger(__name__)


def run_docker(*args: str, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``docker ARGS`` with the sandbox backend's minimal environment (the classic builder, which needs no
    BuildKit daemon); a missing CLI or a timeout is an :class:`EnvCrashed` that says which."""
    from agentgym.tools.sandbox.backends import DOCKER_ENV, minimal_env

    try:
        return subprocess.run(["docker", *args], capture_output=True, input=stdin, timeout=timeout, check=False,
                              env={**minimal_env(*DOCKER_ENV), "DOCKER_BUILDKIT": "0"})
    except FileNotFoundError as exc:
        raise EnvCrashed("the docker CLI is not installed (apt-get install docker.io)") from exc
    except subprocess.TimeoutExpired as exc:
        raise EnvCrashed(f"docker {args[0]} took longer than {timeout:g} s") from exc


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds ``FROM`` (stage names and ``scratch`` left out)."""
    stages: set[str] = set()
    found: list[str] = []
    text = re.sub(r"\\\n", " ", dockerfile)
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        words = [w for w in words[1:] if not w.startswith("--")]
        if not words:
            continue
        image = words[0]
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if image.lower() not in stages and image != "scratch" and image not in found:
            found.append(image)
    return found


def _context_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            digest.update(f"F {rel} {oct(path.stat().st_mode & 0o777)}\n".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def build_environment_image(task: HarborTask) -> str:
    """``docker build`` the task's ``environment/`` once per content (tagged by its hash); returns the image.

    Nothing is pulled: each ``FROM`` image must be local. The repository's own base, ``agentgym-sandbox:2``, is
    created on demand (:func:`agentgym.tools.sandbox.ensure_docker_image`).
    """
    from agentgym.tasks.swe.images import BASE_IMAGE
    from agentgym.tools.sandbox import ensure_docker_image

    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    image = f"agentgym-harbor-{slug[:60]}:{_context_digest(task.environment)}"
    if run_docker("image", "inspect", image, timeout=60).returncode == 0:
        return image
    for base in base_images((task.environment / "Dockerfile").read_text(encoding="utf-8")):
        if base == BASE_IMAGE:
            ensure_docker_image(BASE_IMAGE)
        elif "$" not in base and run_docker("image", "inspect", base, timeout=60).returncode != 0:
            raise TaskError(
                f"Harbor task {task.name!r}: environment/Dockerfile builds FROM {base}, which is not in the local "
                f"Docker image store, and images cannot be pulled here (no network). Load it first (docker load -i "
                f"image.tar, or build it locally), or start the Dockerfile FROM {BASE_IMAGE}, which agentgym builds "
                "itself (the host's /usr and Python are mounted at run time, so use COPY/ENV/WORKDIR, not RUN).")
    logger.info("Harbor: building %s from %s", image, task.environment)
    result = run_docker("build", "-q", "-t", image, str(task.environment), timeout=task.build_timeout_s)
    if result.returncode != 0:
        raise TaskError(f"Harbor task {task.name!r}: docker build of environment/ failed: "
                        f"{result.stderr.decode(errors='replace').strip()[-800:]}")
    return image


def image_config(image: str) -> dict[str, Any]:
    """The ``Config`` block of a local image (working directory, environment, entry point)."""
    result = run_docker("image", "inspect", "--format", "{{json .Config}}", image, timeout=60)
    if result.returncode != 0:
        raise EnvCrashed(f"cannot inspect {image}: {result.stderr.decode(errors='replace').strip()[-300:]}")
    return json.loads(result.stdout) or {}
