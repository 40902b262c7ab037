"""NeMo-Gym's `nemo_gym.mcp_auto_exposure` (a resources server's tool routes served over MCP at `/mcp`), re-exported
from gymfleet (`gymfleet.serving.nemo_gym_mcp`; no code of its own). Needs the `mcp` extra only where a server opts
in."""

from gymfleet.serving.nemo_gym_mcp import (
    MCP_URL_PATH,
    NEMO_GYM_MCP_SESSION_TOKEN_HEADER,
    PERMISSIVE_SCHEMA,
    RESERVED_MCP_TOOL_NAMES,
    TOKEN_HEADER,
    MCPServerMetadata,
    MCPTool,
    harvest_tools,
    install_auto_exposure,
    maybe_auto_expose,
)

__all__ = [
    "MCP_URL_PATH", "NEMO_GYM_MCP_SESSION_TOKEN_HEADER", "PERMISSIVE_SCHEMA", "RESERVED_MCP_TOOL_NAMES",
    "TOKEN_HEADER", "MCPServerMetadata", "MCPTool", "harvest_tools", "install_auto_exposure", "maybe_auto_expose",
]
