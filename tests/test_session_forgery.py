"""Session cookies cannot be forged: the signing key comes from the fleet's random token, never from the cookie's
public name (NeMo-Gym's key). Every way an outsider could sign a cookie holding another rollout's session id is
tried; each gets a fresh session, and the victim's rollout is scored on its own calls only."""

from __future__ import annotations

import base64
import json

import httpx
import itsdangerous
import pytest

from gymfleet import auth
from gymfleet.serving.sessions import session_key
from gymfleet.testing import make_response, serve
from resources_servers.example_weather.app import ExampleWeatherServer

ROW = {"responses_create_params": {"input": "Weather in Paris?"}, "expected_city": "Paris"}
NAME = "ExampleWeatherServer___example_weather"
FLEET = "fleet-a-token"


def _forge(key: str, session: str) -> str:
    return itsdangerous.TimestampSigner(key).sign(base64.b64encode(json.dumps({"session_id": session}).encode())
                                                  ).decode()


def _session_of(cookie: str) -> str:
    payload = cookie.rsplit(".", 2)[0]
    return json.loads(base64.b64decode(payload))["session_id"]


KEYS = {
    "the cookie name (NeMo-Gym's key)": NAME,
    "the instance name": "example_weather",
    "the class name": "ExampleWeatherServer",
    "empty": "",
    "another fleet's key": None,  # filled in below: same instance, other fleet token
    "the fleet token itself": FLEET,
}


@pytest.fixture(scope="module")
def fleet_server():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(auth.FLEET_TOKEN_ENV, FLEET)
        patch.setenv(auth.AUTH_OFF_ENV, "1")  # this test is about cookies, not the token check
        app = ExampleWeatherServer({"name": "example_weather", "domain": "agent"}).create_app()
    with serve(app) as url:
        yield url


@pytest.mark.parametrize("how", sorted(KEYS))
def test_a_forged_cookie_is_a_fresh_session_never_the_victims(fleet_server, how, monkeypatch):
    url = fleet_server
    with httpx.Client(base_url=url, timeout=30) as victim:
        assert victim.post("/seed_session", json=ROW).status_code == 200
        victim_session = _session_of(victim.cookies[NAME])
        assert victim.post("/get_weather", json={"city": "Paris"}).status_code == 200

        if KEYS[how] is None:
            monkeypatch.setenv(auth.FLEET_TOKEN_ENV, "fleet-b-token")
            key = session_key(NAME)
            monkeypatch.setenv(auth.FLEET_TOKEN_ENV, FLEET)
        else:
            key = KEYS[how]
        forged = {"Cookie": f"{NAME}={_forge(key, victim_session)}"}
        attack = httpx.post(url + "/get_weather", json={"city": "London"}, headers=forged)  # spoil the victim's record
        assert attack.status_code == 200
        assert _session_of(attack.cookies[NAME]) != victim_session, "the forged cookie got the victim's session"
        stolen = httpx.post(url + "/verify", json={**ROW, "response": make_response("Sunny.")}, headers=forged)
        assert stolen.status_code == 410, "verify on the forged cookie must not consume the victim's session"

        result = victim.post("/verify", json={**ROW, "response": make_response("Sunny in Paris.")})
    assert result.status_code == 200 and result.json()["reward"] == 1.0 and result.json()["tool_calls_made"] == 1


def test_replicas_and_restarts_of_one_instance_in_one_fleet_share_the_key_and_fleets_do_not(monkeypatch):
    monkeypatch.setenv(auth.FLEET_TOKEN_ENV, FLEET)
    first, again = session_key(NAME), session_key(NAME)
    monkeypatch.setenv(auth.FLEET_TOKEN_ENV, "fleet-b-token")
    other_fleet = session_key(NAME)
    assert first == again and first != other_fleet and NAME not in first and FLEET not in first
    assert session_key("AnotherServer___x") != other_fleet
