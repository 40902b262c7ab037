"""NeMo-Gym's `nemo_gym.config_types`: gymfleet's server-config and server-reference types (no code of its own)."""

from gymfleet.fleet.config import BaseServerConfig
from gymfleet.errors import ConfigError, ServerRefError
from gymfleet.serving.server import ServerConfig, ServerRef

__all__ = ["BaseServerConfig", "ConfigError", "ServerConfig", "ServerRef", "ServerRefError"]
