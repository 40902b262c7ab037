"""NeMo-Gym's `nemo_gym.rollout_collection`, re-exported from `gymfleet.collect` and `gymfleet.rollout_helper` (no code of its own)."""

from gymfleet.collect import RolloutCollectionConfig
from gymfleet.rollout_helper import RolloutCollectionHelper

__all__ = ["RolloutCollectionConfig", "RolloutCollectionHelper"]
