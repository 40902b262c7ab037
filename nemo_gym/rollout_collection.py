"""NeMo-Gym's `nemo_gym.rollout_collection`: re-exports from `gymfleet.collect` and `gymfleet.rollout_helper`."""

from gymfleet.collect import RolloutCollectionConfig
from gymfleet.rollout_helper import RolloutCollectionHelper

__all__ = ["RolloutCollectionConfig", "RolloutCollectionHelper"]
