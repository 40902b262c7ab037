"""NeMo-Gym's `nemo_gym.sandbox.providers`: the provider protocol, types and registry, re-exported from gymfleet (no
code of its own)."""

from gymfleet.serving.nemo_gym_sandbox import GymfleetSandboxProvider
from gymfleet.serving.nemo_gym_sandbox_types import (
    ConnectableProvider,
    ExecResult,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxProvider,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
    create_provider,
    get_provider_class,
    list_providers,
    register_provider,
)

__all__ = [
    "ConnectableProvider", "ExecResult", "GymfleetSandboxProvider", "SandboxCreateError",
    "SandboxCreateVerificationError", "SandboxEndpoint", "SandboxExecResult", "SandboxHandle", "SandboxProvider",
    "SandboxResources", "SandboxSpec", "SandboxStatus", "create_provider", "get_provider_class", "list_providers",
    "register_provider",
]
