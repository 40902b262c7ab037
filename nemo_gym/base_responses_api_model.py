"""NeMo-Gym's `nemo_gym.base_responses_api_model`: the model-server base its model folders subclass, re-exported from
gymfleet (`gymfleet.serving.nemo_gym_model`, whose `__all__` is this module's; no code of its own). NeMo-Gym's model
folders import and build their app here; `ng_run` serves gymfleet's own model servers."""

from gymfleet.serving import nemo_gym_model
from gymfleet.serving.nemo_gym_model import *  # noqa: F403  (nemo_gym_model.__all__)

__all__ = nemo_gym_model.__all__
