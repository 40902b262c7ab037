"""NeMo-Gym's agent definitions on the `nemo_gym` surface (`nemo_gym.base_responses_api_agent`, `tool_access`, and
the `openai_utils` / `responses_converter` helpers agents use): environment folders' tests import NeMo-Gym's agent
modules for their config and request models (conversational_tool_use_simulation, gdpval's stirrup_agent helpers,
genrm_compare), so those modules must import and validate as under 0.7.0; serving one is refused in one line."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from nemo_gym.base_responses_api_agent import (
    AGENT_SESSION_COOKIE_KEY,
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSessionSetupError,
    AgentSessionState,
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
)
from nemo_gym.openai_utils import (
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseUsage,
    accumulate_response_usage,
)
from nemo_gym.responses_converter import split_responses_input_output_items
from nemo_gym.tool_access import DirectHTTPToolAccess, MCPToolAccess

SEED = {"agent_session_id": "s1", "episode_id": {"rollout_id": "r1"}, "task_id": {"taskset": "ts", "task_id": "t1"}}


def test_agent_contracts_validate_as_0_7_0s():
    direct = {"kind": "direct_http", "name": "tools", "required": True, "base_url": "http://127.0.0.1:1"}
    mcp = {"kind": "mcp", "name": "search", "required": False, "connection": {"url": "http://127.0.0.1:2/mcp"}}
    request = AgentSeedSessionRequest.model_validate({**SEED, "tool_accesses": [direct, mcp]})
    assert [type(a) for a in request.tool_accesses] == [DirectHTTPToolAccess, MCPToolAccess]
    for bad in ({**SEED, "tool_accesses": [direct, direct]}, {**SEED, "agent_session_id": ""},
                {**SEED, "surprise": 1}, {**SEED, "tool_accesses": [{**direct, "name": "-x"}]}):
        with pytest.raises(ValidationError):
            AgentSeedSessionRequest.model_validate(bad)
    config = BaseResponsesAPIAgentConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="agent")
    assert (config.session_close_retry_window_seconds, config.skip_verification, config.token_id_capture) == (
        300, False, False)
    with pytest.raises(ValidationError, match="session_close_retry_window_seconds"):
        BaseResponsesAPIAgentConfig(host="h", port=1, entrypoint="app.py", name="a",
                                    session_close_retry_window_seconds=0)
    assert AgentCloseSessionResponse(agent_session_id="s1").agent_observations is None
    state = AgentSessionState(request=request)
    error = AgentSessionSetupError(state, error=RuntimeError("boom"))
    assert (str(error), error.state, AGENT_SESSION_COOKIE_KEY) == ("boom", state, "agent_session_id")


def test_a_nemo_gym_agent_is_defined_here_and_refused_when_served():
    class Agent(SimpleResponsesAPIAgent):
        config: BaseResponsesAPIAgentConfig

    agent = Agent.model_construct(config=BaseResponsesAPIAgentConfig(host="h", port=1, entrypoint="app.py",
                                                                     name="a"), server_client=None)
    with pytest.raises(NotImplementedError, match="NeMo-Gym's own agents are not served by gymfleet yet"):
        agent.setup_webserver()


def _usage(rng: random.Random) -> NeMoGymResponseUsage:
    maybe = lambda: rng.choice([None, rng.randrange(50)])  # noqa: E731
    tokens = [rng.randrange(100) for _ in range(2)]
    return NeMoGymResponseUsage(input_tokens=tokens[0], output_tokens=tokens[1], total_tokens=sum(tokens),
                                input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=maybe()),
                                output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=maybe()))


@pytest.mark.parametrize("seed", range(20))
def test_usage_adds_up_and_an_unknown_detail_stays_unknown(seed):
    rng = random.Random(seed)
    usages = [_usage(rng) for _ in range(rng.randrange(1, 5))]
    total = NeMoGymResponseUsage.sum_from_list(usages)
    assert total.input_tokens == sum(u.input_tokens for u in usages)
    assert total.total_tokens == sum(u.total_tokens for u in usages)
    cached = [u.input_tokens_details.cached_tokens for u in usages]
    assert total.input_tokens_details.cached_tokens == (None if None in cached else sum(cached))
    reasoning = [u.output_tokens_details.reasoning_tokens for u in usages]
    assert total.output_tokens_details.reasoning_tokens == (None if None in reasoning else sum(reasoning))
    assert accumulate_response_usage(None, usages[0]) == usages[0] and accumulate_response_usage(usages[0], None) is (
        usages[0])
    assert accumulate_response_usage(None, usages[0]) is not usages[0]  # a copy: the caller's is never changed


INPUT_ITEMS = [{"type": "message", "role": "user", "content": "q"}, {"type": "function_call_output", "output": "x"},
               {"type": "message", "role": "system", "content": "s"}]
OUTPUT_OPENERS = [{"type": "message", "role": "assistant", "content": "a"}, {"type": "function_call", "name": "f"},
                  {"type": "reasoning", "summary": []}, {"type": "mcp_call"}, {"type": "web_search_call"}]


@pytest.mark.parametrize("seed", range(20))
def test_a_turn_splits_before_the_first_item_the_model_produced(seed):
    rng = random.Random(seed)
    given = [rng.choice(INPUT_ITEMS) for _ in range(rng.randrange(4))]
    produced = [rng.choice(OUTPUT_OPENERS)] + [rng.choice(INPUT_ITEMS + OUTPUT_OPENERS) for _ in range(3)]
    assert split_responses_input_output_items(given + produced) == (given, produced)
    assert split_responses_input_output_items(given) == (given, [])
    assert split_responses_input_output_items([]) == ([], [])


def test_nemo_gym_agent_modules_of_the_wheel_import_on_the_surface(tmp_path):
    """The wheel's own agents that folders' tests import (simple_agent: genrm_compare; the conversational simulation
    agent: conversational_tool_use_simulation; stirrup_agent's helpers: gdpval), imported from the wheel's tree as a
    folder's process imports (`enter_tree`), in a fresh interpreter."""
    from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder

    folder = nemo_gym_folder("conversational_tool_use_simulation")
    script = textwrap.dedent(f"""
        import importlib
        import gymfleet.serving.nemo_gym_server
        from gymfleet.fleet.folders import enter_tree
        enter_tree({str(folder)!r})
        for name in ("responses_api_agents.simple_agent.app", "responses_api_agents.stirrup_agent.file_reader",
                     "responses_api_agents.conversational_tool_use.simulation.app"):
            importlib.import_module(name)
        from responses_api_agents.simple_agent.app import SimpleAgentConfig
        print(sorted(SimpleAgentConfig.model_fields)[:3])
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
