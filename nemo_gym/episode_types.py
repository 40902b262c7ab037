"""NeMo-Gym's `nemo_gym.episode_types` (the Environment Server protocol's ids and episode contracts), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_types`, `gymfleet.serving.nemo_gym_episodes`; no code of its own)."""

from gymfleet.serving.nemo_gym_episodes import (
    BaseEpisodeRequest,
    BaseEpisodeResponse,
    EpisodeFailure,
    EpisodeResultT,
    MaterializedTask,
    TaskInputT,
    is_materialized_task_row,
)
from gymfleet.serving.nemo_gym_types import EpisodeId, TaskId

__all__ = [
    "BaseEpisodeRequest", "BaseEpisodeResponse", "EpisodeFailure", "EpisodeId", "EpisodeResultT", "MaterializedTask",
    "TaskId", "TaskInputT", "is_materialized_task_row",
]
