"""Docker images of Harbor tasks: each ``environment/`` is built once per content hash (:func:`build_environment_image`),
or a task's prebuilt ``[environment] docker_image`` is used. A base or prebuilt image that is not in the local image
store is pulled; where that fails (no registry reachable) the error says how to provide it (``docker load -i``, or
``docker tag`` of a local image under the name the Dockerfile uses).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from agentgym.errors import EnvCrashed, TaskError

from agentgym.envs.swe.harbor_tasks import HarborTask

__all__ = ["base_images", "build_environment_image", "ensure_image", "image_config", "python_reachable_image",
           "require_docker_network", "resolve_user", "run_docker"]

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


def require_docker_network(name: str) -> None:
    """Fail with what to do when the Docker daemon has no network ``name`` (a container asked to join a missing
    network fails only at ``docker run``, with a message that does not say why the task wanted it)."""
    probe = run_docker("network", "inspect", "--format", "{{.Driver}}", name, timeout=60)
    if probe.returncode != 0:
        raise TaskError(f"The Docker daemon has no network {name!r}, which internet_network names for tasks that ask "
                        f"for internet access (a daemon started with --bridge=none has no 'bridge'). Create one "
                        f"(docker network create {name}) or name an existing one (docker network ls).")


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


def ensure_image(image: str, task: HarborTask, what: str) -> None:
    """Make ``image`` local: present already, or pulled; a failed pull is a :class:`TaskError` naming the fixes."""
    if run_docker("image", "inspect", image, timeout=60).returncode == 0:
        return
    logger.info("Harbor: pulling %s", image)
    pulled = run_docker("pull", "-q", image, timeout=max(task.build_timeout_s, 60.0))
    if pulled.returncode == 0:
        return
    reason = pulled.stderr.decode(errors="replace").strip().splitlines()
    raise TaskError(
        f"Harbor task {task.name!r}: {image} ({what}) is not in the local Docker image store and could not be pulled "
        f"({(reason or ['no reason given'])[-1][:300]}). Provide it locally, then run again: `docker load -i "
        f"image.tar` (an image saved elsewhere with `docker save {image} -o image.tar`), or `docker tag LOCAL_IMAGE "
        f"{image}` to stand a local image in for it (a mirror: `docker pull MIRROR/{image} && docker tag "
        f"MIRROR/{image} {image}`).")


def build_environment_image(task: HarborTask) -> str:
    """The task's image: its prebuilt ``docker_image``, or ``environment/`` built once per content (tagged by hash).

    ``FROM`` images are pulled when missing (:func:`ensure_image`). The repository's own base,
    ``agentgym-sandbox:2``, is created on demand (:func:`agentgym.tools.sandbox.ensure_docker_image`).
    """
    from agentgym.tasks.swe.images import BASE_IMAGE
    from agentgym.tools.sandbox import ensure_docker_image

    if task.docker_image is not None:
        ensure_image(task.docker_image, task, "[environment] docker_image")
        return task.docker_image
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    image = f"agentgym-harbor-{slug[:60]}:{_context_digest(task.environment)}"
    if run_docker("image", "inspect", image, timeout=60).returncode == 0:
        return image
    for base in base_images((task.environment / "Dockerfile").read_text(encoding="utf-8")):
        if base == BASE_IMAGE:
            ensure_docker_image(BASE_IMAGE)
        elif "$" not in base:
            ensure_image(base, task, "FROM in environment/Dockerfile")
    logger.info("Harbor: building %s from %s", image, task.environment)
    result = run_docker("build", "-q", "-t", image, str(task.environment), timeout=task.build_timeout_s)
    if result.returncode != 0:
        raise TaskError(f"Harbor task {task.name!r}: docker build of environment/ failed: "
                        f"{result.stderr.decode(errors='replace').strip()[-800:]}")
    return image


def _passwd_entry(table: str, name: str) -> tuple[int, int] | None:
    for line in table.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
            return int(fields[2]), int(fields[3])
    return None


def resolve_user(image: str, user: str | None, task_name: str) -> str:
    """``uid:gid`` for a task's ``user`` (a name, a uid, or ``user:group``) as the image's ``/etc/passwd`` and
    ``/etc/group`` define it; None means root, which is what Harbor's containers run as by default."""
    if user is None:
        return "0:0"
    name, _, group = user.partition(":")
    if name.isdigit() and (not group or group.isdigit()):
        return f"{name}:{group or name}"
    created = run_docker("create", image, "/nonexistent", timeout=120)
    if created.returncode != 0:
        raise EnvCrashed(f"cannot read users of {image}: {created.stderr.decode(errors='replace').strip()[-300:]}")
    container = created.stdout.decode().strip()
    tables = {}
    try:
        for table in ("passwd", "group"):
            copied = run_docker("cp", f"{container}:/etc/{table}", "-", timeout=60)
            if copied.returncode == 0:
                with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
                    member = tar.extractfile(table)
                    tables[table] = member.read().decode(errors="replace") if member else ""
    finally:
        run_docker("rm", "-f", container, timeout=60)
    entry = (int(name), int(name)) if name.isdigit() else _passwd_entry(tables.get("passwd", ""), name)
    if entry is None:
        raise TaskError(f"Harbor task {task_name!r}: user {name!r} is not in {image}'s /etc/passwd; create it in "
                        "environment/Dockerfile (RUN useradd -m NAME) or name an existing user.")
    uid, gid = entry
    if group:
        found = int(group) if group.isdigit() else None
        if found is None:
            for line in tables.get("group", "").splitlines():
                fields = line.split(":")
                if len(fields) >= 3 and fields[0] == group and fields[2].isdigit():
                    found = int(fields[2])
            if found is None:
                raise TaskError(f"Harbor task {task_name!r}: group {group!r} is not in {image}'s /etc/group.")
        gid = found
    return f"{uid}:{gid}"


