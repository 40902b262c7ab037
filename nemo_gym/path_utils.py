"""NeMo-Gym's `nemo_gym.path_utils` (the sidecar files beside a rollouts file), re-exported from gymfleet
(`gymfleet.serving.nemo_gym_records`; no code of its own)."""

from gymfleet.serving.nemo_gym_records import aggregate_metrics_path_for, failures_path_for, materialized_path_for

__all__ = ["aggregate_metrics_path_for", "failures_path_for", "materialized_path_for"]
