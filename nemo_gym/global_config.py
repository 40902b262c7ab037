"""NeMo-Gym's `nemo_gym.global_config` names, re-exported from `gymfleet.config` (no code of its own)."""

from gymfleet.config import HEAD_SERVER_KEY_NAME, GlobalConfigDictParserConfig

__all__ = ["HEAD_SERVER_KEY_NAME", "GlobalConfigDictParserConfig"]
