"""NeMo-Gym's `nemo_gym.sandbox.utils`, re-exported from gymfleet (no code of its own)."""

from gymfleet.serving.nemo_gym_sandbox_types import CPU_CAP_ENV_VARS, cpu_cap_env, rewrite_image

__all__ = ["CPU_CAP_ENV_VARS", "cpu_cap_env", "rewrite_image"]
