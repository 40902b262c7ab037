"""openai_model over real HTTP, in front of the scripted model (served in-process behind a recording middleware)."""

import json
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gymfleet.errors import ConfigError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.launch import build_server
from gymfleet.testing import serve
from gymfleet.testing.fleets import buffer_body
from gymfleet.wire import Response
from responses_api_models.openai_model.app import OpenAIModel, OpenAIModelConfig
from responses_api_models.scripted_model.app import ScriptedModel

KEY = "sk-test-5ecret-0123456789abcdef"
REPO = Path(__file__).resolve().parents[3]
SCRIPT = {
    "name": "upstream",
    "model": "scripted-upstream",
    "rules": [
        {"match": "weather in Paris", "text": "Let me check.",
         "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
        {"match": "2\\+2", "reasoning": "Two and two.", "text": "\\boxed{4}"},
        {"match": "(?i)take your time", "delay_s": 30, "text": "Too late."},
    ],
    "default": {"text": "Hello."},
}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
HISTORY = [
    {"role": "user", "content": "What is 2+2?"},
    {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Two and two."}]},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "\\boxed{4}", "annotations": []}]},
    {"role": "user", "content": "And 3+3?"},
]


class Recorder:
    """ASGI middleware in front of the upstream: records each request; `faults` are (status, body) answered first."""

    def __init__(self, app):
        self.app = app
        self.url = ""
        self.requests: list[dict] = []
        self.faults: list[tuple[int, dict]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body, replay = await buffer_body(receive)
        headers = {name.decode(): value.decode() for name, value in scope["headers"]}
        self.requests.append({"path": scope["path"], "headers": headers, "body": json.loads(body) if body else None})
        if self.faults:
            status, payload = self.faults.pop(0)
            data = json.dumps(payload).encode()
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")]})
            return await send({"type": "http.response.body", "body": data})
        await self.app(scope, replay, send)

    @property
    def last(self) -> dict:
        return self.requests[-1]


@pytest.fixture(scope="module")
def module_upstream() -> Iterator[Recorder]:
    recorder = Recorder(ScriptedModel(SCRIPT).create_app())
    with serve(recorder) as url:
        recorder.url = url
        yield recorder


@pytest.fixture
def upstream(module_upstream: Recorder) -> Recorder:
    module_upstream.requests.clear()
    module_upstream.faults.clear()
    return module_upstream


@contextmanager
def policy(base_url: str, **fields) -> Iterator[httpx.Client]:
    config = {"name": "policy_model", "base_url": base_url, "api_key": KEY, "model": "gpt-test", **fields}
    with serve(OpenAIModel(config).create_app()) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


# ---------------------------------------------------------------------------------------------- happy paths


def test_responses_native_pass_through(upstream):
    with policy(upstream.url + "/v1/") as client:
        answer = client.post("/v1/responses", json={"input": "What is 2+2?", "model": "caller", "temperature": 0.5})
    assert answer.status_code == 200, answer.text
    response = Response.model_validate(answer.json())
    assert response.output_text == "\\boxed{4}"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert upstream.last["path"] == "/v1/responses"
    assert upstream.last["body"] == {"input": "What is 2+2?", "model": "gpt-test", "temperature": 0.5}


def test_chat_mode_converts_both_ways(upstream):
    request = {"input": "What is the weather in Paris?", "instructions": "Be brief.", "tools": [WEATHER_TOOL]}
    with policy(upstream.url + "/v1", is_responses_native=False) as client:
        answer = client.post("/v1/responses", json=request)
    assert answer.status_code == 200, answer.text
    response = Response.model_validate(answer.json())
    assert response.model == "gpt-test"
    assert [(item.type, getattr(item, "name", None)) for item in response.output] == [
        ("message", None), ("function_call", "get_weather")]
    assert response.output[1].arguments == '{"city": "Paris"}'
    sent = upstream.last
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "What is the weather in Paris?"}]
    assert sent["body"]["tools"][0]["function"]["name"] == "get_weather"


NEWER_PARAMS = {"context_management": [{"type": "compaction", "compact_threshold": 20000}],
                "prompt_cache_retention": "24h", "stream_options": {"include_obfuscation": False},
                "a_parameter_from_a_future_release": {"x": 1}}


def test_parameters_gymfleet_does_not_know_reach_a_responses_upstream(upstream):
    request = {"input": "What is 2+2?", **NEWER_PARAMS}
    with policy(upstream.url + "/v1") as client:
        answer = client.post("/v1/responses", json=request)
    assert answer.status_code == 200, answer.text
    assert upstream.last["body"] == {**request, "model": "gpt-test"}


def test_chat_mode_forwards_what_chat_completions_has_and_drops_the_rest(upstream):
    request = {"input": "What is 2+2?", "prompt_cache_key": "k", **NEWER_PARAMS}
    with policy(upstream.url + "/v1", is_responses_native=False) as client:
        answer = client.post("/v1/responses", json=request)
    assert answer.status_code == 200, answer.text
    sent = upstream.last["body"]
    assert (sent["prompt_cache_key"], sent["prompt_cache_retention"]) == ("k", "24h")
    assert not {"context_management", "stream_options", "a_parameter_from_a_future_release"} & set(sent)


@pytest.mark.parametrize("fields", [{}, {"is_responses_native": False}], ids=["responses-native", "chat"])
def test_background_is_a_400_not_an_empty_answer(upstream, fields):
    with policy(upstream.url + "/v1", **fields) as client:
        answer = client.post("/v1/responses", json={"input": "Hi", "background": True})
    assert answer.status_code == 400 and "background" in answer.json()["detail"]
    assert not upstream.requests


def test_chat_completions_pass_through(upstream):
    with policy(upstream.url + "/v1", extra_body={"seed": 7}) as client:
        answer = client.post("/v1/chat/completions",
                             json={"model": "caller", "messages": [{"role": "user", "content": "Hi"}], "top_p": 0.9})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Hello."
    assert upstream.last["path"] == "/v1/chat/completions"
    assert upstream.last["body"] == {"model": "gpt-test", "messages": [{"role": "user", "content": "Hi"}],
                                     "top_p": 0.9}  # no extra_body: chat is passed through as sent


@pytest.mark.parametrize(
    ("fields", "path", "body"),
    [
        ({}, "/v1/responses", {"input": "Hi", "model": "caller"}),
        ({"is_responses_native": False}, "/v1/responses", {"input": "Hi", "model": "caller"}),
        ({}, "/v1/chat/completions", {"model": "caller", "messages": [{"role": "user", "content": "Hi"}]}),
    ],
    ids=["responses-native", "responses-via-chat", "chat"],
)
@pytest.mark.parametrize("model", ["gpt-test", ""], ids=["configured", "unset"])
def test_model_name_and_authorization_reach_the_upstream(upstream, fields, path, body, model):
    with policy(upstream.url + "/v1", model=model, **fields) as client:
        assert client.post(path, json=body).status_code == 200
    assert upstream.last["body"]["model"] == (model or "caller")
    assert upstream.last["headers"]["authorization"] == f"Bearer {KEY}"


def test_no_key_sends_no_authorization_and_default_headers_are_sent(upstream):
    with policy(upstream.url + "/v1", api_key="", default_headers={"OpenAI-Organization": "org-1"}) as client:
        assert client.post("/v1/responses", json={"input": "Hi"}).status_code == 200
    assert "authorization" not in upstream.last["headers"]
    assert upstream.last["headers"]["openai-organization"] == "org-1"


def test_extra_body_is_merged_under_the_request(upstream):
    with policy(upstream.url + "/v1", extra_body={"store": False, "temperature": 0.1}) as client:
        assert client.post("/v1/responses", json={"input": "Hi", "temperature": 0.7}).status_code == 200
    assert upstream.last["body"] == {"input": "Hi", "model": "gpt-test", "store": False, "temperature": 0.7}


@pytest.mark.parametrize("native", [True, False], ids=["responses-native", "responses-via-chat"])
@pytest.mark.parametrize("drop", [True, False], ids=["drop", "keep"])
def test_drop_input_reasoning_items(upstream, native, drop):
    with policy(upstream.url + "/v1", is_responses_native=native, drop_input_reasoning_items=drop) as client:
        answer = client.post("/v1/responses", json={"input": HISTORY})
    assert answer.status_code == 200, answer.text
    sent = upstream.last["body"]
    if native:
        assert [item.get("type") for item in sent["input"]] == [None, *(["message"] if drop else
                                                                         ["reasoning", "message"]), None]
    else:
        assistant = sent["messages"][1]
        assert assistant["role"] == "assistant"
        assert assistant["content"] == ("" if drop else "<think>Two and two.</think>") + "\\boxed{4}"


@pytest.mark.parametrize("native", [True, False], ids=["responses-native", "responses-via-chat"])
def test_training_token_fields_are_not_sent_upstream(upstream, native):
    tokens = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}
    history = [*HISTORY[:2], {**HISTORY[2], **tokens}, HISTORY[3]]
    with policy(upstream.url + "/v1", is_responses_native=native) as client:
        answer = client.post("/v1/responses", json={"input": history})
    assert answer.status_code == 200, answer.text
    sent = json.dumps(upstream.last["body"])
    assert "\\boxed{4}" in sent and not any(name in sent for name in tokens)


