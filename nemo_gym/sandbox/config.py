"""NeMo-Gym's `nemo_gym.sandbox.config`: sandbox provider blocks of the fleet config, re-exported from gymfleet (no
code of its own)."""

from gymfleet.serving.nemo_gym_sandbox_types import resolve_provider_config, resolve_provider_metadata

__all__ = ["resolve_provider_config", "resolve_provider_metadata"]
