"""NeMo-Gym's `nemo_gym.base_responses_api_agent`: the agent definitions (config, session contracts, the class agents
subclass), re-exported from gymfleet (`gymfleet.serving.nemo_gym_agent`; no code of its own). NeMo-Gym's agents
import and validate here; gymfleet does not serve them yet."""

from gymfleet.serving.nemo_gym_agent import (
    AGENT_SESSION_COOKIE_KEY,
    AgentCloseSessionRequest,
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSeedSessionResponse,
    AgentSessionSetupError,
    AgentSessionState,
    BaseResponsesAPIAgent,
    BaseResponsesAPIAgentConfig,
    Body,
    SimpleResponsesAPIAgent,
)

__all__ = [
    "AGENT_SESSION_COOKIE_KEY", "AgentCloseSessionRequest", "AgentCloseSessionResponse", "AgentSeedSessionRequest",
    "AgentSeedSessionResponse", "AgentSessionSetupError", "AgentSessionState", "BaseResponsesAPIAgent",
    "BaseResponsesAPIAgentConfig", "Body", "SimpleResponsesAPIAgent",
]