# ---------------------------------------------------------------------------------------------- failures


def test_dead_upstream_is_502_connection_error_without_the_key(caplog):
    caplog.set_level(logging.DEBUG)
    with policy(dead_url(), max_attempts=2) as client:
        answer = client.post("/v1/responses", json={"input": "Hi"})
    assert answer.status_code == 502
    assert answer.json()["error_type"] == "connection_error"
    assert "cannot reach" in answer.json()["detail"]
    assert "inner call failed" in caplog.text  # the failure was logged...
    assert KEY not in answer.text and KEY not in caplog.text  # ...and the key was not


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2}, "returns one choice"),
        ("/v1/responses", {"input": [{"type": "web_search_call", "id": "ws_1"}]}, "cannot be sent to a Chat"),
    ],
    ids=["chat-n2", "responses-unknown-item"],
)
def test_upstream_4xx_comes_back_with_its_status_and_message(upstream, path, body, message):
    with policy(upstream.url + "/v1") as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["detail"]
    assert answer.json()["upstream_status"] == 400
    assert len(upstream.requests) == 1  # a 4xx is not retried


def test_upstream_echoing_the_key_is_redacted(upstream, caplog):
    caplog.set_level(logging.DEBUG)
    upstream.faults.append((401, {"error": {"message": f"Incorrect API key provided: {KEY}.", "code": "bad_key"}}))
    with policy(upstream.url + "/v1") as client:
        answer = client.post("/v1/responses", json={"input": "Hi"})
    assert answer.status_code == 502 and answer.json()["error_type"] == "auth_failed"
    assert "Incorrect API key provided: ****." in answer.json()["detail"]
    assert "Incorrect API key provided" in caplog.text
    assert KEY not in answer.text and KEY not in caplog.text


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retryable_status_is_retried_then_502(upstream, status):
    upstream.faults += [(status, {"error": {"message": "overloaded"}})] * 2
    with policy(upstream.url + "/v1", max_attempts=2) as client:
        answer = client.post("/v1/responses", json={"input": "Hi"})
    assert answer.status_code == 502
    assert answer.json()["error_type"] == "upstream_error"
    assert answer.json()["upstream_status"] == status
    assert "overloaded" in answer.json()["detail"]
    assert len(upstream.requests) == 2


