"""NeMo-Gym's `nemo_gym.global_config` names, re-exported from gymfleet (no code of its own)."""

from gymfleet.fleet.config import GlobalConfigDictParserConfig
from gymfleet.fleet.config_instances import HEAD_SERVER_KEY_NAME
from gymfleet.fleet.run_helper import get_global_config_dict

__all__ = ["HEAD_SERVER_KEY_NAME", "GlobalConfigDictParserConfig", "get_global_config_dict"]
