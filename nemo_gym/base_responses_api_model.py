"""NeMo-Gym's `nemo_gym.base_responses_api_model`: the model-server base its model folders subclass, re-exported from
gymfleet (`gymfleet.serving.nemo_gym_model`; no code of its own). NeMo-Gym's model folders import and build their
app here; `ng_run` serves gymfleet's own model servers."""

from gymfleet.serving.nemo_gym_model import (
    BaseResponsesAPIModel,
    BaseResponsesAPIModelConfig,
    Body,
    ModelCallCaptureConfig,
    NonGeneratingRequest,
    SimpleResponsesAPIModel,
    observability_enabled_from_config,
)

__all__ = [
    "BaseResponsesAPIModel", "BaseResponsesAPIModelConfig", "Body", "ModelCallCaptureConfig", "NonGeneratingRequest",
    "SimpleResponsesAPIModel", "observability_enabled_from_config",
]