@pytest.mark.parametrize("native", [True, False], ids=["responses-native", "responses-via-chat"])
def test_hung_upstream_is_a_typed_timeout_not_retried(upstream, native):
    with policy(upstream.url + "/v1", is_responses_native=native, timeout_s=0.5) as client:
        answer = client.post("/v1/responses", json={"input": "Take your time."})
    assert answer.status_code == 502 and answer.json()["error_type"] == "timeout"
    assert len(upstream.requests) == 1, "a generation that may still be running is not sent again"


def test_retry_recovers_from_one_5xx(upstream):
    upstream.faults.append((503, {"error": {"message": "warming up"}}))
    with policy(upstream.url + "/v1", max_attempts=2) as client:
        answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert answer.status_code == 200, answer.text
    assert len(upstream.requests) == 2


@pytest.mark.parametrize(
    ("native", "path"),
    [(True, "/v1/responses"), (False, "/v1/responses"), (True, "/v1/chat/completions")],
    ids=["responses-native", "responses-via-chat", "chat"],
)
def test_malformed_upstream_answer_is_502(upstream, native, path):
    upstream.faults.append((200, {"object": "something else"}))
    body = {"input": "Hi"} if path == "/v1/responses" else {"messages": [{"role": "user", "content": "Hi"}]}
    with policy(upstream.url + "/v1", is_responses_native=native) as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 502
    assert answer.json()["error_type"] == "upstream_error"
    assert "answered 200 with a body that is not" in answer.json()["detail"]


