"""NeMo-Gym's `nemo_gym.tool_access` (how an agent session reaches its tools), re-exported from gymfleet
(`gymfleet.serving.nemo_gym_agent`; no code of its own)."""

from gymfleet.serving.nemo_gym_agent import (
    DirectHTTPToolAccess,
    MCPStreamableHTTPConnection,
    MCPToolAccess,
    ToolAccess,
)

__all__ = ["DirectHTTPToolAccess", "MCPStreamableHTTPConnection", "MCPToolAccess", "ToolAccess"]
