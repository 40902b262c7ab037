"""NeMo-Gym's `nemo_gym.sandbox`: sandboxes for environment folders, served by gymfleet's sandbox service
(`gymfleet.serving.nemo_gym_sandbox`, `nemo_gym_sandbox_sync`, `nemo_gym_sandbox_types`,
`nemo_gym_sandbox_compose`; no code of its own)."""

from gymfleet.serving.nemo_gym_sandbox import AsyncSandbox
from gymfleet.serving.nemo_gym_sandbox_compose import AsyncSandboxCompose
from gymfleet.serving.nemo_gym_sandbox_sync import Sandbox
from gymfleet.serving.nemo_gym_sandbox_types import resolve_provider_config, resolve_provider_metadata, rewrite_image
from nemo_gym.sandbox import providers
from nemo_gym.sandbox.providers import *  # noqa: F403  (the protocol, types and registry: providers.__all__)

__all__ = ["AsyncSandbox", "AsyncSandboxCompose", "Sandbox", *providers.__all__, "resolve_provider_config",
           "resolve_provider_metadata", "rewrite_image"]