def test_stream_is_refused_before_the_upstream(upstream):
    with policy(upstream.url + "/v1") as client:
        answer = client.post("/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "Hi"}], "stream": True})
    assert answer.status_code == 400
    assert "does not stream" in answer.json()["detail"]
    assert upstream.requests == []


# ---------------------------------------------------------------------------------------------- config


def test_config_hides_the_key_and_accepts_nemo_gym_names():
    config = OpenAIModelConfig.model_validate(
        {"openai_base_url": "https://api.example.com/v1", "openai_api_key": KEY, "openai_model": "m"}
    )
    assert (config.base_url, config.api_key.get_secret_value(), config.model) == ("https://api.example.com/v1", KEY,
                                                                                  "m")
    for text in (repr(config), str(config), config.model_dump_json(), str(config.model_dump())):
        assert KEY not in text
    assert OpenAIModelConfig(base_url="u", api_key=1234).api_key.get_secret_value() == "1234"


def test_yaml_config_builds_the_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # keep a developer's env.yaml out of this test
    seeds = {"policy_base_url": "https://api.example.com/v1", "policy_api_key": KEY, "policy_model_name": "m"}
    parser = GlobalConfigDictParserConfig(
        initial_global_config_dict=seeds, skip_load_from_dotenv=True,
        cli_args=["+config_paths=[responses_api_models/openai_model/configs/openai_model.yaml]"],
    )
    config = parse_global_config(parser, root=REPO)
    server = build_server(config.instance("policy_model"), config)
    assert isinstance(server, OpenAIModel)
    assert (server.base_url, server.config.model, server.config.is_responses_native) == (
        "https://api.example.com/v1", "m", True)
    assert server.config.api_key.get_secret_value() == KEY


def test_api_key_from_env_yaml_and_an_environment_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GYMFLEET_TEST_OPENAI_KEY", KEY)
    env_yaml = tmp_path / "env.yaml"
    env_yaml.write_text("policy_base_url: https://api.example.com/v1\n"
                        "policy_api_key: ${oc.env:GYMFLEET_TEST_OPENAI_KEY}\npolicy_model_name: m\n")
    parser = GlobalConfigDictParserConfig(
        dotenv_path=env_yaml, cli_args=["+config_paths=[responses_api_models/openai_model/configs/openai_model.yaml]"])
    config = parse_global_config(parser, root=REPO)
    server = build_server(config.instance("policy_model"), config)
    assert server.config.api_key.get_secret_value() == KEY
    assert KEY not in config.to_yaml(hide_secrets=True)


def test_typo_in_config_names_the_field():
    with pytest.raises(ConfigError, match="drop_input_reasoning_item: unknown field. Did you mean"):
        validate_fields(OpenAIModelConfig, {"base_url": "u", "drop_input_reasoning_item": True}, "policy_model.x")
