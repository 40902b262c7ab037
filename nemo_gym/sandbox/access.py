"""NeMo-Gym's `nemo_gym.sandbox.access` (a sandbox a resources server lends to the agent), re-exported from gymfleet
(`gymfleet.serving.nemo_gym_types`; no code of its own)."""

from gymfleet.serving.nemo_gym_types import DirectSandboxConnection, SandboxAccess

__all__ = ["DirectSandboxConnection", "SandboxAccess"]
