"""NeMo-Gym 0.7.0's `nemo_gym.sandbox.AsyncSandboxCompose`, as far as gymfleet goes: a typed refusal.

Under NeMo-Gym, `AsyncSandboxCompose(provider, compose_file, service_specs=..., timeout_s=...)` starts every service
of a (resolved) Compose file as a sandbox of a container provider, wired on one network, and `services[name]` is each
one's `AsyncSandbox`. gymfleet does not run Compose projects: its built-in provider runs no container images, and
nothing here wires services to one another. So the class keeps NeMo-Gym's shape (`project`, `services`, `start`,
`stop`, `serialize`; the constructor's checks) and `start()` reads and checks the file (a mapping with a non-empty
`services` mapping, each service a mapping with a prebuilt `image`; anything else is a `ValueError` naming the
service), then raises `SandboxCreateError` naming the project's services and why, before creating anything. A folder
that catches sandbox start failures reports it as its own start failure; nothing is scored. `stop()` is idempotent.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gymfleet.serving.nemo_gym_sandbox_types import SandboxCreateError, SandboxSpec, create_provider

COMPOSE_UNSUPPORTED = ("gymfleet does not run Compose projects (its built-in sandbox provider runs no container "
                       "images and wires no service network): run this environment's Compose tasks under NeMo-Gym, "
                       "or its single-container tasks here")


class AsyncSandboxCompose:
    """A Compose project's services as sandboxes: refused at `start()` on gymfleet (module docstring)."""

    def __init__(self, provider: Mapping[str, Any] | Any, compose_file: str | Path | None, *,
                 service_specs: Mapping[str, SandboxSpec] | None = None, timeout_s: float = 1200,
                 poll_interval_s: float = 0.5, volume_init_image: str = "alpine:3.22",
                 volume_sources: Mapping[str, str] | None = None):
        if timeout_s <= 0 or poll_interval_s <= 0:
            raise ValueError("Compose timeout_s and poll_interval_s must be positive")
        self.provider = create_provider(provider) if isinstance(provider, Mapping) else provider
        self.compose_file = Path(compose_file).resolve() if compose_file is not None else None
        self.service_specs = dict(service_specs or {})
        self.timeout_s, self.poll_interval_s = timeout_s, poll_interval_s
        self.volume_init_image, self.volume_sources = volume_init_image, dict(volume_sources or {})
        self.project = "compose-" + uuid.uuid4().hex
        self.services: dict[str, Any] = {}
        self.document: dict[str, Any] = {}

    def _service_names(self) -> list[str]:
        if self.compose_file is None:
            raise ValueError("AsyncSandboxCompose.start() needs a compose_file")
        document = yaml.safe_load(self.compose_file.read_text(encoding="utf-8"))
        services = document.get("services") if isinstance(document, Mapping) else None
        if not isinstance(services, Mapping) or not services:
            raise ValueError(f"{self.compose_file}: a Compose file needs a non-empty services mapping")
        for name, service in services.items():
            if not isinstance(service, Mapping) or not service.get("image"):
                raise ValueError(f"{self.compose_file}: service {name!r} needs a prebuilt image")
        self.document = dict(document)
        return list(services)

    async def start(self) -> AsyncSandboxCompose:
        """Check the file, then refuse: `SandboxCreateError` naming the services (module docstring)."""
        names = self._service_names()
        raise SandboxCreateError(f"Compose project {self.project} (services {names}): {COMPOSE_UNSUPPORTED}")

    async def serialize(self, *, scope: str | None = None) -> dict[str, Any]:
        raise RuntimeError(f"Compose project {self.project} was never started: {COMPOSE_UNSUPPORTED}")

    async def stop(self) -> None:
        """Nothing was started; safe to call any number of times."""
        self.services.clear()
