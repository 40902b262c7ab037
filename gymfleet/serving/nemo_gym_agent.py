"""NeMo-Gym 0.7.0's agent definitions (`nemo_gym.base_responses_api_agent`, `nemo_gym.tool_access`), so the modules
that define NeMo-Gym agents import: environment folders and their tests import those modules for their config and
request models (gdpval's stirrup_agent helpers, conversational_tool_use_simulation's
`ConversationalToolUseAgentRunRequest`, finance_agent_v2's `FinanceAgentConfig`, legal_agent_bench's
`HarborAgentConfig`).

What is here has 0.7.0's fields and validation: the agent-session contracts (`AgentSeedSessionRequest`/`Response`,
`AgentCloseSessionRequest`/`Response`, `AgentSessionState`, `AgentSessionSetupError`, `AGENT_SESSION_COOKIE_KEY`),
an agent's config (`BaseResponsesAPIAgentConfig`) and the tool-access descriptions (`ToolAccess`:
`DirectHTTPToolAccess`, `MCPToolAccess`). The class agents subclass, `SimpleResponsesAPIAgent`, and its serving are in
`gymfleet.serving.nemo_gym_agent_server`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Body  # noqa: F401  (NeMo-Gym re-exports it, see AGENT_NAMES)
from pydantic import AfterValidator, AnyHttpUrl, BaseModel, ConfigDict, Field

from gymfleet.serving.nemo_gym_observability import AgentObservationBundle
from gymfleet.serving.nemo_gym_server import BaseServer
from gymfleet.serving.nemo_gym_types import BaseRunServerInstanceConfig, EpisodeId, SandboxAccess, TaskId

AGENT_NAMES = [
    "AGENT_SESSION_COOKIE_KEY", "AgentCloseSessionRequest", "AgentCloseSessionResponse", "AgentSeedSessionRequest",
    "AgentSeedSessionResponse", "AgentSessionSetupError", "AgentSessionState", "BaseResponsesAPIAgent",
    "BaseResponsesAPIAgentConfig", "Body",
]
"""`nemo_gym.base_responses_api_agent`'s names."""
TOOL_ACCESS_NAMES = ["DirectHTTPToolAccess", "MCPStreamableHTTPConnection", "MCPToolAccess", "ToolAccess"]
"""`nemo_gym.tool_access`'s names."""
__all__ = [*AGENT_NAMES, *TOOL_ACCESS_NAMES]

AGENT_SESSION_COOKIE_KEY = "agent_session_id"
_TOOL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _Strict(BaseModel):
    """0.7.0's agent contracts refuse fields they do not declare."""

    model_config = ConfigDict(extra="forbid")


class _NamedAccess(_Strict):
    name: str = Field(min_length=1, pattern=_TOOL_NAME)
    required: bool


class DirectHTTPToolAccess(_NamedAccess):
    """Typed tool routes an agent calls directly."""

    kind: Literal["direct_http"] = "direct_http"
    base_url: AnyHttpUrl
    cookies: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)


class MCPStreamableHTTPConnection(_Strict):
    transport: Literal["streamable_http"] = "streamable_http"
    url: AnyHttpUrl
    headers: dict[str, str] = Field(default_factory=dict)


class MCPToolAccess(_NamedAccess):
    """A named MCP server an agent configures for a session."""

    kind: Literal["mcp"] = "mcp"
    connection: MCPStreamableHTTPConnection


ToolAccess = Annotated[DirectHTTPToolAccess | MCPToolAccess, Field(discriminator="kind")]


def _unique_names(what: str) -> AfterValidator:
    """Tool accesses whose names are unique (`what` says whose, in the error)."""

    def check(accesses: list[Any]) -> list[Any]:
        names = [access.name for access in accesses]
        if len(names) != len(set(names)):
            raise ValueError(f"{what} tool access names must be unique")
        return accesses

    return AfterValidator(check)


class AgentSeedSessionRequest(_Strict):
    """Start (idempotently) an agent session under the caller's id."""

    agent_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    tool_accesses: Annotated[list[ToolAccess], _unique_names("an agent session's")] = Field(default_factory=list)
    sandbox_access: SandboxAccess | None = None


class AgentSeedSessionResponse(_Strict):
    agent_session_id: str


class AgentCloseSessionRequest(_Strict):
    agent_session_id: str
    episode_id: EpisodeId


class AgentCloseSessionResponse(_Strict):
    agent_session_id: str
    agent_observations: AgentObservationBundle | None = None
    resources_cookies: dict[str, str] | None = None


class BaseResponsesAPIAgentConfig(BaseRunServerInstanceConfig):
    session_close_retry_window_seconds: float = Field(default=300, gt=0, allow_inf_nan=False)
    skip_verification: bool = False
    skip_verification_reward: float = 0.0
    token_id_capture: bool = False
    tool_accesses: Annotated[list[ToolAccess], _unique_names("configured")] = Field(default_factory=list)


class BaseResponsesAPIAgent(BaseServer):
    config: BaseResponsesAPIAgentConfig


@dataclass
class AgentSessionState:
    """An agent's state for one session, bound to the request that seeded it."""

    request: AgentSeedSessionRequest


class AgentSessionSetupError(Exception):
    """A session setup that failed part-way: keeps the partial state (for close) and the original error."""

    def __init__(self, state: AgentSessionState, *, error: BaseException) -> None:
        super().__init__(str(error))
        self.state = state
        self.error = error
