"""NeMo-Gym 0.7.0's `nemo_gym.sandbox` data types, provider registry and config helpers, written for gymfleet.

The types keep NeMo-Gym's shape (frozen dataclasses, the same fields and checks) so folders that build a
`SandboxSpec`, read a `SandboxExecResult` or register a provider of their own work unchanged. The provider registry
holds providers by name: `gymfleet` (the default, `gymfleet.serving.nemo_gym_sandbox.GymfleetSandboxProvider`: the
fleet's bubblewrap sandbox service) is built in; NeMo-Gym's container providers (docker, daytona, apptainer, ...) are
not, and asking for one says so and how to proceed. `register_provider` adds one (a folder's own, or a test double).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

NEMO_GYM_CONTAINER_PROVIDERS = ("apptainer", "daytona", "docker", "e2b", "ecs_fargate", "enroot", "local",
                                "opensandbox", "openshell")
"""NeMo-Gym's built-in providers that gymfleet does not reimplement (each runs container images)."""


class SandboxStatus(StrEnum):
    """Where a sandbox is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxEndpoint:
    """An absolute URL to a service inside a sandbox, with the headers a caller must send to it."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        url = self.endpoint.strip() if isinstance(self.endpoint, str) else ""
        parts = urlsplit(url)
        if not (parts.scheme and parts.netloc):
            raise ValueError(f"SandboxEndpoint.endpoint must be an absolute URL, got {self.endpoint!r}")
        if not isinstance(self.headers, Mapping):
            raise TypeError(f"SandboxEndpoint.headers must be a mapping, got {type(self.headers).__name__}")
        object.__setattr__(self, "endpoint", url)
        object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})


@dataclass(frozen=True)
class SandboxResources:
    """What a sandbox asks for; fields left None take the provider's defaults."""

    cpu: float | None = None
    memory_mib: int | None = None
    disk_gib: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def from_mapping(cls, resources: Mapping[str, Any] | None) -> SandboxResources:
        """Build from a config mapping; an unknown key is an error naming it and the keys allowed."""
        if resources is None:
            return cls()
        allowed = set(cls.__dataclass_fields__)
        unknown = sorted(set(resources) - allowed)
        if unknown:
            raise ValueError(f"Unknown sandbox resource keys: {', '.join(unknown)}. "
                             f"Expected keys: {', '.join(sorted(allowed))}")
        casts: dict[str, Callable[[Any], Any]] = {"cpu": float, "memory_mib": int, "disk_gib": int, "gpu": int,
                                                  "gpu_type": str}
        return cls(**{key: casts[key](value) for key, value in resources.items() if value is not None})


def _port(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError(f"Invalid sandbox TCP port: {raw!r}")
    try:
        port = int(raw)
    except ValueError as exc:
        raise ValueError(f"Invalid sandbox TCP port: {raw!r}") from exc
    if not 1 <= port <= 65535:
        raise ValueError(f"Sandbox TCP port must be between 1 and 65535, got {port}")
    return port


@dataclass(frozen=True)
class SandboxSpec:
    """What to create: an image (container providers only), a working directory, environment, files written before
    the first command, resources, ports to expose."""

    image: str | None = None
    ttl_s: int | float | None = None
    ready_timeout_s: int | float | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resources: SandboxResources | Mapping[str, Any] = field(default_factory=SandboxResources)
    entrypoint: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    ports: tuple[int, ...] | list[int] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.resources, SandboxResources):
            object.__setattr__(self, "resources", SandboxResources.from_mapping(self.resources))
        if not isinstance(self.ports, (list, tuple)):
            raise TypeError("Sandbox ports must be a list or tuple of TCP port numbers")
        ports = [_port(raw) for raw in self.ports]
        duplicates = sorted({port for port in ports if ports.count(port) > 1})
        if duplicates:
            raise ValueError(f"Duplicate sandbox TCP port: {duplicates[0]}")
        object.__setattr__(self, "ports", tuple(ports))


@dataclass
class SandboxHandle:
    """A created sandbox: its id, the provider that made it, and that provider's own state (`raw`, opaque)."""

    sandbox_id: str
    provider_name: str
    raw: Any


