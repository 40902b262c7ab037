"""NeMo-Gym's `nemo_gym.config_types`: gymfleet's server-config and server-reference types (no code of its own)."""

from gymfleet.errors import ConfigError, ServerRefError
from gymfleet.fleet.config_instances import BaseServerConfig
from gymfleet.serving.server import ServerConfig, ServerRef

__all__ = ["BaseServerConfig", "ConfigError", "ServerConfig", "ServerRef", "ServerRefError"]
