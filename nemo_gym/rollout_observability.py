"""NeMo-Gym's `nemo_gym.rollout_observability` (an agent harness's typed observations of a rollout), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_observability`, whose `__all__` is this module's; no code of its own)."""

from gymfleet.serving import nemo_gym_observability
from gymfleet.serving.nemo_gym_observability import *  # noqa: F403  (nemo_gym_observability.__all__)

__all__ = nemo_gym_observability.__all__
