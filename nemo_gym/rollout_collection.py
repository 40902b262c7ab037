"""NeMo-Gym's `nemo_gym.rollout_collection`: re-exports from `gymfleet.rollouts.collect_inputs` and
`gymfleet.rollouts.rollout_helper`."""

from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper

__all__ = ["RolloutCollectionConfig", "RolloutCollectionHelper"]
