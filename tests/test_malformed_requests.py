"""No request makes a server answer 500 or crash: malformed bodies get a 4xx naming the offending field."""

from __future__ import annotations

import json

import httpx
import pytest

from gymfleet.testing import fleet_headers, free_port, running_fleet

MALFORMED = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"text"',
    b"{}",
    json.dumps({"responses_create_params": None}).encode(),
    json.dumps({"responses_create_params": {"input": [{"type": "function_call"}]}}).encode(),
    json.dumps({"responses_create_params": {"input": [{"role": "wizard", "content": "hi"}]}}).encode(),
    json.dumps({"responses_create_params": {"input": "hi", "temperature": "hot"}}).encode(),
    json.dumps({"responses_create_params": {"input": "hi"}, "response": {"output": [{"type": "message"}]}}).encode(),
    json.dumps({"input": [{"type": "mystery_item", "x": 1}]}).encode(),
    json.dumps({"input": "hi", "metadata": {"chat_template_kwargs": "{not json"}}).encode(),
    json.dumps({"input": "hi", "metadata": {"extra_body": "[1, 2]"}}).encode(),
    json.dumps({"input": "hi", "tools": [{"type": "function"}]}).encode(),
    json.dumps({"messages": "hi"}).encode(),
    json.dumps({"messages": [{"role": "user"}]}).encode(),
    json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
    "{\"input\": \"\udcff\"}".encode("utf-8", "surrogatepass"),
]

ROUTES = {
    "mcqa": ["/verify", "/seed_session", "/aggregate_metrics"],
    "mcqa_simple_agent": ["/run", "/v1/responses", "/aggregate_metrics"],
    "policy_model": ["/v1/responses", "/v1/chat/completions"],
    "scripted_llm": ["/v1/responses", "/v1/chat/completions", "/tokenize"],
}


@pytest.fixture(scope="module")
def fleet():
    with running_fleet(["configs/quickstart.yaml"]) as running:
        yield running


@pytest.mark.parametrize("server", sorted(ROUTES))
def test_malformed_bodies_are_4xx_on_every_route(fleet, server):
    url = fleet.config.instance(server).url
    problems = []
    with httpx.Client(timeout=30, headers=fleet_headers(fleet)) as client:
        for route in ROUTES[server]:
            for body in MALFORMED:
                answer = client.post(url + route, content=body, headers={"Content-Type": "application/json"})
                if answer.status_code >= 500:
                    problems.append(f"{route} {body[:60]!r} -> {answer.status_code} {answer.text[:120]}")
                elif answer.status_code >= 400:
                    assert answer.json().get("detail") or answer.json().get("error"), f"{route}: 4xx says why"
        assert client.get(url + "/").status_code == 200, "the server survived"
    assert not problems, "\n".join(problems)


STRICT = {"mcqa": "/verify", "mcqa_simple_agent": "/run", "policy_model": "/v1/responses"}


@pytest.mark.parametrize("server", sorted(STRICT))
@pytest.mark.parametrize("body", MALFORMED[:12], ids=lambda body: body[:40].decode("utf-8", "replace"))
def test_rollout_routes_reject_malformed_rows_with_4xx(fleet, server, body):
    url = fleet.config.instance(server).url + STRICT[server]
    answer = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert 400 <= answer.status_code < 500, answer.text


def test_dead_upstream_is_a_typed_502(fleet):
    del fleet  # the policy server below is built standalone, pointing at nothing
    from gymfleet.testing import serve
    from responses_api_models.vllm_model.app import VLLMModel

    model = VLLMModel({"name": "policy", "base_url": f"http://127.0.0.1:{free_port()}/v1", "timeout_s": 5})
    with serve(model.create_app()) as url:
        answer = httpx.post(url + "/v1/responses", json={"input": "hi"}, timeout=60)
    assert answer.status_code == 502
    assert answer.json()["error_type"] == "connection_error"
