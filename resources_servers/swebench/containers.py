"""swebench's Docker backend: grading runs in a fresh container, on Docker or Podman (any Docker Engine API).

`ContainerRunner.run` has `SandboxClient.run`'s signature and answers the same `RunResult`, so `/verify` grades
through one code path whichever backend runs it (`grading.py`'s script, runner, nonce and scoring).

- The per-task image: `base_image` (python3 and git in it) with the task's repository snapshot at
  `/workspace/repo` (the same archive the bubblewrap backend unpacks), committed once as
  `localhost/gymfleet-swebench:<hash of base image and snapshot>`, reused by every grading of the task in this
  server process and removed when it shuts down.
- Each grading: a fresh container from that image, no network, `nano_cpus` of one CPU, memory without swap
  (`memory_mb`), a pids limit, every capability dropped, no new privileges. The grading files go in with
  `put_archive` before it starts; stdin is a file the container's first command opens and deletes, then execs the
  script, so the runner's nonce travels as it does in the sandbox. Past `timeout_s` the container is killed
  (`timeout`); a kernel OOM kill is `oom`, and so is any SIGKILL of the script (Podman on cgroup v1 does not
  report OOMKilled, and nothing but the memory limit sends one). The container is removed in every case
  (`podman ps -a` stays empty).
- The engine: `docker_host`, else `DOCKER_HOST`, else Docker's socket, else rootful Podman's
  (`/run/podman/podman.sock`, which `scripts/install_container_engine.sh` starts). Engine failures raise
  `SandboxError`: the rollout is a failure row, never a 0.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import logging
import os
import tarfile
import time
from typing import Any

from gymfleet.errors import ConfigError, SandboxError
from gymfleet.grading.sandbox_client import RunResult

log = logging.getLogger(__name__)

PODMAN_SOCKET = "/run/podman/podman.sock"
DOCKER_SOCKET = "/var/run/docker.sock"
TASK_IMAGE = "localhost/gymfleet-swebench"
LABEL = "gymfleet.swebench"
"""Every container this backend creates carries it (`docker ps -a --filter label=gymfleet.swebench`)."""
WORKSPACE = "/workspace"
STDIN_FILE = "grading/.stdin"
MAX_OUTPUT_BYTES = 1_000_000
PIDS_LIMIT = 512


def docker_host(configured: str | None = None) -> str | None:
    """The engine's address: `configured`, `DOCKER_HOST`, Docker's socket, Podman's, or None (none found)."""
    if configured:
        return configured
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    for socket in (DOCKER_SOCKET, PODMAN_SOCKET):
        if os.path.exists(socket):
            return f"unix://{socket}"
    return None


def docker_sdk() -> Any:
    """The Docker SDK (the `docker` extra).

    Where it is not installed, `import docker` from the repository root does not fail: the root's own `docker/` folder
    (a Dockerfile and fleet configs) imports as an empty namespace package. So the SDK is told by a name only it has.

    Raises:
        ConfigError: no Docker SDK here, with the install command.
    """
    try:
        import docker
    except ImportError:
        docker = None
    if not callable(getattr(docker, "DockerClient", None)):
        raise ConfigError("swebench backend: docker needs the Docker SDK (the docker package), which is not installed",
                          hint="pip install -e '.[docker]' (or pip install 'docker>=7.0'), or use backend: bwrap.")
    return docker


def connect(configured: str | None = None, *, timeout_s: float = 60.0):
    """A `docker.DockerClient` for the engine that answered a ping.

    Raises:
        ConfigError: the `docker` package is missing, or no engine answers.
    """
    docker = docker_sdk()
    address = docker_host(configured)
    if address is None:
        raise ConfigError("swebench backend: docker, but no Docker engine was found (DOCKER_HOST is unset and "
                          f"neither {DOCKER_SOCKET} nor {PODMAN_SOCKET} exists).",
                          hint="Start Docker, or Podman's API service (scripts/install_container_engine.sh does, "
                               "on Debian), or set DOCKER_HOST; or use backend: bwrap.")
    try:
        client = docker.DockerClient(base_url=address, timeout=int(timeout_s))
        client.ping()
    except docker.errors.DockerException as exc:
        raise ConfigError(f"swebench backend: docker, but the engine at {address} does not answer: {exc}",
                          hint="Start it (or point DOCKER_HOST at one that runs), or use backend: bwrap.") from exc
    return client


