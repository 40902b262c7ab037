"""vllm_model over real HTTP, in front of scripted upstreams (wrapped in a `Tap` that records what they receive).

Covers token capture over a multi-turn tool rollout driven by simple_agent (prefix contiguity), sticky routing,
request building, context overflow, retries, deadlines, dead upstreams, bad requests and bad token data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, ValidationError

import gymfleet.serving.convert
from agents.simple_agent.app import SimpleAgent
from gymfleet.errors import BadRequestError
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.testing import free_port, serve
from gymfleet.testing.fleets import buffer_body
from gymfleet.wire import TOKEN_FIELDS, Response
from responses_api_models.scripted_model.app import ScriptedModel
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig
from responses_api_models.vllm_model.request import chat_body, passthrough_body

RULES = [
    {"match": "(?i)weather", "turn": 0, "reasoning": "I should call the tool.", "text": "Let me check Paris.",
     "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"match": "(?i)weather", "turn": 1, "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]},
    {"match": "(?i)weather", "turn": 2, "reasoning": "Both are sunny.", "text": "It is sunny in Paris and Rome."},
    {"match": "Atlantis", "turn": 0, "tool_calls": [{"name": "get_weather", "arguments": {"city": "Atlantis"}}]},
    {"match": "(?i)burst", "status": 429, "fail_times": 2, "retry_after_s": 0, "text": "Finally."},
    {"match": "(?i)flaky (\\d+)", "status": 503, "fail_times": 2, "text": "Recovered."},
    {"match": "(?i)broken", "status": 500},
    {"match": "(?i)storm", "status": 429, "retry_after_s": 3600},
    {"match": "(?i)missing model", "status": 404, "error_message": "The model `x` does not exist."},
    {"match": "(?i)wrong key", "status": 401, "error_message": "Incorrect API key provided."},
    {"match": "(?i)hang", "delay_s": 30, "text": "Too late."},
    {"match": "(?i)ponder", "reasoning": "Hmm.", "text": "Done pondering."},
]
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


class Tap:
    """ASGI wrapper: records every HTTP request `(path, JSON body)` and may rewrite JSON answers.

    `rewrite(path, answer)` returns the answer to send instead (serialized with Python's `json`, so a NaN stays
    the `NaN` literal a Python upstream writes), a `(status, answer)` pair, or None to keep it.
    """

    def __init__(self, app: Any, rewrite=None):
        self.app, self.rewrite, self.requests = app, rewrite, []

    def bodies(self, path: str) -> list[dict]:
        return [body for seen, body in self.requests if seen == path]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw, replay = await buffer_body(receive)
        self.requests.append((scope["path"], json.loads(raw) if raw else None))
        if self.rewrite is None:
            return await self.app(scope, replay, send)
        start, parts = {}, []

        async def hold(message):
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                parts.append(message.get("body", b""))

        await self.app(scope, replay, hold)
        body = b"".join(parts)
        if start["status"] == 200:
            changed = self.rewrite(scope["path"], json.loads(body))
            if isinstance(changed, tuple):
                start["status"], changed = changed
            if changed is not None:
                body = json.dumps(changed).encode()
        headers = [(key, value) for key, value in start.get("headers", []) if key.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class CityArgs(BaseModel):
    city: str


class WeatherEnv(ResourcesServer):
    """get_weather answers 21C and sunny (Atlantis: a report too long for the context); reward 1 for "sunny"."""

    async def get_weather(self, body: CityArgs) -> dict:
        if body.city == "Atlantis":
            return {"city": body.city, "report": "waves " * 600}
        return {"city": body.city, "temperature_c": 21, "sky": "sunny"}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=float("sunny" in body.response.output_text.lower()))


def _block(kind: str, impl: str, url: str) -> dict:
    return {kind: {impl: {"host": "127.0.0.1", "port": int(url.rsplit(":", 1)[1])}}}


@contextlib.contextmanager
def _stack(*, upstreams: int = 1, scripted: dict | None = None, rewrite=None, agent: bool = False,
           base_url: str | None = None, **vllm):
    """Scripted upstream(s) behind taps, a vllm_model in front (training mode by default), optionally an agent."""
    taps = [Tap(ScriptedModel({"name": f"llm{i}", "rules": RULES, **(scripted or {})}).create_app(), rewrite)
            for i in range(upstreams)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve(tap)) + "/v1" for tap in taps]
        config = {"name": "policy", "base_url": base_url or (urls if upstreams > 1 else urls[0]),
                  "model": "policy-model", "return_token_id_information": True, "uses_reasoning_parser": True,
                  "upstream_backoff_s": 0.01, "timeout_s": 20, **vllm}
        model_url = stack.enter_context(serve(VLLMModel(config).create_app()))
        agent_url = None
        if agent:
            env_url = stack.enter_context(serve(WeatherEnv({"name": "weather"}).create_app()))
            fleet = {"weather": _block("resources_servers", "weather", env_url),
                     "policy": _block("responses_api_models", "vllm_model", model_url)}
            agent_config = {"name": "agent", "resources_server": "weather", "model_server": "policy",
                            "model_timeout_s": 60}
            agent_url = stack.enter_context(serve(SimpleAgent(agent_config, fleet).create_app()))
        yield SimpleNamespace(taps=taps, tap=taps[0], url=model_url, agent_url=agent_url)


def _row(text: str, **params) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}], "tools": TOOLS, **params}}


def _respond(url: str, text: str, **params) -> httpx.Response:
    return httpx.post(f"{url}/v1/responses", json={"input": text, **params}, timeout=60)


def _trainable(output: list[dict]) -> list[dict]:
    return [item for item in output if item.get("generation_token_ids")]


# ------------------------------------------------------------------------------------------ token capture


@pytest.mark.parametrize(
    ("vllm", "scripted"),
    [
        ({}, {}),
        ({"request_prompt_and_generation_token_ids": True}, {}),
        ({"uses_reasoning_parser": False}, {"reasoning_parser": False}),
        ({"preserve_reasoning_in_assistant_content": True}, {}),
    ],
    ids=["tokenize", "return_token_ids", "no_reasoning_parser", "reasoning_kept_in_content"],
)
def test_multi_turn_rollout_captures_contiguous_tokens(vllm, scripted):
    with _stack(agent=True, scripted=scripted, **vllm) as stack:
        result = httpx.post(f"{stack.agent_url}/run", json=_row("What is the weather in Paris and Rome?"),
                            timeout=60).json()
    output = result["response"]["output"]
    assert result["reward"] == 1.0
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call", "function_call_output",
                                                 "function_call", "function_call_output", "reasoning", "message"]
    trainable = _trainable(output)
    assert [output.index(item) for item in trainable] == [2, 4, 7], "the last output item of each model call"
    assert all(set(TOKEN_FIELDS) <= set(item) for item in trainable)
    assert not any("prompt_token_ids" in item for item in output if item not in trainable)
    seen: list[int] = []
    for turn, item in enumerate(trainable):
        assert len(item["generation_token_ids"]) == len(item["generation_log_probs"]) > 0
        assert item["prompt_token_ids"][: len(seen)] == seen, f"turn {turn} does not extend the previous turns"
        seen = item["prompt_token_ids"] + item["generation_token_ids"]

    chats = stack.tap.bodies("/v1/chat/completions")
    assert len(chats) == 3
    assert all(body["logprobs"] is True and body["top_logprobs"] == 0 and body["return_tokens_as_token_ids"] is True
               for body in chats)
    assert all(body["model"] == "policy-model" for body in chats)
    history = [message for message in chats[2]["messages"] if message["role"] == "assistant"]
    assert [{name: message[name] for name in TOKEN_FIELDS} for message in history] == [
        {name: item[name] for name in TOKEN_FIELDS} for item in trainable[:2]], "token fields travel upstream"
    tokenizes = stack.tap.bodies("/tokenize")
    if vllm.get("request_prompt_and_generation_token_ids"):
        assert not tokenizes and all(body["return_token_ids"] is True for body in chats)
    else:
        assert [set(body) for body in tokenizes] == [{"model", "messages", "tools"}] * 3
        assert [body["messages"] for body in tokenizes] == [body["messages"] for body in chats]


def test_capture_off_sends_no_logprob_flags_and_adds_no_fields():
    with _stack(return_token_id_information=False) as stack:
        response = _respond(stack.url, "ponder this").json()
    assert not _trainable(response["output"])
    assert not {"logprobs", "top_logprobs", "return_tokens_as_token_ids"} & set(stack.tap.bodies(
        "/v1/chat/completions")[0])


def _bundle_on_message(path: str, answer: dict) -> dict | None:
    if path.endswith("/chat/completions"):
        choice = answer["choices"][0]
        choice["message"].update(prompt_token_ids=[7, 8], generation_token_ids=[9], generation_log_probs=[-0.5])
        choice["logprobs"] = None
        return answer
    return None


def test_a_complete_bundle_on_the_upstream_message_is_used_as_is():
    with _stack(rewrite=_bundle_on_message) as stack:
        response = _respond(stack.url, "hello").json()
    assert {name: response["output"][-1][name] for name in TOKEN_FIELDS} == {
        "prompt_token_ids": [7, 8], "generation_token_ids": [9], "generation_log_probs": [-0.5]}
    assert not stack.tap.bodies("/tokenize")


def _corrupt(how: str):
    def rewrite(path: str, answer: dict) -> dict | None:
        if not path.endswith("/chat/completions"):
            return None
        choice = answer["choices"][0]
        entries = choice["logprobs"]["content"]
        if how == "nan_logprob":
            entries[1]["logprob"] = float("nan")
        elif how == "infinite_logprob":
            entries[0]["logprob"] = float("-inf")
        elif how == "null_logprob":
            entries[0]["logprob"] = None
        elif how == "missing_logprob":
            entries.pop()
        elif how == "token_ids_disagree":
            choice["token_ids"][0] += 1
        elif how == "text_tokens":
            for entry in entries:
                entry["token"] = "x"
        elif how == "no_logprobs":
            choice["logprobs"] = None
        elif how == "bundle_mismatch":
            choice["message"].update(prompt_token_ids=[1], generation_token_ids=[2, 3], generation_log_probs=[-1.0])
        elif how == "empty_prompt":
            answer["prompt_token_ids"] = []
        return answer

    return rewrite


@pytest.mark.parametrize(
    ("how", "vllm", "reason"),
    [
        ("nan_logprob", {}, "logprob 1 is nan"),
        ("nan_logprob", {"request_prompt_and_generation_token_ids": True}, "logprob 1 is nan"),
        ("infinite_logprob", {}, "logprob 0 is -inf"),
        ("null_logprob", {}, "logprob 0 is None"),
        ("missing_logprob", {"request_prompt_and_generation_token_ids": True}, "but 14 logprobs"),
        ("token_ids_disagree", {"request_prompt_and_generation_token_ids": True}, "disagree"),
        ("text_tokens", {}, "is not 'token_id:<int>'"),
        ("no_logprobs", {}, "no choices[0].logprobs.content"),
        ("bundle_mismatch", {}, "2 generated tokens but 1 logprobs"),
        ("empty_prompt", {"request_prompt_and_generation_token_ids": True}, "prompt_token_ids must be a non-empty"),
    ],
    ids=["nan", "nan_return_token_ids", "infinite", "null", "length_mismatch", "token_ids_disagree",
         "text_tokens", "no_logprobs", "bundle_mismatch", "empty_prompt"],
)
def test_bad_token_data_is_a_typed_502(how, vllm, reason):
    with _stack(rewrite=_corrupt(how), **vllm) as stack:
        answer = _respond(stack.url, "hello")
    assert answer.status_code == 502, answer.text
    assert answer.json()["error_type"] == "upstream_bad_token_data"
    assert reason in answer.json()["detail"]


def test_upstream_without_tokenize_is_a_typed_502():
    def no_tokenize(path: str, answer: dict):
        return (404, {"detail": "Not Found"}) if path == "/tokenize" else None

    with _stack(rewrite=no_tokenize) as stack:
        answer = _respond(stack.url, "hello")
    assert answer.status_code == 502 and answer.json()["error_type"] == "upstream_bad_response"
    assert "request_prompt_and_generation_token_ids" in answer.json()["detail"]


# ------------------------------------------------------------------------------------------ routing


def test_sticky_routing_one_rollout_one_upstream_sessions_spread():
    with _stack(upstreams=2, agent=True) as stack:
        for rollout in range(24):
            result = httpx.post(f"{stack.agent_url}/run", json=_row(f"weather in Paris? (rollout {rollout})"),
                                timeout=60).json()
            assert result["reward"] == 1.0
    served_by: dict[str, set[int]] = {}
    for index, tap in enumerate(stack.taps):
        for _, body in tap.requests:
            first_user = next(message["content"] for message in body["messages"] if message["role"] == "user")
            served_by.setdefault(first_user, set()).add(index)
    assert len(served_by) == 24
    assert all(len(upstreams) == 1 for upstreams in served_by.values()), "a rollout moved between upstreams"
    assert all(tap.requests for tap in stack.taps), "24 sessions all hashed onto one of two upstreams"
    assert all(len(tap.bodies("/v1/chat/completions")) == len(tap.bodies("/tokenize")) for tap in stack.taps)


# ------------------------------------------------------------------------------------------ request building


def test_temperature_and_top_p_reach_the_upstream():
    with _stack(agent=True) as stack:
        httpx.post(f"{stack.agent_url}/run", json=_row("weather in Paris?", temperature=0.0, top_p=1.0,
                                                       max_output_tokens=500), timeout=60).raise_for_status()
    chats = stack.tap.bodies("/v1/chat/completions")
    assert [(body["temperature"], body["top_p"], body["max_tokens"]) for body in chats] == [(0.0, 1.0, 500)] * 3


def test_overrides_reach_the_upstream():
    vllm = {"sampling_overrides": {"temperature": 0.6}, "extra_body": {"top_k": 20, "top_p": 0.1},
            "chat_template_kwargs": {"enable_thinking": True}}
    metadata = {"chat_template_kwargs": json.dumps({"enable_thinking": False}), "extra_body": json.dumps({"seed": 3})}
    with _stack(**vllm) as stack:
        _respond(stack.url, "hello", temperature=1.0, top_p=0.95, metadata=metadata).raise_for_status()
    body = stack.tap.bodies("/v1/chat/completions")[0]
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0.6, 0.95, 20, 3)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert stack.tap.bodies("/tokenize")[0]["chat_template_kwargs"] == {"enable_thinking": False}


BASE = {"name": "p", "base_url": "http://up/v1", "model": "policy-model"}
THOUGHTFUL = [{"role": "user", "content": "Q"},
              {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
              {"role": "assistant", "content": "A"}, {"role": "developer", "content": "D"}]


@pytest.mark.parametrize(
    ("config", "params", "expected"),
    [
        ({"uses_reasoning_parser": True}, {"input": THOUGHTFUL},
         {"messages": [THOUGHTFUL[0], {"role": "assistant", "content": "A", "reasoning_content": "plan",
                                       "reasoning": "plan"}, THOUGHTFUL[3]]}),
        ({"uses_reasoning_parser": True, "preserve_reasoning_in_assistant_content": True}, {"input": THOUGHTFUL},
         {"messages": [THOUGHTFUL[0], {"role": "assistant", "content": "<think>plan</think>A"}, THOUGHTFUL[3]]}),
        ({"uses_reasoning_parser": True, "uses_interleaved_reasoning": False}, {"input": THOUGHTFUL},
         {"messages": [THOUGHTFUL[0], {"role": "assistant", "content": "A"}, THOUGHTFUL[3]]}),
        ({"uses_reasoning_parser": False}, {"input": THOUGHTFUL},
         {"messages": [THOUGHTFUL[0], {"role": "assistant", "content": "<think>plan</think>A"}, THOUGHTFUL[3]]}),
        ({"uses_reasoning_parser": False, "replace_developer_role_with_system": True}, {"input": THOUGHTFUL},
         {"messages": [THOUGHTFUL[0], {"role": "assistant", "content": "<think>plan</think>A"},
                       {"role": "system", "content": "D"}]}),
        ({}, {"input": "Q", "temperature": 0.0, "top_p": 1.0}, {"temperature": 0.0, "top_p": 1.0}),
        ({"return_token_id_information": True}, {"input": "Q"},
         {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}),
        ({"return_token_id_information": True, "request_prompt_and_generation_token_ids": True}, {"input": "Q"},
         {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True}),
        ({"extra_body": {"top_k": 5, "temperature": 2.0, "chat_template_kwargs": {"a": 1, "b": 1}},
          "chat_template_kwargs": {"b": 2, "c": 2}},
         {"input": "Q", "temperature": 0.5, "metadata": {"extra_body": '{"chat_template_kwargs": {"c": 3, "d": 3}}',
                                                          "chat_template_kwargs": '{"d": 4}'}},
         {"top_k": 5, "temperature": 0.5, "chat_template_kwargs": {"a": 1, "b": 2, "c": 3, "d": 4}}),
        ({"sampling_overrides": {"temperature": 0.6, "top_p": 0.7}}, {"input": "Q", "temperature": 1.0, "top_p": 1.0},
         {"temperature": 0.6, "top_p": 0.7}),
        ({}, {"input": "Q", "model": "callers-name"}, {"model": "policy-model"}),
    ],
    ids=["reasoning_parser", "preserve_in_content", "not_interleaved", "no_reasoning_parser", "developer_to_system",
         "temperature_zero_forwarded", "capture_flags", "capture_return_token_ids", "precedence", "sampling_overrides",
         "config_model_wins"],
)
def test_chat_body(config, params, expected):
    body = chat_body(params, VLLMModelConfig.model_validate({**BASE, **config}))
    assert {key: body[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"metadata": {"chat_template_kwargs": "{not json"}}, "metadata.chat_template_kwargs must be a JSON object"),
        ({"metadata": {"extra_body": "[1, 2]"}}, "metadata.extra_body must be a JSON object string, got list"),
        ({"metadata": {"extra_body": '{"n": 2}'}}, "n must be 1"),
        ({"metadata": {"extra_body": '{"stream": true}'}}, "stream must be false"),
        ({"input": [{"type": "file_search_call", "id": "fs"}]}, "input item of type 'file_search_call'"),
    ],
    ids=["bad_json", "not_an_object", "n_2", "stream", "unsupported_item"],
)
def test_bad_requests_are_400(params, message):
    config = VLLMModelConfig.model_validate(BASE)
    with pytest.raises(BadRequestError, match=message.replace("[", r"\[")):
        chat_body({"input": "Q", **params}, config)
    with _stack() as stack:
        answer = _respond(stack.url, "hello", **params)
    assert answer.status_code == 400 and answer.json()["error_type"] == "bad_request"
    assert message in answer.json()["detail"]
    assert not stack.tap.requests, "nothing was sent upstream"


def test_passthrough_body_keeps_the_callers_fields():
    config = VLLMModelConfig.model_validate({**BASE, "extra_body": {"top_k": 5, "temperature": 2.0}})
    body = passthrough_body({"model": "judge", "messages": [], "temperature": 0.0}, config)
    assert body == {"model": "policy-model", "messages": [], "temperature": 0.0, "top_k": 5}


NEWER_CLIENT_PARAMS = {  # what a newer `openai` client sends, as arguments
    "context_management": [{"type": "compaction", "compact_threshold": 20000}],
    "prompt_cache_retention": "24h",
    "prompt_cache_key": "rollout-7",
    "stream_options": {"include_obfuscation": False},
    "truncation": "auto",
}


async def test_a_newer_openai_client_is_answered(monkeypatch, caplog):
    monkeypatch.setattr(gymfleet.serving.convert, "_warned_dropped", set())
    caplog.set_level(logging.WARNING, logger="gymfleet.serving.convert")
    with _stack(return_token_id_information=False) as stack:
        async with openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0) as client:
            for _ in range(2):
                response = await client.responses.create(
                    model="policy-model", input="What is the weather in Paris?", tools=TOOLS, temperature=0.0,
                    **NEWER_CLIENT_PARAMS, extra_body={"a_future_parameter": {"x": 1}},
                )
                assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
                assert response.output[-1].name == "get_weather"
    for sent in stack.tap.bodies("/v1/chat/completions"):
        assert sent["prompt_cache_retention"] == "24h" and sent["prompt_cache_key"] == "rollout-7"
        assert not {"context_management", "stream_options", "truncation", "a_future_parameter"} & set(sent)
    dropped = sorted(re.search(r"parameter '(\w+)'", message)[1] for message in caplog.messages)
    assert dropped == ["a_future_parameter", "context_management", "stream_options", "truncation"], "once each"


def test_a_dataset_row_with_newer_parameters_runs_through_the_agent():
    with _stack(agent=True, return_token_id_information=False) as stack:
        answer = httpx.post(f"{stack.agent_url}/run", json=_row("weather in Paris and Rome?", **NEWER_CLIENT_PARAMS),
                            timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["reward"] == 1.0
    assert answer.json()["responses_create_params"]["context_management"] == NEWER_CLIENT_PARAMS["context_management"]
    assert all(body["prompt_cache_key"] == "rollout-7" for body in stack.tap.bodies("/v1/chat/completions"))


@pytest.mark.parametrize(
    ("params", "message"),
    [({"background": True}, "background=true cannot be served"),
     ({"previous_response_id": "resp_1"}, "send the whole conversation in `input`")],
    ids=["background", "previous_response_id"],
)
async def test_what_the_fleet_cannot_honour_is_a_clear_400_to_the_openai_client(params, message):
    with _stack(return_token_id_information=False) as stack:
        async with openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.responses.create(model="policy-model", input="What is the weather?", **params)
    assert message in info.value.response.json()["detail"]
    assert not stack.tap.requests, "nothing was sent upstream"


@pytest.mark.parametrize(
    "fields",
    [{"is_responses_native": True}, {"base_url": []}, {"timeout_s": 0}, {"upstream_max_attempts": 0},
     {"uses_reasoning_parsr": True}],
    ids=["responses_native", "no_url", "zero_timeout", "zero_attempts", "typo"],
)
def test_bad_config_fails_at_startup(fields):
    with pytest.raises(ValidationError):
        VLLMModel({**BASE, **fields})


# ------------------------------------------------------------------------------------------ reasoning answers


def test_sequential_reasoning_not_allowed_ends_with_content_filter():
    bare = [{"role": "user", "content": "ponder"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Hmm."}]}]
    with _stack(sequential_reasoning_allowed=False) as stack:
        refused = httpx.post(f"{stack.url}/v1/responses", json={"input": bare}, timeout=30).json()
        allowed_turn = httpx.post(f"{stack.url}/v1/responses", json={"input": bare[:1]}, timeout=30).json()
    assert refused["status"] == "incomplete" and refused["incomplete_details"] == {"reason": "content_filter"}
    assert [item["type"] for item in refused["output"]] == ["message"] and not _trainable(refused["output"])
    assert [item["type"] for item in allowed_turn["output"]] == ["reasoning", "message"]
    assert len(stack.tap.bodies("/v1/chat/completions")) == 1, "the refused call never reached the upstream"
    with _stack() as stack:
        answered = httpx.post(f"{stack.url}/v1/responses", json={"input": bare}, timeout=30).json()
    assert answered["status"] == "completed"


def test_reasoning_field_without_reasoning_parser_is_a_typed_error():
    with _stack(uses_reasoning_parser=False) as stack:
        answer = _respond(stack.url, "ponder")
    assert answer.status_code == 502 and answer.json()["error_type"] == "upstream_config_mismatch"
    assert "uses_reasoning_parser: true" in answer.json()["detail"]


# ------------------------------------------------------------------------------------------ failures


def test_context_overflow_is_an_empty_length_answer_and_the_agent_stops():
    with _stack(agent=True, scripted={"max_model_len": 1500}) as stack:
        result = httpx.post(f"{stack.agent_url}/run", json=_row("Forecast for Atlantis?"),
                            timeout=60).json()
        direct = _respond(stack.url, "x" * 2000)
    response = result["response"]
    assert [item["type"] for item in response["output"]] == ["function_call", "function_call_output", "message"]
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    last = response["output"][-1]
    assert last["content"][0]["text"] == "" and "generation_token_ids" not in last
    assert len(_trainable(response["output"])) == 1 and result["reward"] == 0.0
    assert len(stack.tap.bodies("/v1/chat/completions")) == 3, "two rollout calls (the second overflowed) + direct"
    assert direct.status_code == 200 and direct.json()["incomplete_details"] == {"reason": "max_output_tokens"}
    Response.model_validate(direct.json())


@pytest.mark.parametrize(
    ("text", "vllm"),
    [("burst", {"upstream_backoff_s": 60, "upstream_max_backoff_s": 60}), ("flaky 1", {})],
    ids=["429_retry_after", "503_backoff"],
)
def test_transient_errors_are_retried_until_success(text, vllm):
    with _stack(**vllm) as stack:
        answer = _respond(stack.url, text)
    assert answer.status_code == 200, answer.text
    assert Response.model_validate(answer.json()).output_text in ("Finally.", "Recovered.")
    assert len(stack.tap.bodies("/v1/chat/completions")) == 3, "two failures, then the answer"
    assert _trainable(answer.json()["output"])


def test_persistent_500_is_bounded_then_a_typed_502():
    with _stack(upstream_max_attempts=3) as stack:
        answer = _respond(stack.url, "broken")
    assert answer.status_code == 502
    assert (answer.json()["error_type"], answer.json()["upstream_status"]) == ("upstream_error", 500)
    assert len(stack.tap.bodies("/v1/chat/completions")) == 3


def test_429_burst_outlasting_the_retries_is_a_typed_502():
    # Retry-After asks for an hour; upstream_max_backoff_s caps each wait, upstream_max_attempts the count.
    with _stack(upstream_max_attempts=4, upstream_max_backoff_s=0.05) as stack:
        answer = _respond(stack.url, "storm")
    assert answer.status_code == 502
    assert (answer.json()["error_type"], answer.json()["upstream_status"]) == ("upstream_error", 429)
    assert len(stack.tap.bodies("/v1/chat/completions")) == 4


@pytest.mark.parametrize(
    ("text", "vllm", "error_type", "calls"),
    [("broken", {"upstream_max_attempts": 2}, "upstream_error", 2),
     ("storm", {"upstream_max_attempts": 2, "upstream_max_backoff_s": 0.05}, "upstream_error", 2),
     ("hang", {"timeout_s": 0.5}, "timeout", 1)],
    ids=["500", "429_burst", "hung"],
)
def test_agent_run_fails_typed_without_retrying_the_model_servers_502(text, vllm, error_type, calls):
    with _stack(agent=True, **vllm) as stack:
        answer = httpx.post(f"{stack.agent_url}/run", json=_row(text), timeout=60)
    assert answer.status_code == 502 and answer.json()["error_type"] == error_type, answer.text
    assert len(stack.tap.bodies("/v1/chat/completions")) == calls, "the model server's bound, not multiplied"


def test_other_upstream_4xx_is_passed_on_not_retried():
    with _stack() as stack:
        answer = _respond(stack.url, "missing model")
    assert answer.status_code == 404 and "does not exist" in answer.json()["detail"]
    assert len(stack.tap.bodies("/v1/chat/completions")) == 1


def test_upstream_rejecting_the_fleets_key_is_a_typed_502_not_the_callers_4xx():
    with _stack(agent=True) as stack:
        direct = _respond(stack.url, "wrong key")
        run = httpx.post(f"{stack.agent_url}/run", json=_row("wrong key"), timeout=60)
    for answer in (direct, run):
        assert answer.status_code == 502 and answer.json()["error_type"] == "auth_failed", answer.text
    assert "Incorrect API key" in direct.json()["detail"]
    assert len(stack.tap.bodies("/v1/chat/completions")) == 2, "not retried"


def test_hung_upstream_is_a_typed_timeout():
    with _stack(timeout_s=0.5) as stack:
        answer = _respond(stack.url, "hang")
    assert answer.status_code == 502 and answer.json()["error_type"] == "timeout"
    assert len(stack.tap.bodies("/v1/chat/completions")) == 1, "a timed-out generation is not sent again"


def test_dead_upstream_is_a_typed_connection_error():
    with _stack(base_url=f"http://127.0.0.1:{free_port()}/v1", upstream_max_attempts=3) as stack:
        answer = _respond(stack.url, "hello")
    assert answer.status_code == 502 and answer.json()["error_type"] == "connection_error"


# ------------------------------------------------------------------------------------------ chat pass-through


def test_chat_completions_passthrough():
    messages = [{"role": "user", "content": "ponder"}]
    with _stack() as stack:
        answer = httpx.post(f"{stack.url}/v1/chat/completions", json={"model": "judge", "messages": messages},
                            timeout=30).json()
    message = answer["choices"][0]["message"]
    assert message["content"] == "Done pondering." and message["reasoning_content"] == "Hmm."
    assert len(message["generation_token_ids"]) == len(message["generation_log_probs"]) > 0
    assert stack.tap.bodies("/v1/chat/completions")[0]["model"] == "policy-model"


@pytest.mark.parametrize(
    ("text", "vllm", "status", "error_type"),
    [("broken", {"upstream_max_attempts": 2}, 502, "upstream_error"), ("hang", {"timeout_s": 0.5}, 502, "timeout")],
    ids=["500", "hang"],
)
def test_chat_completions_passthrough_failures(text, vllm, status, error_type):
    with _stack(**vllm) as stack:
        answer = httpx.post(f"{stack.url}/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": text}]}, timeout=30)
    assert answer.status_code == status and answer.json()["error_type"] == error_type
