"""NeMo-Gym's `nemo_gym.rollout_collection`: re-exports from `gymfleet.rollouts.collect_inputs`,
`gymfleet.rollouts.rollout_helper` and `gymfleet.serving.nemo_gym_records` (the record keys and failure rules, the
dispatch latency tracker and the invalid-judge row migration)."""

from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper
from gymfleet.serving.nemo_gym_records import (
    NG_ELAPSED_KEY,
    NG_FAILURE_CLASS_KEY,
    NG_NO_PERSIST_KEY,
    NG_TERMINAL_KEY,
    DispatchLatencyTracker,
    get_max_rollout_attempts,
    is_terminal_failure,
    migrate_invalid_judge_main_rows,
    observed_elapsed,
)

__all__ = [
    "NG_ELAPSED_KEY", "NG_FAILURE_CLASS_KEY", "NG_NO_PERSIST_KEY", "NG_TERMINAL_KEY", "DispatchLatencyTracker",
    "RolloutCollectionConfig", "RolloutCollectionHelper", "get_max_rollout_attempts", "is_terminal_failure",
    "migrate_invalid_judge_main_rows", "observed_elapsed",
]
