"""NeMo-Gym's `nemo_gym.sandbox.providers.base`: the provider protocol and types, re-exported from gymfleet (no code
of its own)."""

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
)

__all__ = [
    "ConnectableProvider", "ExecResult", "SandboxCreateError", "SandboxCreateVerificationError", "SandboxEndpoint",
    "SandboxExecResult", "SandboxHandle", "SandboxProvider", "SandboxResources", "SandboxSpec", "SandboxStatus",
    "SupportsSandboxEndpoint", "SupportsSandboxPauseResume",
]
