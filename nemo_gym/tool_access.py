"""NeMo-Gym's `nemo_gym.tool_access` (how an agent session reaches its tools), re-exported from gymfleet
(`gymfleet.serving.nemo_gym_agent`, whose `TOOL_ACCESS_NAMES` are this module's; no code of its own)."""

from gymfleet.serving import nemo_gym_agent
from gymfleet.serving.nemo_gym_agent import *  # noqa: F403  (nemo_gym_agent.__all__: these and the agent types)

__all__ = nemo_gym_agent.TOOL_ACCESS_NAMES
