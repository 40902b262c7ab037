"""simple_agent over real HTTP: scripted model ⇄ a stateful tool environment, cookies carried end to end."""

from __future__ import annotations

import contextlib
from collections import defaultdict

import httpx
import pytest
from pydantic import BaseModel

from agents.simple_agent.app import SimpleAgent
from gymfleet.serving.resources import ResourcesServer, SeedSessionRequest, VerifyRequest, VerifyResponse
from gymfleet.serving.sessions import session_id
from gymfleet.testing import free_port, serve
from responses_api_models.scripted_model.app import ScriptedModel

RULES = [
    {"match": "(?i)forever", "match_in": "transcript",
     "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]},
    {"match": "(?i)temperature", "match_in": "last_message", "text": "It is 21 degrees and sunny in Paris."},
    {"match": "(?i)error", "match_in": "last_message", "text": "The tool failed."},
    {"match": "(?i)weather", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"match": "(?i)broken arguments", "tool_calls": [{"name": "get_weather", "arguments": "{city: Paris"}]},
    {"match": "(?i)secret tool", "tool_calls": [{"name": "verify", "arguments": {}}]},
]


class WeatherArgs(BaseModel):
    city: str


class WeatherServer(ResourcesServer):
    """Counts get_weather calls per session; reward 1 if the tool was used in this session and Paris answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: dict[str, list[str]] = defaultdict(list)
        self.seeded: set[str] = set()

    async def seed_session(self, body: SeedSessionRequest) -> dict:
        self.seeded.add(session_id())
        return {}

    async def get_weather(self, body: WeatherArgs) -> dict:
        assert session_id() in self.seeded, "tool call arrived without the seeded session cookie"
        self.calls[session_id()].append(body.city)
        return {"city": body.city, "temperature_c": 21}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        used = self.calls.pop(session_id(), [])
        reward = float(bool(used) and "Paris" in body.response.output_text)
        return VerifyResponse.echo(body, reward=reward, tool_calls_seen=len(used))


TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def _row(text: str) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}], "tools": TOOLS},
            "task_id": "t1"}


@contextlib.contextmanager
def _fleet(max_steps=None, model_port=None, **agent_fields):
    env = WeatherServer({"name": "weather", "domain": "agent"})
    model = ScriptedModel({"name": "llm", "rules": RULES})
    with serve(env.create_app()) as env_url, serve(model.create_app()) as model_url:
        def block(kind, impl, url):
            return {kind: {impl: {"host": "127.0.0.1", "port": int(url.rsplit(":", 1)[1])}}}

        config = {"weather": block("resources_servers", "weather", env_url),
                  "llm": block("responses_api_models", "scripted_model", model_url)}
        if model_port is not None:
            config["llm"] = block("responses_api_models", "scripted_model", f"http://x:{model_port}")
        agent = SimpleAgent({"name": "agent", "resources_server": {"type": "resources_servers", "name": "weather"},
                             "model_server": "llm", "max_steps": max_steps, "model_timeout_s": 10, **agent_fields},
                            config)
        with serve(agent.create_app()) as agent_url:
            yield agent_url, env


@pytest.fixture(scope="module")
def fleet():
    with _fleet() as running:
        yield running


def test_tool_loop_carries_session_cookies_and_verifies(fleet):
    url, env = fleet
    result = httpx.post(f"{url}/run", json=_row("What is the weather in Paris?"), timeout=30).json()
    assert result["reward"] == 1.0 and result["tool_calls_seen"] == 1
    assert result["task_id"] == "t1", "row fields reach verify and come back"
    kinds = [item["type"] for item in result["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert '"temperature_c":21' in result["response"]["output"][1]["output"]
    assert result["response"]["usage"]["total_tokens"] > 0
    assert not env.calls, "verify cleaned up the session state"


def test_plain_answer_stops_after_one_model_call(fleet):
    url, _ = fleet
    result = httpx.post(f"{url}/run", json=_row("Tell me a joke"), timeout=30).json()
    assert [item["type"] for item in result["response"]["output"]] == ["message"]
    assert result["reward"] == 0.0


def test_bad_tool_arguments_are_fed_back_to_the_model(fleet):
    url, _ = fleet
    result = httpx.post(f"{url}/run", json=_row("use broken arguments"), timeout=30).json()
    output = result["response"]["output"]
    assert output[1]["type"] == "function_call_output"
    assert "Invalid tool call arguments" in output[1]["output"]
    assert output[-1]["content"][0]["text"] == "The tool failed."


def test_tools_the_row_did_not_offer_are_refused(fleet):
    url, _ = fleet
    result = httpx.post(f"{url}/run", json=_row("call the secret tool"), timeout=30).json()
    assert "unknown tool 'verify'" in result["response"]["output"][1]["output"]


def test_max_steps_bounds_a_model_that_never_stops():
    with _fleet(max_steps=3) as (url, _):
        result = httpx.post(f"{url}/run", json=_row("loop forever"), timeout=30).json()
    calls = [item for item in result["response"]["output"] if item["type"] == "function_call"]
    assert len(calls) == 3


def test_model_server_down_is_a_typed_502_not_a_hang():
    # Nothing will ever listen there: ride over a restart for 1 s, not the default 10 (`restart_ride_s`).
    with _fleet(model_port=free_port(), restart_ride_s=1) as (url, _):
        answer = httpx.post(f"{url}/run", json=_row("weather?"), timeout=60)
    assert answer.status_code == 502
    assert answer.json()["error_type"] == "connection_error"


def test_malformed_run_body_is_422(fleet):
    url, _ = fleet
    answer = httpx.post(f"{url}/run", json={"responses_create_params": {"input": 3}}, timeout=10)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][:3] == ["body", "responses_create_params", "input"]


def test_v1_responses_runs_an_episode_without_verify(fleet):
    url, _ = fleet
    params = _row("What is the weather?")["responses_create_params"]
    response = httpx.post(f"{url}/v1/responses", json=params, timeout=30).json()
    assert [item["type"] for item in response["output"]] == ["function_call", "function_call_output", "message"]
