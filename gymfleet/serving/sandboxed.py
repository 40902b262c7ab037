"""The plumbing of a resources server that runs code in the sandbox service (`sandbox/`).

`SandboxedConfig` holds the two fields that find the sandbox (`sandbox`, an instance of the fleet, or
`sandbox_url`, one outside it). `SandboxedServer` opens `self.sandbox` (a `SandboxClient`) from them and, in a
fleet, fails at startup when the sandbox instance is missing, instead of failing every rollout's first call;
`self.slots` (`concurrency_slots`) is the optional cap on verifications using the sandbox at once: the config's
`num_processes` (NeMo-Gym's knob) where the environment declares one, else none.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gymfleet.errors import ConfigError
from gymfleet.grading.sandbox_client import SandboxClient
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig
from gymfleet.serving.server import ServerRef

SANDBOX_HINT = "Add sandbox/configs/sandbox.yaml to config_paths, or set sandbox_url."


class SandboxedConfig(ResourcesServerConfig):
    """Where the sandbox is."""

    sandbox: ServerRef = "sandbox"
    """The sandbox instance (`{type: sandbox_servers, name: sandbox}` or its name)."""
    sandbox_url: str | None = None
    """A sandbox outside the fleet (`http://host:port`); wins over `sandbox`."""


class SandboxedServer(ResourcesServer):
    """A resources server with a sandbox client, `self.sandbox`, and `self.slots`, the cap on verifications using it
    at once; `env_name` names it in the startup error."""

    config: SandboxedConfig
    env_name: str = "this environment"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sandbox = SandboxClient(self.config.sandbox, url=self.config.sandbox_url, config=self.client)
        self.slots = concurrency_slots(getattr(self.config, "num_processes", None))

    async def startup(self) -> None:
        await super().startup()
        if self.config.sandbox_url is None and self.global_config:  # in a fleet: a missing sandbox fails now
            try:
                self.client.url_of(self.config.sandbox)
            except ConfigError as exc:
                raise ConfigError(f"{self.env_name} needs a sandbox instance: {exc}", hint=SANDBOX_HINT) from exc


def concurrency_slots(limit: int | None) -> Any:
    """An async context manager that lets `limit` holders in at once (`None`: no cap)."""
    return asyncio.Semaphore(limit) if limit else contextlib.nullcontext()