@dataclass(frozen=True)
class SandboxExecResult:
    """What one command did: its output and exit code; `error_type` names a failure that has no exit code (a
    timeout: `return_code` -1)."""

    stdout: str | None
    stderr: str | None
    return_code: int
    error_type: str | None = None


ExecResult = SandboxExecResult


class SandboxCreateError(RuntimeError):
    """The provider could not create the sandbox the spec asks for."""


class SandboxCreateVerificationError(SandboxCreateError):
    """The sandbox was created but failed its readiness check."""


@runtime_checkable
class SandboxProvider(Protocol):
    """What `AsyncSandbox` needs of a provider."""

    name: str

    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_s: float | None = None,
                   user: str | int | None = None) -> SandboxExecResult: ...

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None: ...

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None: ...

    async def status(self, handle: SandboxHandle) -> SandboxStatus: ...

    async def close(self, handle: SandboxHandle) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class SupportsSandboxEndpoint(Protocol):
    """A provider that can route to a declared port of a sandbox."""

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint: ...


@runtime_checkable
class SupportsSandboxPauseResume(Protocol):
    """A provider that can pause a sandbox and resume it later."""

    async def pause(self, handle: SandboxHandle) -> None: ...

    async def resume(self, handle: SandboxHandle) -> None: ...


@runtime_checkable
class ConnectableProvider(Protocol):
    """A provider whose sandboxes another process can reattach to (`AsyncSandbox.serialize` / `connect`)."""

    async def serialize_handle(self, handle: SandboxHandle, *, scope: str | None = None) -> dict[str, Any]: ...

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle: ...


_REGISTERED: dict[str, type] = {}
_BUILT_IN: dict[str, Callable[[], type]] = {}


def register_built_in(name: str, loader: Callable[[], type]) -> None:
    """Make provider `name` available, loaded on first use (gymfleet's own providers)."""
    _BUILT_IN[name] = loader


def register_provider(name: str, provider_class: type, *, override: bool = False) -> None:
    """Register a provider class under `name` (`override` replaces an existing one)."""
    if not name:
        raise ValueError("Provider name must be non-empty")
    if not override and (name in _REGISTERED or name in _BUILT_IN):
        raise ValueError(f"Sandbox provider {name!r} is already registered")
    _REGISTERED[name] = provider_class


def list_providers() -> list[str]:
    """The provider names available here."""
    return sorted({*_REGISTERED, *_BUILT_IN})


