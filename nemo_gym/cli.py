"""NeMo-Gym's `nemo_gym.cli` library surface, re-exported from gymfleet (no code of its own)."""

from gymfleet.config import GlobalConfigDictParserConfig
from gymfleet.run_helper import RunHelper

__all__ = ["GlobalConfigDictParserConfig", "RunHelper"]
