"""NeMo-Gym's `nemo_gym.cli` library surface, re-exported from gymfleet (no code of its own)."""

from gymfleet.fleet.config import GlobalConfigDictParserConfig
from gymfleet.fleet.run_helper import RunHelper

__all__ = ["GlobalConfigDictParserConfig", "RunHelper"]
