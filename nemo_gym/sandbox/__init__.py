"""NeMo-Gym's `nemo_gym.sandbox`: sandboxes for environment folders, served by gymfleet's sandbox service
(`gymfleet.serving.nemo_gym_sandbox`, `nemo_gym_sandbox_sync`, `nemo_gym_sandbox_types`; no code of its own)."""

from gymfleet.serving.nemo_gym_sandbox import AsyncSandbox, GymfleetSandboxProvider
from gymfleet.serving.nemo_gym_sandbox_sync import Sandbox
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
    SupportsSandboxEndpoint,
    SupportsSandboxPauseResume,
    create_provider,
    get_provider_class,
    list_providers,
    register_provider,
    resolve_provider_config,
    resolve_provider_metadata,
    rewrite_image,
)

__all__ = [
    "AsyncSandbox", "ConnectableProvider", "ExecResult", "GymfleetSandboxProvider", "SandboxCreateError",
    "SandboxCreateVerificationError", "SandboxEndpoint", "SandboxExecResult", "SandboxHandle", "SandboxProvider",
    "SandboxResources", "Sandbox", "SandboxSpec", "SandboxStatus", "SupportsSandboxEndpoint",
    "SupportsSandboxPauseResume", "create_provider", "get_provider_class", "list_providers", "register_provider",
    "resolve_provider_config", "resolve_provider_metadata", "rewrite_image",
]
