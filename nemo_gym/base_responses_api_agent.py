"""NeMo-Gym's `nemo_gym.base_responses_api_agent`: the agent definitions (config, session contracts, the class agents
subclass), re-exported from gymfleet (`gymfleet.serving.nemo_gym_agent`, whose `AGENT_NAMES` are this module's, and
`gymfleet.serving.nemo_gym_agent_server`; no code of its own). NeMo-Gym's agents import, validate and are served
here."""

from gymfleet.serving import nemo_gym_agent
from gymfleet.serving.nemo_gym_agent import *  # noqa: F403  (nemo_gym_agent.__all__: these and the tool access types)
from gymfleet.serving.nemo_gym_agent_server import SimpleResponsesAPIAgent

__all__ = [*nemo_gym_agent.AGENT_NAMES, "SimpleResponsesAPIAgent"]
