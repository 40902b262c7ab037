"""NeMo-Gym's `nemo_gym.server_utils` names, re-exported from gymfleet (no code of its own but the
module `__getattr__` that reads `_GLOBAL_AIOHTTP_CLIENT`): what NeMo-RL imports
(`HEAD_SERVER_KEY_NAME`, `BaseServerConfig`) and what environment folders import (`ServerClient`, `SESSION_ID_KEY`,
`get_response_json`, `raise_for_status`, `request`, the server base classes), and the global aiohttp client's
names (`_GLOBAL_AIOHTTP_CLIENT`, `set_global_aiohttp_client`, ...: `gymfleet.serving.nemo_gym_aiohttp`)."""

from gymfleet.fleet.config_instances import HEAD_SERVER_KEY_NAME, BaseServerConfig
from gymfleet.fleet.run_helper import get_global_config_dict
from gymfleet.serving.nemo_gym_aiohttp import (
    ClientDisconnectCancellationMiddleware,
    GlobalAIOHTTPAsyncClientConfig,
    get_global_aiohttp_client,
    global_aiohttp_client,
    global_aiohttp_client_exit,
    is_global_aiohttp_client_request_debug_enabled,
    is_global_aiohttp_client_setup,
    set_global_aiohttp_client,
)
from gymfleet.serving.nemo_gym_client import (
    MAX_NUM_TRIES,
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
    "BaseRunServerInstanceConfig", "BaseServer", "BaseServerConfig", "ClientDisconnectCancellationMiddleware",
    "GlobalAIOHTTPAsyncClientConfig", "HEAD_SERVER_KEY_NAME", "MAX_NUM_TRIES", "SESSION_ID_KEY", "ServerClient",
    "ServerStatus", "SimpleServer", "apply_rollout_prefix", "get_first_server_config_dict",
    "get_global_aiohttp_client", "get_global_config_dict", "get_response_json", "get_server_url",
    "global_aiohttp_client_exit", "is_global_aiohttp_client_request_debug_enabled", "is_global_aiohttp_client_setup",
    "is_nemo_gym_fastapi_entrypoint", "raise_for_status", "request", "rollout_path_prefix",
    "set_global_aiohttp_client",
]

def __getattr__(name: str):
    """`_GLOBAL_AIOHTTP_CLIENT`: the open global aiohttp session, as 0.7.0's module attribute."""
    if name == "_GLOBAL_AIOHTTP_CLIENT":
        return global_aiohttp_client()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
