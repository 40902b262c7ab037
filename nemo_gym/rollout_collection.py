"""NeMo-Gym's `nemo_gym.rollout_collection`, re-exported from `gymfleet.collect` (no code of its own)."""

from gymfleet.collect import RolloutCollectionConfig, RolloutCollectionHelper

__all__ = ["RolloutCollectionConfig", "RolloutCollectionHelper"]
