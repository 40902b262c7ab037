"""NeMo-Gym's `nemo_gym.rollout_collection`: re-exports from `gymfleet.rollouts.collect_inputs`,
`gymfleet.rollouts.rollout_helper`, `gymfleet.serving.nemo_gym_records` (its `ROLLOUT_COLLECTION_NAMES`: the record
keys and failure rules, the dispatch latency tracker and the invalid-judge row migration) and
`gymfleet.serving.nemo_gym_collection` (NeMo-Gym's `SharedRolloutCollectionConfig`, `_attach_ng_perf`)."""

from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper
from gymfleet.serving import nemo_gym_records
from gymfleet.serving.nemo_gym_collection import SharedRolloutCollectionConfig, _attach_ng_perf
from gymfleet.serving.nemo_gym_records import *  # noqa: F403  (nemo_gym_records.__all__)

__all__ = [*nemo_gym_records.ROLLOUT_COLLECTION_NAMES, "RolloutCollectionConfig", "RolloutCollectionHelper",
           "SharedRolloutCollectionConfig", "_attach_ng_perf"]
