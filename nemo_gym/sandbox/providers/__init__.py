"""NeMo-Gym's `nemo_gym.sandbox.providers`: the provider protocol, types and registry, re-exported from gymfleet (no
code of its own)."""

from gymfleet.serving.nemo_gym_sandbox import GymfleetSandboxProvider
from gymfleet.serving.nemo_gym_sandbox_types import (
           create_provider,
           get_provider_class,
           list_providers,
           register_provider,
)
from nemo_gym.sandbox.providers import base
from nemo_gym.sandbox.providers.base import *  # noqa: F403  (the protocol and types: base.__all__)

__all__ = [*base.__all__, "GymfleetSandboxProvider", "create_provider", "get_provider_class", "list_providers",
           "register_provider"]
