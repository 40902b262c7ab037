"""NeMo-Gym's `nemo_gym.task_data` (a folder's `TaskData` schema and the row checks against it), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_task_data`, whose `__all__` is this module's; no code of its own)."""

from gymfleet.serving import nemo_gym_task_data
from gymfleet.serving.nemo_gym_task_data import *  # noqa: F403  (nemo_gym_task_data.__all__)

__all__ = nemo_gym_task_data.__all__