def workspace_tar(archive: bytes, files: dict[str, str] | None = None, *, root: str = "workspace/") -> bytes:
    """An uncompressed tar of `archive` (a gzipped or plain tar, as the sandbox takes) and `files`, every entry under
    `root`, for `put_archive` at `/`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as target:
        folder = tarfile.TarInfo(root.rstrip("/"))
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        target.addfile(folder)
        if archive:
            data = gzip.decompress(archive) if archive[:2] == b"\x1f\x8b" else archive
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as source:
                for member in source:
                    name = member.name.lstrip("./")
                    if not name:
                        continue
                    member.name = root + name
                    if member.islnk():
                        member.linkname = root + member.linkname.lstrip("./")
                    target.addfile(member, source.extractfile(member) if member.isfile() else None)
        for name, text in sorted((files or {}).items()):
            data = text.encode()
            info = tarfile.TarInfo(root + name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            target.addfile(info, io.BytesIO(data))
    return out.getvalue()


class ContainerRunner:
    """Runs grading scripts in fresh containers (see the module docstring); `run` is `SandboxClient.run`'s twin."""

    def __init__(self, base_image: str, *, host: str | None = None, concurrency: int = 4,
                 pids_limit: int = PIDS_LIMIT):
        self.base_image = base_image
        self.host = host
        self.pids_limit = pids_limit
        self._client: Any = None
        self._images: dict[str, str] = {}
        self._image_locks: dict[str, asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(concurrency)

    def start(self) -> None:
        """Connect and check the base image.

        Raises:
            ConfigError: no Docker SDK, no engine, or no base image on it.
        """
        docker = docker_sdk()
        self._client = connect(self.host)
        try:
            self._client.images.get(self.base_image)
        except docker.errors.ImageNotFound:
            raise ConfigError(f"swebench backend: docker, but the engine has no image {self.base_image} "
                              "(base_image: any image with python3 and git).",
                              hint=f"`docker pull {self.base_image}`, or scripts/install_container_engine.sh "
                                   "(builds localhost/gymfleet-base:bookworm on Debian with Podman), or set "
                                   "base_image.") from None

    def close(self) -> None:
        """Remove the task images this runner built (a snapshot's archive differs between processes, so another
        process would not reuse them) and disconnect."""
        import docker

        if self._client is None:
            return
        for tag in self._images.values():
            try:
                self._client.images.remove(tag, force=True)
            except docker.errors.DockerException as exc:
                log.warning("could not remove the task image %s: %s", tag, exc)
        self._images.clear()
        self._client.close()

    def has_image(self, image: str) -> bool:
        """Whether the engine holds `image` (no pull)."""
        import docker

        try:
            self._client.images.get(image)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the container engine failed looking up {image}: {exc}") from exc
        return True

    async def task_image(self, archive: bytes) -> str:
        """The per-task image holding `archive` under /workspace, built once (see the module docstring)."""
        key = hashlib.sha256(self.base_image.encode() + b"\0" + archive).hexdigest()[:24]
        if key in self._images:
            return self._images[key]
        async with self._image_locks.setdefault(key, asyncio.Lock()):
            if key not in self._images:
                self._images[key] = await asyncio.to_thread(self._build_image, key, archive)
        return self._images[key]

    def _build_image(self, key: str, archive: bytes) -> str:
        import docker

        tag = f"{TASK_IMAGE}:{key}"
        if self.has_image(tag):
            return tag
        started = time.perf_counter()
        container = None
        try:
            container = self._client.containers.create(self.base_image, ["true"], network_mode="none",
                                                       labels={LABEL: "image"})
            container.put_archive("/", workspace_tar(archive))
            container.commit(repository=TASK_IMAGE, tag=key)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not build the task image {tag} from {self.base_image}: {exc}") from exc
        finally:
            if container is not None:
                _remove(container)
        log.info("swebench: built %s in %.1fs", tag, time.perf_counter() - started)
        return tag

    async def run(self, code: str, language: str = "bash", *, stdin: str | None = None, args: list[str] | None = None,
                  files: dict[str, str] | None = None, archive: bytes | None = None, timeout_s: float = 10.0,
                  memory_mb: int = 1024, max_output_bytes: int | None = None) -> RunResult:
        """Run the bash script `code` in a fresh container of the task image of `archive`, `files` beside it.

        Raises:
            SandboxError: the engine failed (not the program).
        """
        if language != "bash" or args:
            raise ValueError("the Docker backend runs bash scripts without arguments")
        image = await self.task_image(archive or b"")
        files = {**(files or {}), "grading/.script.sh": code, STDIN_FILE: stdin or ""}
        async with self._slots:
            return await asyncio.to_thread(self._run, image, files, timeout_s, memory_mb,
                                           max_output_bytes or MAX_OUTPUT_BYTES)

    def _run(self, image: str, files: dict[str, str], timeout_s: float, memory_mb: int, limit: int) -> RunResult:
        import requests

        import docker

        stdin = f"{WORKSPACE}/{STDIN_FILE}"
        command = ["bash", "-c", f"exec <{stdin} && rm -f {stdin} && exec bash {WORKSPACE}/grading/.script.sh"]
        container = None
        try:
            container = self._client.containers.create(
                image, command, working_dir=WORKSPACE, network_mode="none", labels={LABEL: "grading"},
                mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m", nano_cpus=1_000_000_000,
                pids_limit=self.pids_limit, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            )  # fmt: skip
            container.put_archive("/", workspace_tar(b"", files))
            started = time.perf_counter()
            container.start()
            try:
                code = container.wait(timeout=timeout_s)["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                container.kill()
                return RunResult(status="timeout", stdout="", stderr="", return_code=None,
                                 duration_s=time.perf_counter() - started,
                                 message=f"killed at its deadline ({timeout_s:g}s)")
            duration = time.perf_counter() - started
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            stdout = container.logs(stdout=True, stderr=False)
            stderr = container.logs(stdout=False, stderr=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the container engine failed running a grading container of {image}: {exc}") from exc
        finally:
            if container is not None:
                _remove(container)
        if oom or code == 128 + 9:  # Podman on cgroup v1 does not set OOMKilled: SIGKILL is the memory limit's
            return RunResult(status="oom", stdout="", stderr="", return_code=code, duration_s=duration,
                             message=f"out of memory ({memory_mb} MB)" if oom else
                             f"killed by SIGKILL: over its memory limit ({memory_mb} MB), most likely")
        return RunResult(status="ok" if code == 0 else "failed", stdout=stdout[:limit].decode(errors="replace"),
                         stderr=stderr[-limit:].decode(errors="replace"), return_code=code, duration_s=duration,
                         truncated=len(stdout) > limit or len(stderr) > limit, stdout_truncated=len(stdout) > limit,
                         message=None if code == 0 else f"exit status {code}")


def _remove(container: Any) -> None:
    """Kill and remove a container; one already gone is fine, any other failure is logged (it carries LABEL)."""
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.DockerException as exc:
        log.error("could not remove container %s (label %s): %s", container.id, LABEL, exc)
