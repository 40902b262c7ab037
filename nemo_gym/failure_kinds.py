"""NeMo-Gym's `nemo_gym.failure_kinds` vocabulary, re-exported from gymfleet (`gymfleet.serving.nemo_gym_failures`,
whose `__all__` is this module's; no code of its own)."""

from gymfleet.serving import nemo_gym_failures
from gymfleet.serving.nemo_gym_failures import *  # noqa: F403  (nemo_gym_failures.__all__)

__all__ = nemo_gym_failures.__all__
