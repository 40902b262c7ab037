"""NeMo-Gym's `nemo_gym.server_utils` names NeMo-RL imports, re-exported from gymfleet (no code of its own)."""

from gymfleet.fleet.config_instances import HEAD_SERVER_KEY_NAME, BaseServerConfig

__all__ = ["HEAD_SERVER_KEY_NAME", "BaseServerConfig"]
