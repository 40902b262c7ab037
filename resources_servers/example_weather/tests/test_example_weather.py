"""example_weather over real HTTP: seed a session, call the tool as the agent would, verify the final answer."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, serve
from resources_servers.example_weather import app
from resources_servers.example_weather.app import ExampleWeatherServer, score

ROW = json.loads((Path(__file__).parents[1] / "data/example.jsonl").read_text().splitlines()[0])  # Paris


@pytest.fixture(scope="module")
def url():
    server = ExampleWeatherServer({"name": "example_weather", "domain": "agent"})
    with serve(server.create_app()) as base:
        yield base


def rollout(url: str, calls: list[dict], answer: str, row: dict = ROW) -> tuple[dict, list[dict]]:
    """One rollout as simple_agent runs it: seed, tool calls (cookie carried by the jar), verify."""
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/seed_session", json=row).status_code == 200
        outputs = []
        for arguments in calls:
            answered = client.post("/get_weather", json=arguments)
            assert answered.status_code == 200, "tool errors are the model's to read, never an HTTP error"
            outputs.append(answered.json())
        verified = client.post("/verify", json={**row, "response": make_response(answer)})
        assert verified.status_code == 200
        return verified.json(), outputs


@pytest.mark.parametrize(
    "calls, answer, reward, made",
    [
        pytest.param([{"city": "Paris"}], "It is sunny in Paris, 24 °C.", 1.0, 1, id="called-and-answered-right"),
        pytest.param([], "It is sunny in Paris.", 0.0, 0, id="answered-without-calling"),
        pytest.param([{"city": "London"}], "It is sunny in Paris.", 0.0, 1, id="called-for-the-wrong-city"),
        pytest.param([{"town": "Paris"}], "It is sunny in Paris.", 0.0, 0, id="bad-arguments"),
        pytest.param([{"city": 7}], "It is sunny in Paris.", 0.0, 0, id="city-not-a-string"),
        pytest.param([{"city": "Paris"}], "", 0.0, 1, id="empty-answer"),
        pytest.param([{"city": "Paris"}], "It is rainy in Paris.", 0.0, 1, id="wrong-condition"),
        pytest.param([{"city": "Atlantis"}, {"city": " PARIS "}], "Sunny!", 1.0, 2, id="retried-after-unknown-city"),
    ],
)
def test_outcomes(url, calls, answer, reward, made):
    result, _ = rollout(url, calls, answer)
    assert (result["reward"], result["tool_calls_made"]) == (reward, made)
    assert (result["reason"] is None) == (reward == 1.0)
    assert result["expected_city"] == "Paris" and result["uuid"] == ROW["uuid"], "row echoed"


def test_tool_answers_forecasts_and_readable_errors(url):
    _, outputs = rollout(url, [{"city": "Oslo"}, {"city": "Atlantis"}, {"town": "Oslo"}], "")
    assert outputs[0] == {"city": "Oslo", "condition": "snowy", "temperature_c": -3}
    assert "no forecast for 'Atlantis'" in outputs[1]["error"] and "Paris" in outputs[1]["error"]
    assert "invalid arguments for tool 'get_weather'" in outputs[2]["error"]


def test_sessions_are_separate_and_verify_is_repeatable(url):
    with httpx.Client(base_url=url, timeout=30) as first, httpx.Client(base_url=url, timeout=30) as second:
        for client in (first, second):
            client.post("/seed_session", json=ROW)
        first.post("/get_weather", json={"city": "Paris"})
        body = {**ROW, "response": make_response("Sunny.")}
        assert second.post("/verify", json=body).json()["tool_calls_made"] == 0
        assert first.post("/verify", json=body).json()["reward"] == 1.0
        assert first.post("/verify", json=body).json()["reward"] == 1.0, "verifying again scores the same record"


def test_a_session_evicted_past_the_cap_is_session_lost_never_a_reward_on_no_calls(monkeypatch):
    monkeypatch.setattr(app, "MAX_SESSIONS", 5)
    server = ExampleWeatherServer({"name": "example_weather", "domain": "agent"})
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=30) as victim:
        victim.post("/seed_session", json=ROW)
        victim.post("/get_weather", json={"city": "Paris"})
        for _ in range(app.MAX_SESSIONS):  # a flood of other rollouts' seeds pushes the victim's session out
            assert httpx.post(url + "/seed_session", json=ROW, timeout=30).status_code == 200
        answer = victim.post("/verify", json={**ROW, "response": make_response("Sunny.")})
    assert answer.status_code == 410 and answer.json()["error_type"] == "session_lost", answer.text
    assert "evicted" in answer.json()["detail"]


@pytest.mark.parametrize(
    "asked, answer, expected, reward",
    [
        (["san francisco"], "Foggy, as usual.", "San Francisco", 1.0),
        (["paris"], "It is sunnyish.", "Paris", 0.0),  # the condition must be a whole word
        (["atlantis"], "Sunny.", "Atlantis", 0.0),  # not in the table: no reward can be earned
        (["paris", "london"], "Sunny in Paris, rainy in London.", "Paris", 0.0),  # names another condition
        (["paris", "london", "oslo"], "It is sunny or rainy or snowy.", "Paris", 0.0),  # a hedge over conditions
        (["paris", "london"], "Paris is sunny (London, 14 °C, is not).", "Paris", 1.0),  # other cities are fine
    ],
)
def test_score(asked, answer, expected, reward):
    assert score(asked, answer, expected)[0] == reward
