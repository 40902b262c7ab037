"""NeMo-Gym's agent definitions on the `nemo_gym` surface (`nemo_gym.base_responses_api_agent`, `tool_access`, and
the `openai_utils` / `responses_converter` helpers agents use): environment folders' tests import NeMo-Gym's agent
modules for their config and request models (conversational_tool_use_simulation, gdpval's stirrup_agent helpers,
genrm_compare), so those modules must import and validate as under 0.7.0; and an agent is served with 0.7.0's routes
and agent-session lifecycle (`gymfleet.serving.nemo_gym_agent_server`)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from typing import ClassVar

import httpx
import pytest
from fastapi import Body, Request
from pydantic import ValidationError

from gymfleet.testing import serve
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
from nemo_gym.server_utils import ServerClient
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


BODY = Body()


class _SessionAgent(SimpleResponsesAPIAgent):
    """An agent of the kind NeMo-Gym's are: sessions seeded, activated through `/v1/responses`, closed."""

    config: BaseResponsesAPIAgentConfig
    closed: ClassVar[list[str]] = []

    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        state = AgentSessionState(request=body)
        if body.task_id.task_id == "bad":
            raise AgentSessionSetupError(state, error=RuntimeError("setup failed half-way"))
        return state

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        self.closed.append(state.request.agent_session_id)
        return AgentCloseSessionResponse(agent_session_id=state.request.agent_session_id,
                                         resources_cookies={"closes": str(len(self.closed))})

    async def responses(self, request: Request, body: dict = BODY) -> dict:
        session_id = self._agent_session_id_from_request(request)
        if session_id is not None:
            self._require_agent_session(session_id)
        return {"session": session_id, "path": self.url_path_for_request("/v1/responses", request)}

    async def run(self, body: dict = BODY) -> dict:
        return {"reward": 1.0}


def test_a_nemo_gym_agent_serves_0_7_0s_session_lifecycle_over_http():
    config = BaseResponsesAPIAgentConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="agent")
    agent = _SessionAgent(config=config, server_client=ServerClient.model_construct(global_config_dict={}))
    close = {"agent_session_id": "s1", "episode_id": {"rollout_id": "r1"}}
    with serve(agent.setup_webserver()) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/v1/responses", json={}).json() == {"session": None, "path": "/v1/responses"}
        assert client.post("/ng-rollout/r7/v1/responses", json={}).json()["path"] == "/ng-rollout/r7/v1/responses"
        assert client.post("/run", json={"responses_create_params": {"input": "hi"}}).json() == {"reward": 1.0}
        assert client.post("/v1/agent_sessions", json=SEED).json() == {"agent_session_id": "s1"}
        assert "_SessionAgent___agent" in client.cookies, "NeMo-Gym's cookie name binds the session"
        assert client.post("/v1/responses", json={}).json()["session"] == "s1"
        assert client.post("/v1/agent_sessions", json=SEED).status_code == 200, "the same seed again"
        mismatch = client.post("/v1/agent_sessions", json={**SEED, "agent_session_id": "s2"})
        assert mismatch.status_code == 409 and "does not match the session cookie" in mismatch.text
        closed = client.post("/v1/agent_sessions/close", json=close)
        assert closed.json()["resources_cookies"] == {"closes": "1"}
        assert client.post("/v1/agent_sessions/close", json=close).json() == closed.json(), "kept, not closed twice"
        assert client.post("/v1/responses", json={}).status_code == 409, "a closed session is never activated"
        wrong_episode = client.post("/v1/agent_sessions/close", json={**close, "episode_id": {"rollout_id": "r2"}})
        assert wrong_episode.status_code == 409
    assert _SessionAgent.closed == ["s1"]
    bad = {**SEED, "agent_session_id": "s3", "task_id": {"taskset": "ts", "task_id": "bad"}}
    with serve(agent.setup_webserver()) as url, httpx.Client(base_url=url, timeout=30) as client:
        failed = client.post("/v1/agent_sessions", json=bad)
        assert failed.status_code == 500 and "setup failed half-way" in failed.text
        assert client.post("/v1/agent_sessions", json=bad).status_code == 409, "its partial state awaits its close"
        assert client.post("/v1/agent_sessions/close", json={**close, "agent_session_id": "s3"}).status_code == 200
    assert _SessionAgent.closed == ["s1", "s3"], "a failed setup's partial state is closed, never activated"


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
