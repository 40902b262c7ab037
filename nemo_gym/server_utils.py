"""NeMo-Gym's `nemo_gym.server_utils` names, re-exported from gymfleet (no code of its own): what NeMo-RL imports
(`HEAD_SERVER_KEY_NAME`, `BaseServerConfig`) and what environment folders import (`ServerClient`, `SESSION_ID_KEY`,
`get_response_json`, `raise_for_status`, `request`, the server base classes)."""

from gymfleet.fleet.config_instances import HEAD_SERVER_KEY_NAME, BaseServerConfig
from gymfleet.serving.nemo_gym_client import (
    SESSION_ID_KEY,
    ServerClient,
    ServerStatus,
    get_first_server_config_dict,
    get_response_json,
    get_server_url,
    is_nemo_gym_fastapi_entrypoint,
    raise_for_status,
    request,
)
from gymfleet.serving.nemo_gym_rollout import apply_rollout_prefix, rollout_path_prefix
from gymfleet.serving.nemo_gym_server import BaseServer, SimpleServer
from gymfleet.serving.nemo_gym_types import BaseRunServerInstanceConfig

__all__ = [
    "HEAD_SERVER_KEY_NAME", "SESSION_ID_KEY", "BaseRunServerInstanceConfig", "BaseServer", "BaseServerConfig",
    "ServerClient", "ServerStatus", "SimpleServer", "apply_rollout_prefix", "get_first_server_config_dict",
    "get_response_json", "get_server_url", "is_nemo_gym_fastapi_entrypoint", "raise_for_status", "request",
    "rollout_path_prefix",
]
