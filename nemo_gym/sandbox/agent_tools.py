"""NeMo-Gym's `nemo_gym.sandbox.agent_tools`: fleet endpoints, MCP seeding and verification for sandboxed agents,
re-exported from gymfleet (`gymfleet.serving.nemo_gym_agent_tools`; no code of its own)."""

from gymfleet.serving.nemo_gym_agent_tools import (
    restricted_network_policy,
    sandbox_server_url,
    seed_mcp_servers,
    verify_agent_response,
)

__all__ = ["restricted_network_policy", "sandbox_server_url", "seed_mcp_servers", "verify_agent_response"]
