"""NeMo-Gym's `nemo_gym.episode_types` (the Environment Server protocol's ids), re-exported from gymfleet (no code of
its own)."""

from gymfleet.serving.nemo_gym_types import EpisodeId, TaskId

__all__ = ["EpisodeId", "TaskId"]