def get_provider_class(name: str) -> type:
    """The provider class registered as `name` (registered ones before built-in ones)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILT_IN:
        return _BUILT_IN[name]()
    available = ", ".join(list_providers()) or "<none>"
    hint = ""
    if name in NEMO_GYM_CONTAINER_PROVIDERS:
        hint = (f" NeMo-Gym's {name!r} provider runs container images, which gymfleet does not reimplement: use "
                f"`gymfleet` (the fleet's sandbox service, no images), or register_provider({name!r}, ...) a class "
                f"of your own.")
    raise ValueError(f"Unknown sandbox provider {name!r}. Available providers: {available}.{hint}")


def create_provider(config: Mapping[str, Any]) -> Any:
    """Instantiate the provider a one-key config names: `{name: {keyword arguments}}`."""
    if len(config) != 1:
        raise ValueError(f"Sandbox provider config must contain exactly one provider name, got {list(config)!r}")
    name, kwargs = next(iter(config.items()))
    if not isinstance(name, str) or not name:
        raise ValueError("Sandbox provider name must be a non-empty string")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"Sandbox provider {name!r} config must be a mapping, got {type(kwargs).__name__}")
    return get_provider_class(name)(**dict(kwargs))


# ------------------------------------------------------------------------------------------- config blocks

DEFAULT_METADATA_KEY = "default_metadata"
"""The reserved key of a sandbox config block: metadata merged under each `SandboxSpec.metadata`."""


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else value


def _block(sandbox_provider: str | Mapping[str, Any], named: Mapping[str, Any] | None) -> tuple[Any, str]:
    if isinstance(sandbox_provider, Mapping):
        return _plain(sandbox_provider), "inline sandbox_provider config"
    if not isinstance(sandbox_provider, str):
        raise TypeError("sandbox_provider must be a name reference (str) or a single-key provider mapping, "
                        f"got {type(sandbox_provider).__name__}")
    if not sandbox_provider:
        raise ValueError("Sandbox provider reference must be a non-empty string")
    block = None if named is None else named.get(sandbox_provider)
    if block is None:
        candidates = sorted(str(key) for key, value in (named or {}).items()
                            if isinstance(_plain(value), Mapping)
                            and len([k for k in _plain(value) if k != DEFAULT_METADATA_KEY]) == 1)
        raise ValueError(f"Sandbox provider reference {sandbox_provider!r} is not defined in the merged config: add a "
                         f"top-level '{sandbox_provider}:' block (e.g. `{sandbox_provider}: {{gymfleet: {{}}}}`). "
                         f"Available sandbox configs: {', '.join(map(repr, candidates)) or '(none)'}")
    return _plain(block), f"reference {sandbox_provider!r}"


def resolve_provider_config(sandbox_provider: str | Mapping[str, Any],
                            named_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one-key `{provider: kwargs}` config a `sandbox_provider` field names (a top-level block of
    `named_configs`) or holds inline; `default_metadata` is left out (`resolve_provider_metadata` reads it)."""
    block, source = _block(sandbox_provider, named_configs)
    if not isinstance(block, Mapping):
        raise ValueError(f"Sandbox provider config from {source} must be a mapping, got: {block!r}")
    keys = [key for key in block if key != DEFAULT_METADATA_KEY]
    if len(keys) != 1:
        raise ValueError(f"Sandbox provider config from {source} must have exactly one provider key "
                         f"{{provider_name: config}}, got keys: {keys!r}")
    return {keys[0]: block[keys[0]]}


def resolve_provider_metadata(sandbox_provider: str | Mapping[str, Any],
                              named_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `default_metadata` of the sandbox block `sandbox_provider` names or holds (empty when it has none)."""
    block, source = _block(sandbox_provider, named_configs)
    if not isinstance(block, Mapping):
        raise ValueError(f"Sandbox provider config from {source} must be a mapping, got: {block!r}")
    metadata = block.get(DEFAULT_METADATA_KEY) or {}
    if not isinstance(metadata, Mapping):
        raise ValueError(f"Sandbox '{DEFAULT_METADATA_KEY}' from {source} must be a mapping, got: {metadata!r}")
    return dict(metadata)


# ------------------------------------------------------------------------------------------------ helpers

CPU_CAP_ENV_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS", "OMP_THREAD_LIMIT", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS", "PYTHON_CPU_COUNT", "NUMBA_NUM_THREADS", "LOKY_MAX_CPU_COUNT",
    "POLARS_MAX_THREADS", "PYTEST_XDIST_AUTO_NUM_WORKERS", "DJANGO_TEST_PROCESSES", "GOMAXPROCS",
    "CARGO_BUILD_JOBS", "RAYON_NUM_THREADS", "RUST_TEST_THREADS", "UV_THREADPOOL_SIZE", "CMAKE_BUILD_PARALLEL_LEVEL",
)
"""Environment variables that size thread and worker pools (BLAS, OpenMP, Go, cargo, pytest-xdist, ...): set to a
sandbox's CPU limit so tools inside do not size their pools by the host's cores (NeMo-Gym's list)."""


def cpu_cap_env(cpu: float | int | None) -> dict[str, str]:
    """Each of `CPU_CAP_ENV_VARS` set to the CPU limit rounded down (at least 1); empty for no limit."""
    if cpu is None:
        return {}
    return dict.fromkeys(CPU_CAP_ENV_VARS, str(max(1, int(cpu))))


def rewrite_image(image: str | None, rewrites: list[dict[str, str]]) -> str | None:
    """`image` with the first matching `{"from": prefix, "to": replacement}` prefix rewrite applied."""
    if image is None:
        return None
    for rule in rewrites:
        if image.startswith(rule["from"]):
            return rule["to"] + image[len(rule["from"]):]
    return image
