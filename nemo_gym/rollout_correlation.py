"""NeMo-Gym's `nemo_gym.rollout_correlation`: which rollout a call belongs to, re-exported from gymfleet
(`gymfleet.serving.nemo_gym_rollout`; no code of its own)."""

from gymfleet.serving.nemo_gym_rollout import (
    ROLLOUT_ID_PATTERN,
    RolloutContextMiddleware,
    current_rollout_id,
    maybe_rollout_id_from_run_body,
    rollout_context,
)

__all__ = [
    "ROLLOUT_ID_PATTERN", "RolloutContextMiddleware", "current_rollout_id", "maybe_rollout_id_from_run_body",
    "rollout_context",
]
