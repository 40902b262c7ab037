"""NeMo-Gym's `nemo_gym.global_config` names, re-exported from gymfleet (no code of its own)."""

from gymfleet.fleet.config import GlobalConfigDictParserConfig
from gymfleet.fleet.config_instances import HEAD_SERVER_KEY_NAME
from gymfleet.fleet.run_helper import GlobalConfigDictParser, get_global_config_dict, maybe_get_global_config_dict
from gymfleet.serving.nemo_gym_agent_server import OBSERVABILITY_ENABLED_KEY_NAME, TOKEN_ID_CAPTURE_BLOCK
from gymfleet.serving.nemo_gym_client import get_first_server_config_dict
from gymfleet.serving.nemo_gym_rollout import ROLLOUT_ID_KEY_NAME
from gymfleet.serving.nemo_gym_types import (
    AGENT_REF_KEY_NAME,
    ATTEMPT_INDEX_KEY_NAME,
    CACHE_DIR_KEY_NAME,
    ROLLOUT_INDEX_KEY_NAME,
    SKILLS_REF_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    TASK_SOURCE_KEY_NAME,
)

__all__ = [
    "AGENT_REF_KEY_NAME", "ATTEMPT_INDEX_KEY_NAME", "CACHE_DIR_KEY_NAME", "GlobalConfigDictParser",
    "GlobalConfigDictParserConfig", "HEAD_SERVER_KEY_NAME", "OBSERVABILITY_ENABLED_KEY_NAME", "ROLLOUT_ID_KEY_NAME",
    "ROLLOUT_INDEX_KEY_NAME", "SKILLS_REF_KEY_NAME", "TASK_INDEX_KEY_NAME", "TASK_SOURCE_KEY_NAME",
    "TOKEN_ID_CAPTURE_BLOCK", "get_first_server_config_dict", "get_global_config_dict",
    "maybe_get_global_config_dict",
]
