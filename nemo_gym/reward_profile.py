"""NeMo-Gym's `nemo_gym.reward_profile` helpers for `compute_metrics` / `get_key_metrics`, re-exported from gymfleet
(`gymfleet.serving.nemo_gym_metrics`, `gymfleet.serving.nemo_gym_profiler`; no code of its own)."""

from gymfleet.serving.nemo_gym_metrics import (
    AggregateMetricsMixin,
    add_avg_sample_std_dev,
    compute_aggregate_metrics,
    compute_pass_majority_metrics,
    compute_subset_metrics,
    highest_k_metrics,
)
from gymfleet.serving.nemo_gym_profiler import RewardProfiler

__all__ = [
    "AggregateMetricsMixin", "RewardProfiler", "add_avg_sample_std_dev", "compute_aggregate_metrics",
    "compute_pass_majority_metrics", "compute_subset_metrics", "highest_k_metrics",
]
