"""NeMo-Gym 0.7.0's `nemo_gym.sandbox.AsyncSandbox`, served by gymfleet's sandbox service (`sandbox/`).

    sandbox = AsyncSandbox({"gymfleet": {}}, SandboxSpec(workdir="/workspace", files={"main.py": code}))
    async with await sandbox.start():
        result = await sandbox.exec("python main.py", timeout_s=10)   # SandboxExecResult(stdout, stderr, ...)

`AsyncSandbox` keeps NeMo-Gym's shape (start / start_with_setup / exec / upload / download / status / stop /
serialize / connect, an async context manager) over any provider in the registry. The built-in provider, `gymfleet`
(`GymfleetSandboxProvider`), maps each sandbox onto one persistent session of the fleet's sandbox service, found by
instance name in the fleet config (`server`, default `sandbox`) or by `url`: commands run there as bash, in the
session's workspace; model-written code never runs in the server process. It runs no container images: a spec with an
`image` is refused with a `SandboxCreateError` that says so (running a SWE task without its image would score it
silently wrong).

Failure boundary: what the *command* does is a `SandboxExecResult` (exit code; `error_type` `timeout` / `oom` /
`killed`, return code -1, for a command stopped by a limit). A sandbox that is down, unreachable, overloaded past the
retries or whose session is gone raises `gymfleet.errors.SandboxError` from `start` / `exec` / `upload` /
`download`, which the folder's `/verify` turns into a `sandbox_failed` failure row (`_ng_failure_class`), never a
reward of 0.
"""

from __future__ import annotations

import base64
import logging
import shlex
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from gymfleet.grading.sandbox_client import RunResult, SandboxClient, SandboxSession
from gymfleet.serving.nemo_gym_client import served_config
from gymfleet.serving.nemo_gym_sandbox_types import (
    ConnectableProvider,
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxEndpoint,
    SupportsSandboxPauseResume,
    create_provider,
    register_built_in,
)

log = logging.getLogger(__name__)

DEFAULT_EXEC_TIMEOUT_S = 180
"""`AsyncSandbox.exec`'s default limit, as NeMo-Gym's."""
LIMIT_STATUSES = ("timeout", "oom", "killed")
"""Sandbox service statuses of a command stopped by a limit: `error_type`, with return code -1."""


class GymfleetSandboxProvider:
    """NeMo-Gym sandbox provider `gymfleet`: one sandbox service session per sandbox.

    Args:
        server: Instance name of the sandbox service in the fleet config (ignored when `url` is given).
        url: Base URL of a sandbox service.
        memory_mib: Memory of each sandbox when its spec's resources name none.
        max_timeout_s: The longest limit a command gets (the sandbox service's `max_timeout_s`, 120 s by default):
            a longer `timeout_s` (NeMo-Gym's default is 180 s) is lowered to it, with a debug log line.
        config: The fleet config to resolve `server` in (default: the config of the fleet serving this folder).
    """

    name = "gymfleet"

    def __init__(self, server: str = "sandbox", url: str | None = None, memory_mib: int = 1024,
                 max_timeout_s: float = 120.0, config: Mapping[str, Any] | None = None):
        self.client = SandboxClient(server, url=url, config=dict(config or served_config() or {}))
        self.memory_mib = memory_mib
        self.max_timeout_s = max_timeout_s

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.image is not None:
            raise SandboxCreateError(
                f"sandbox provider 'gymfleet' runs no container images, and this spec asks for {spec.image!r}: "
                f"configure a provider that runs images (register_provider) for this environment")
        memory = spec.resources.memory_mib or self.memory_mib
        session = await self.client.session(timeout_s=self.max_timeout_s, memory_mb=memory)
        state = {"session": session, "env": dict(spec.env), "closed": False}
        return SandboxHandle(sandbox_id=session.id, provider_name=self.name, raw=state)

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_s: float | None = None,
                   user: str | int | None = None) -> SandboxExecResult:
        if user is not None:
            raise ValueError(f"sandbox provider 'gymfleet' runs every command as its one unprivileged user; "
                             f"user={user!r} cannot be honoured")
        state = handle.raw
        script = [f"export {key}={shlex.quote(str(value))}" for key, value in {**state["env"], **(env or {})}.items()]
        if cwd:
            script.append(f"cd {shlex.quote(cwd)}")
        script.append(command)
        session: SandboxSession = state["session"]
        limit = float(timeout_s) if timeout_s else float(DEFAULT_EXEC_TIMEOUT_S)
        if limit > self.max_timeout_s:
            log.debug("sandbox %s: timeout_s=%s lowered to max_timeout_s=%s", handle.sandbox_id, limit,
                      self.max_timeout_s)
            limit = self.max_timeout_s
        return exec_result(await session.exec("\n".join(script), "bash", timeout_s=limit))

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        data = base64.b64encode(Path(source_path).read_bytes()).decode()
        target = shlex.quote(target_path)
        command = f"mkdir -p \"$(dirname {target})\" && printf %s {shlex.quote(data)} | base64 -d > {target}"
        result = await self.exec(handle, command, timeout_s=60)
        if result.return_code != 0:
            raise OSError(f"could not write {target_path} in sandbox {handle.sandbox_id}: {result.stderr}")

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        result = await self.exec(handle, f"base64 -w0 {shlex.quote(source_path)}", timeout_s=60)
        if result.return_code != 0:
            raise FileNotFoundError(f"could not read {source_path} in sandbox {handle.sandbox_id}: {result.stderr}")
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_bytes(base64.b64decode(result.stdout or ""))

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        return SandboxStatus.STOPPED if handle.raw["closed"] else SandboxStatus.RUNNING

    async def close(self, handle: SandboxHandle) -> None:
        if not handle.raw["closed"]:
            await handle.raw["session"].close()
            handle.raw["closed"] = True

    async def aclose(self) -> None:
        """Nothing to release: sessions are closed one by one, HTTP connections are gymfleet's shared pool's."""


