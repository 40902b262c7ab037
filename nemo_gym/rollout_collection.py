"""NeMo-Gym's `nemo_gym.rollout_collection`: re-exports from `gymfleet.rollouts.nemo_gym_collect` (0.7.0's
`RolloutCollectionConfig`, `RolloutCollectionHelper` with `run_from_config`, `_CompletedRollout`,
`setup_server_client_utils`), `gymfleet.rollouts.nemo_gym_aggregate` (`RolloutAggregationConfig`/`Helper`),
`gymfleet.serving.nemo_gym_records` (its `ROLLOUT_COLLECTION_NAMES`: the record keys and failure rules, the dispatch
latency tracker and the invalid-judge row migration) and `gymfleet.serving.nemo_gym_collection` (NeMo-Gym's
`SharedRolloutCollectionConfig`, `_attach_ng_perf`). `setup_server_client_utils` and `get_global_config_dict` are
read from this module at each call, so a test that patches them here is obeyed, as under 0.7.0."""

from gymfleet.fleet.run_helper import get_global_config_dict
from gymfleet.rollouts.nemo_gym_aggregate import RolloutAggregationConfig, RolloutAggregationHelper
from gymfleet.rollouts.nemo_gym_collect import (
    RolloutCollectionConfig,
    RolloutCollectionHelper,
    _CompletedRollout,
    setup_server_client_utils,
)
from gymfleet.rollouts.nemo_gym_sidecars import (
    AGENT_REQUEST_FAILED_FAILURE_CLASS,
    AGENT_RUN_ERROR_FAILURE_CLASS,
    ENVIRONMENT_SERVER_FAILURE_CLASS,
    NG_DISPATCH_DRAINED_KEY,
    NG_RESULT_TYPE_KEY,
)
from gymfleet.serving import nemo_gym_records
from gymfleet.serving.nemo_gym_collection import SharedRolloutCollectionConfig, _attach_ng_perf
from gymfleet.serving.nemo_gym_records import *  # noqa: F403  (nemo_gym_records.__all__)

__all__ = [*nemo_gym_records.ROLLOUT_COLLECTION_NAMES, "AGENT_REQUEST_FAILED_FAILURE_CLASS",
           "AGENT_RUN_ERROR_FAILURE_CLASS", "ENVIRONMENT_SERVER_FAILURE_CLASS", "NG_DISPATCH_DRAINED_KEY",
           "NG_RESULT_TYPE_KEY", "RolloutAggregationConfig", "RolloutAggregationHelper", "RolloutCollectionConfig",
           "RolloutCollectionHelper", "SharedRolloutCollectionConfig", "_CompletedRollout", "_attach_ng_perf",
           "get_global_config_dict", "setup_server_client_utils"]
