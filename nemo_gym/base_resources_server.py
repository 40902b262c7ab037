"""NeMo-Gym's `nemo_gym.base_resources_server`: the base classes and verify contract environment folders import,
re-exported from gymfleet (`gymfleet.serving.nemo_gym_server`, `gymfleet.serving.nemo_gym_types`; no code of its
own)."""

from gymfleet.serving.nemo_gym_agent_tools import NEMO_GYM_MCP_METADATA_KEY
from gymfleet.serving.nemo_gym_mcp import (
    NEMO_GYM_MCP_SESSION_TOKEN_HEADER,
    RESERVED_MCP_TOOL_NAMES,
    normalize_tool_name,
)
from gymfleet.serving.nemo_gym_server import BaseResourcesServer, SimpleResourcesServer
from gymfleet.serving.nemo_gym_types import (
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseMultiRewardVerifyResponse,
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    MCPServerMetadata,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
    ResourcesVerifyRequest,
    ReverifyMode,
)

__all__ = [
    "AggregateMetrics", "AggregateMetricsRequest", "BaseMultiRewardVerifyResponse", "BaseResourcesServer",
    "BaseResourcesServerConfig", "BaseRunRequest", "BaseSeedSessionRequest", "BaseSeedSessionResponse",
    "BaseVerifyRequest", "BaseVerifyResponse", "MCPServerMetadata", "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER", "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming", "ResourcesCloseSessionRequest", "ResourcesCloseSessionResponse",
    "ResourcesSeedSessionRequest", "ResourcesSeedSessionResponse", "ResourcesVerifyRequest", "RESERVED_MCP_TOOL_NAMES",
    "ReverifyMode", "SimpleResourcesServer", "normalize_tool_name",
]
