"""NeMo-Gym's `nemo_gym.config_types`: gymfleet's server-config and server-reference types, and the NeMo-Gym
config/reference models environment folders import (no code of its own)."""

from gymfleet.errors import ConfigError, ServerRefError
from gymfleet.fleet.config_instances import BaseServerConfig
from gymfleet.serving.nemo_gym_rollout import ROLLOUT_PATH_PREFIX, TOKEN_CAPTURE_PATH_SEGMENT
from gymfleet.serving.nemo_gym_types import (
    AgentServerRef,
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseRunServerConfig,
    BaseRunServerInstanceConfig,
    Domain,
    ModelServerRef,
    ResourcesServerRef,
)
from gymfleet.serving.server import ServerConfig, ServerRef

__all__ = [
    "AgentServerRef", "AggregateMetrics", "AggregateMetricsRequest", "BaseRunServerConfig",
    "BaseRunServerInstanceConfig", "BaseServerConfig", "ConfigError", "Domain", "ModelServerRef",
    "ROLLOUT_PATH_PREFIX", "ResourcesServerRef", "ServerConfig", "ServerRef", "ServerRefError",
    "TOKEN_CAPTURE_PATH_SEGMENT",
]
