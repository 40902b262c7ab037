"""NeMo-Gym's `nemo_gym.task_materialization` (a flat dataset row as an Environment Server task), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_episodes`; no code of its own)."""

from gymfleet.serving.nemo_gym_episodes import materialize_task

__all__ = ["materialize_task"]