def exec_result(result: RunResult) -> SandboxExecResult:
    """NeMo-Gym's result of a sandbox service run: a limit's status is `error_type` with return code -1."""
    if result.status in LIMIT_STATUSES:
        return SandboxExecResult(result.stdout, result.stderr, -1, error_type=result.status)
    code = result.return_code if result.return_code is not None else -1
    return SandboxExecResult(result.stdout, result.stderr, code)


register_built_in("gymfleet", lambda: GymfleetSandboxProvider)


class AsyncSandbox:
    """A sandbox made by a provider (a `{name: kwargs}` config or a provider instance), started from `spec`.

    With `owns_provider=False` the caller closes a shared provider after all its sandboxes stopped.
    """

    def __init__(self, provider: Mapping[str, Any] | Any, spec: SandboxSpec | None = None, *,
                 owns_provider: bool = True):
        self._provider = create_provider(provider) if isinstance(provider, Mapping) else provider
        self._owns_provider = owns_provider
        self._spec = spec
        self._handle: SandboxHandle | None = None
        self._stopped = True
        self._closed = False
        self._connected = False

    @property
    def _provider_name(self) -> str:
        return getattr(self._provider, "name", type(self._provider).__name__)

    def _require_handle(self) -> SandboxHandle:
        if self._handle is None or self._stopped:
            raise RuntimeError("Sandbox has not been started")
        return self._handle

    async def start(self, spec: SandboxSpec | None = None) -> AsyncSandbox:
        """Create the sandbox and write the spec's `files` into it (a failed write stops it again)."""
        if self._closed:
            raise RuntimeError("Sandbox has been stopped")
        if self._handle is not None and not self._stopped:
            raise RuntimeError("Sandbox is already started")
        spec = spec if spec is not None else self._spec
        if spec is None:
            raise ValueError("Sandbox.start() requires a SandboxSpec")
        self._handle = await self._provider.create(spec)
        self._spec, self._stopped = spec, False
        try:
            if spec.files:
                with tempfile.TemporaryDirectory(prefix="gymfleet-sandbox-upload-") as scratch:
                    for index, (target, contents) in enumerate(spec.files.items()):
                        source = Path(scratch) / f"file-{index}"
                        source.write_text(contents, encoding="utf-8")
                        await self._provider.upload_file(self._handle, source, target)
        except BaseException:
            await self.stop()
            raise
        return self

    async def start_with_setup(self, spec: SandboxSpec | None,
                               setup: Callable[[AsyncSandbox], Awaitable[None]]) -> AsyncSandbox:
        """Start, then run `setup(self)`; a failing setup stops the sandbox before its error propagates."""
        await self.start(spec)
        try:
            await setup(self)
        except BaseException:
            await self.stop()
            raise
        return self

    async def exec(self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_s: int | float | None = DEFAULT_EXEC_TIMEOUT_S, user: str | int | None = None,
                   preserve_background_services: bool = False) -> SandboxExecResult:
        """Run `command` (in `cwd`, default the spec's `workdir`). `preserve_background_services` is accepted for
        NeMo-Gym's signature; a provider without a service-preserving path runs an ordinary exec, as under
        NeMo-Gym."""
        workdir = cwd if cwd is not None else (self._spec.workdir if self._spec is not None else None)
        return await self._provider.exec(self._require_handle(), command, cwd=workdir, env=env, timeout_s=timeout_s,
                                         user=user)

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        await self._provider.upload_file(self._require_handle(), Path(local_path), remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        await self._provider.download_file(self._require_handle(), remote_path, Path(local_path))

    async def status(self) -> SandboxStatus:
        if self._handle is None:
            return SandboxStatus.UNKNOWN
        if self._stopped:
            return SandboxStatus.STOPPED
        return await self._provider.status(self._handle)

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """The route to declared port `port` of the sandbox (providers that support it)."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"Sandbox endpoint port must be an integer between 1 and 65535, got {port!r}")
        declared = self._spec.ports if self._spec is not None else ()
        if port not in declared:
            raise ValueError(f"Sandbox port {port} was not declared in SandboxSpec.ports; declared ports: "
                             f"{list(declared)!r}")
        if not isinstance(self._provider, SupportsSandboxEndpoint):
            raise NotImplementedError(f"Sandbox provider {self._provider_name!r} does not support service endpoints")
        return await self._provider.endpoint(self._require_handle(), port)

    async def pause(self) -> None:
        if not isinstance(self._provider, SupportsSandboxPauseResume):
            raise NotImplementedError(f"Sandbox provider {self._provider_name!r} does not support pause/resume")
        await self._provider.pause(self._require_handle())

    async def resume(self) -> None:
        if not isinstance(self._provider, SupportsSandboxPauseResume):
            raise NotImplementedError(f"Sandbox provider {self._provider_name!r} does not support pause/resume")
        await self._provider.resume(self._require_handle())

    async def stop(self) -> None:
        """Close the sandbox (and the provider, when owned); a failed close can be retried."""
        if self._closed:
            return
        if self._handle is not None and not self._stopped:
            await self._provider.close(self._handle)
            self._stopped = True
        if self._owns_provider:
            await self._provider.aclose()
        self._closed = True

    async def disconnect(self) -> None:
        """Release a sandbox rebuilt with `connect` without stopping it (its creator stops it)."""
        if self._closed:
            return
        if not self._connected:
            raise RuntimeError("disconnect() is valid only for a sandbox rebuilt with connect()")
        if self._owns_provider:
            await self._provider.aclose()
        self._handle, self._stopped, self._closed = None, True, True

    async def serialize(self, *, scope: str | None = None) -> dict[str, Any]:
        """A descriptor another process can `connect` to (providers that support it)."""
        if not isinstance(self._provider, ConnectableProvider):
            raise RuntimeError(f"provider {self._provider_name!r} does not support serialize()/connect()")
        descriptor = await self._provider.serialize_handle(self._require_handle(), scope=scope)
        if isinstance(descriptor, dict) and self._spec is not None:
            descriptor = {"workdir": self._spec.workdir, **descriptor}
            if self._spec.ports:
                descriptor["ports"] = list(self._spec.ports)
        return descriptor

    @classmethod
    async def connect(cls, descriptor: Mapping[str, Any], *, provider: Any, owns_provider: bool = True
                      ) -> AsyncSandbox:
        """Rebuild a sandbox from `serialize`'s descriptor."""
        if not isinstance(provider, ConnectableProvider):
            name = getattr(provider, "name", type(provider).__name__)
            raise RuntimeError(f"provider {name!r} does not support serialize()/connect()")
        handle = await provider.connect(descriptor)
        spec = SandboxSpec(workdir=descriptor.get("workdir"), ports=descriptor.get("ports", ()))
        sandbox = cls(provider, spec, owns_provider=owns_provider)
        sandbox._handle, sandbox._stopped, sandbox._connected = handle, False, True
        return sandbox

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