def image_config(image: str) -> dict[str, Any]:
    """The ``Config`` block of a local image (working directory, environment, entry point)."""
    result = run_docker("image", "inspect", "--format", "{{json .Config}}", image, timeout=60)
    if result.returncode != 0:
        raise EnvCrashed(f"cannot inspect {image}: {result.stderr.decode(errors='replace').strip()[-300:]}")
    return json.loads(result.stdout) or {}


def python_reachable_image(image: str) -> str:
    """``image``, or a copy of it in which a non-root user can reach the host's Python.

    Every sandbox runs the host's Python, mounted at its host path; when that path lies under a folder the image
    keeps private (``/root`` is 0700 in ubuntu images, and a pyenv or uv Python often lives there), a task's
    non-root ``user`` could not start it. The copy differs from ``image`` only by ``o+x`` (search, not read) on
    those folders; it is made once per image with the host's ``chmod`` and ``docker commit``. If the image cannot
    run that (no loader for it), ``image`` itself is returned.
    """
    from pathlib import PurePosixPath

    from agentgym.tools.sandbox.backends import python_roots

    folders = sorted({str(parent) for root in python_roots() for parent in PurePosixPath(root).parents
                      if str(parent) not in ("/", "/usr") and not str(parent).startswith("/usr/")})
    if not folders:
        return image
    inspected = run_docker("image", "inspect", "--format", "{{.Id}}", image, timeout=60)
    if inspected.returncode != 0:
        raise EnvCrashed(f"cannot inspect {image}: {inspected.stderr.decode(errors='replace').strip()[-300:]}")
    key = hashlib.sha256((inspected.stdout.decode().strip() + "\0" + "\0".join(folders)).encode()).hexdigest()[:16]
    derived = f"agentgym-harbor-reach:{key}"
    if run_docker("image", "inspect", derived, timeout=60).returncode == 0:
        return derived
    name = f"agentgym-harbor-reach-{key}"
    run_docker("rm", "-f", name, timeout=60)
    ran = run_docker("run", "--name", name, "-u", "0:0", "--network", "none", "-v", "/usr:/usr:ro",
                     "--entrypoint", "/usr/bin/chmod", image, "-f", "o+x", *folders, timeout=120)
    try:
        if ran.returncode in (125, 126, 127):  # the container could not start or run chmod: keep the image
            logger.warning("Harbor: could not open %s for non-root users of %s: %s", folders, image,
                           ran.stderr.decode(errors="replace").strip()[-200:])
            return image
        # The run replaced ENTRYPOINT and CMD: put the image's own back. An empty ENTRYPOINT cannot be committed
        # (docker keeps the run's), so an image without one gets /usr/bin/env, which just runs its arguments.
        config = image_config(image)
        changes = [f"ENTRYPOINT {json.dumps(config.get('Entrypoint') or ['/usr/bin/env'])}",
                   f"CMD {json.dumps(config.get('Cmd') or ['/bin/sh'])}"]
        committed = run_docker("commit", *(a for c in changes for a in ("--change", c)), name, derived, timeout=300)
        if committed.returncode != 0:
            raise EnvCrashed(f"docker commit failed: {committed.stderr.decode(errors='replace').strip()[-300:]}")
    finally:
        run_docker("rm", "-f", name, timeout=60)
    return derived
