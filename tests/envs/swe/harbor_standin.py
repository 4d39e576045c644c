"""A local stand-in for ``ubuntu:24.04`` (images cannot be pulled on the test machines).

Built the way the sandbox builds its own base (:func:`agentgym.tools.sandbox.backends.ensure_docker_image`): a root
filesystem written as a tar and ``docker import``-ed, with no registry involved. Unlike that empty root it carries
bash, a POSIX shell and the coreutils a Dockerfile's ``RUN`` lines and a task's scripts use, copied from the host
with the shared libraries ``ldd`` lists, so Harbor's template Dockerfile (``FROM ubuntu:24.04``, ``WORKDIR``,
``RUN``) builds unchanged. At run time the sandbox mounts the host's ``/usr`` over it, as for every image.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile

PROGRAMS = ("bash", "sh", "cat", "echo", "mkdir", "chmod", "chown", "ls", "cp", "mv", "rm", "tr", "sleep", "id",
            "touch", "env", "printf", "grep", "sed", "head", "tail", "diff", "kill", "true", "false", "test", "wc",
            "mktemp", "ln", "dirname", "basename", "tee", "sort", "cut", "expr")


def _image_path(path: str) -> str:
    """Where ``path`` lands in an image whose /bin, /lib, /lib64 and /sbin are links into /usr (merged /usr)."""
    for top in ("bin", "lib", "lib64", "sbin"):
        if path.startswith(f"/{top}/"):
            return f"usr/{top}/" + path[len(top) + 2:]
    return path.lstrip("/")


def standin_tar() -> bytes:
    files: dict[str, str] = {}  # image path -> host file
    for name in PROGRAMS:
        found = shutil.which(name, path="/usr/bin:/bin")
        if found is None:
            continue
        files[f"usr/bin/{name}"] = os.path.realpath(found)
        listing = subprocess.run(["ldd", found], capture_output=True, text=True, check=False).stdout
        for lib in re.findall(r"(/\S+\.so[^\s]*)", listing):
            files[_image_path(lib)] = os.path.realpath(lib)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        made: set[str] = set()

        def folder(path: str, mode: int = 0o755) -> None:
            if path and path not in made:
                folder(os.path.dirname(path))
                info = tarfile.TarInfo(path)
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
                made.add(path)

        for directory, mode in (("tmp", 0o1777), ("root", 0o700), ("etc", 0o755), ("usr/bin", 0o755),
                                ("usr/lib", 0o755), ("usr/lib64", 0o755), ("usr/sbin", 0o755)):
            folder(directory, mode)
        for link in ("bin", "lib", "lib64", "sbin"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
            tar.addfile(info)
        for target, source in sorted(files.items()):
            folder(os.path.dirname(target))
            info = tar.gettarinfo(source, arcname=target)
            with open(source, "rb") as fh:
                tar.addfile(info, fh)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/bin/sh\n"),
                           ("etc/group", "root:x:0:\nnogroup:x:65534:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def load_standin(tag: str = "ubuntu:24.04") -> None:
    """``docker import`` the stand-in under ``tag`` (the name a Dockerfile's FROM uses)."""
    done = subprocess.run(["docker", "import", "-c", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "-c", 'CMD ["/bin/bash"]', "-", tag], input=standin_tar(), capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
