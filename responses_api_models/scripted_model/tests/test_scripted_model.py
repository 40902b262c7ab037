import json
import re
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gymfleet import http
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.testing import serve
from gymfleet.wire import Response
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig
from responses_api_models.scripted_model.tokenizer import (
    IM_END_ID,
    SPECIAL_IDS,
    SPECIAL_TOKENS,
    decode,
    encode,
    logprob,
    render_chat,
)

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                  "parameters": {"type": "object",
                                                                 "properties": {"city": {"type": "string"}}}}}
SCRIPT = {
    "name": "scripted_test",
    "model": "scripted-test",
    "max_model_len": 4096,
    "rules": [
        {"match": r"^Result:", "match_in": "last_message", "text": "It is sunny."},
        {"match": r"weather in \w+", "text": "Let me check.",
         "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                        {"name": "get_time", "arguments": '{"tz": "CET"}'}]},
        {"match": "cystic fibrosis", "reasoning": "It is genetic.", "text": "Let me think. \\boxed{B}"},
        {"match": "cystic", "text": "never given: the rule above matches first"},
        {"match": "SECRET-CODE", "match_in": "transcript", "text": "I remember the code."},
        {"match": "(?i)ramble", "text": "and so on " * 5, "finish_reason": "length"},
    ],
    "default": {"text": "I am not sure."},
}


@pytest.fixture(scope="module")
def client():
    with serve(ScriptedModel(SCRIPT).create_app()) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def chat(client: httpx.Client, messages: str | list, **fields) -> dict:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    answer = client.post("/v1/chat/completions", json={"model": "any", "messages": messages, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


# ------------------------------------------------------------------------------------------------ tokenizer


@pytest.mark.parametrize(
    "text",
    ["", "hello", "héllo wörld 🚀", "日本語のテキスト", "<|im_start|>user\nhi<|im_end|>\n", "<think>x</think>",
     "<|im_end", "a<<|endoftext|>>b", "<tool_call>\n{}\n</tool_call>", "\x00\t\r\n\ufeff"],
    ids=repr,
)
def test_tokenizer_round_trip(text):
    assert decode(encode(text)) == text


def test_tokenizer_ids():
    assert encode("A<|im_end|>é") == [65, SPECIAL_IDS["<|im_end|>"], 0xC3, 0xA9]
    assert sorted(SPECIAL_IDS.values()) == list(range(256, 256 + len(SPECIAL_TOKENS)))
    assert decode(encode("é")[:1]) == "\ufffd"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode([10_000])


def test_template_is_stable():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
    ]
    assert render_chat(messages, [WEATHER_TOOL]) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions. Available tools:\n<tools>\n"
        + json.dumps(WEATHER_TOOL, separators=(", ", ": ")) + "\n</tools><|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nUse the tool.\n</think>\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\nSunny<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chat(messages[:2], add_generation_prompt=False).endswith("Weather?<|im_end|>\n")


def test_logprob_is_deterministic_and_negative():
    assert logprob(65, 3) == logprob(65, 3) == -((65 * 7919 + 3) % 1000) / 1000 - 1e-3
    assert all(logprob(token, position) < 0 for token in range(263) for position in range(5))


# ------------------------------------------------------------------------------------------------ chat API


def test_prefix_contiguity_across_a_tool_conversation(client):
    token_fields = {"tools": [WEATHER_TOOL], "return_token_ids": True}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = chat(client, messages, **token_fields)
    message = first["choices"][0]["message"]
    messages += [message, *({"role": "tool", "tool_call_id": call["id"], "content": "Result: 21C"}
                            for call in message["tool_calls"])]
    second = chat(client, messages, **token_fields)
    assert second["choices"][0]["message"]["content"] == "It is sunny."
    expected_prefix = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][:len(expected_prefix)] == expected_prefix


@pytest.mark.parametrize("send_back", ["reasoning_content", "think_in_content"])
def test_prefix_contiguity_with_reasoning(client, send_back):
    messages = [{"role": "user", "content": "Explain cystic fibrosis."}]
    first = chat(client, messages, return_token_ids=True)
    message = first["choices"][0]["message"]
    assert message["reasoning_content"] == "It is genetic."
    if send_back == "think_in_content":  # what a client without a reasoning parser sends back
        message = {"role": "assistant", "content": f"<think>{message['reasoning_content']}</think>"
                   f"{message['content']}"}
    second = chat(client, [*messages, message, {"role": "user", "content": "Thanks"}], return_token_ids=True)
    expected_prefix = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][:len(expected_prefix)] == expected_prefix


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "Tell me about cystic fibrosis"}], "Let me think. \\boxed{B}"),
        ([{"role": "user", "content": "cystic acne?"}], "never given: the rule above matches first"),
        ([{"role": "user", "content": "weather in Oslo"}, {"role": "tool", "content": "Result: rain"}],
         "It is sunny."),
        ([{"role": "user", "content": "weather in Oslo"}, {"role": "tool", "content": "no result"}],
         "Let me check."),
        ([{"role": "system", "content": "SECRET-CODE"}, {"role": "user", "content": "hi"}],
         "I remember the code."),
        ([{"role": "user", "content": [{"type": "text", "text": "SECRET-CODE"}]}], "I remember the code."),
        ([{"role": "user", "content": "Result: 1"}, {"role": "assistant", "content": "ok"},
          {"role": "user", "content": "hello"}], "I am not sure."),
    ],
    ids=["last_user", "first_match_wins", "last_message", "last_message_no_match", "transcript", "text_parts",
         "default"],
)
def test_rule_matching(client, messages, expected):
    assert chat(client, messages)["choices"][0]["message"]["content"] == expected


def test_tool_calls_shape_and_ids(client):
    first, again = (chat(client, "weather in Paris?", tools=[WEATHER_TOOL]) for _ in range(2))
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check."
    calls = choice["message"]["tool_calls"]
    assert [(call["type"], call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {"tz": "CET"})]
    assert all(re.fullmatch(r"call_[0-9a-f]{8}", call["id"]) for call in calls)
    assert len({call["id"] for call in calls}) == 2
    assert [call["id"] for call in again["choices"][0]["message"]["tool_calls"]] == [call["id"] for call in calls]


def test_logprobs_with_token_id_strings(client):
    answer = chat(client, "hello", logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True,
                  return_token_ids=True)
    choice = answer["choices"][0]
    entries, token_ids = choice["logprobs"]["content"], choice["token_ids"]
    assert len(entries) == len(token_ids) == answer["usage"]["completion_tokens"]
    assert [entry["token"] for entry in entries] == [f"token_id:{token}" for token in token_ids]
    assert [entry["logprob"] for entry in entries] == [logprob(t, i) for i, t in enumerate(token_ids)]
    assert token_ids == encode("I am not sure.") + [IM_END_ID]
    assert answer["usage"]["prompt_tokens"] == len(answer["prompt_token_ids"])


def test_logprobs_with_token_text(client):
    choice = chat(client, "hello", logprobs=True)["choices"][0]
    assert "token_ids" not in choice
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert "".join(tokens) == "I am not sure.<|im_end|>"
    assert all(entry["top_logprobs"] == [] and entry["bytes"] for entry in choice["logprobs"]["content"])


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_cuts_the_generation(client, field):
    choice = chat(client, "weather in Paris", return_token_ids=True, **{field: 5})["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "Let m" and "tool_calls" not in choice["message"]
    assert choice["token_ids"] == encode("Let m")


def test_max_tokens_cuts_inside_reasoning(client):
    message = chat(client, "cystic fibrosis", max_tokens=6)["choices"][0]["message"]
    assert message["reasoning_content"] == "It i" and message["content"] == ""


def test_scripted_length_finish_has_no_end_token(client):
    choice = chat(client, "Please ramble", return_token_ids=True)["choices"][0]
    assert choice["finish_reason"] == "length" and IM_END_ID not in choice["token_ids"]


def test_unknown_fields_are_ignored(client):
    answer = chat(client, "hi", top_k=-1, top_p=1.0, temperature=1.0, chat_template_kwargs={"enable_thinking": 1},
                  required_prefix_token_ids=[1, 2], seed=3)
    assert answer["object"] == "chat.completion" and answer["model"] == "scripted-test"


def test_streaming_is_refused(client):
    answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "stream": True})
    assert answer.status_code == 400 and "stream" in answer.json()["error"]["message"]


def test_context_overflow_is_a_vllm_400():
    with serve(ScriptedModel({**SCRIPT, "max_model_len": 64}).create_app()) as url:
        answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 100}]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "context length" in error["message"] and error["type"] == "BadRequestError" and error["code"] == 400


def test_reasoning_parser_off_keeps_think_in_content():
    with serve(ScriptedModel({**SCRIPT, "reasoning_parser": False}).create_app()) as url:
        answer = httpx.post(f"{url}/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "cystic fibrosis"}]})
    message = answer.json()["choices"][0]["message"]
    assert message["content"] == "<think>\nIt is genetic.\n</think>\nLet me think. \\boxed{B}"
    assert "reasoning_content" not in message


# ------------------------------------------------------------------------------------------------ other routes


def test_tokenize_agrees_with_prompt_token_ids(client):
    messages = [{"role": "user", "content": "weather in Paris"}]
    answer = chat(client, messages, tools=[WEATHER_TOOL], return_token_ids=True)
    tokenized = client.post("/tokenize", json={"model": "m", "messages": messages, "tools": [WEATHER_TOOL],
                                               "chat_template_kwargs": {}}).json()
    assert tokenized["tokens"] == answer["prompt_token_ids"]
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == 4096
    bare = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert decode(bare["tokens"]) == "<|im_start|>user\nweather in Paris<|im_end|>\n"
    assert client.post("/tokenize", json={"prompt": "hé"}).json()["tokens"] == [104, 0xC3, 0xA9]


def test_models_route(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(model["id"], model["object"]) for model in models["data"]] == [("scripted-test", "model")]
    assert client.get("/").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": "hello"}),
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}),
        ("/v1/chat/completions", [1, 2]),
        ("/tokenize", {}),
        ("/tokenize", {"messages": [{"role": "user", "content": 5}]}),
        ("/v1/responses", {"input": 5}),
    ],
    ids=["messages_not_list", "no_role", "max_tokens_type", "no_messages", "bad_tool_call", "not_object",
         "tokenize_empty", "tokenize_bad_content", "responses_bad_input"],
)
def test_malformed_body_is_422(client, path, body):
    assert client.post(path, json=body).status_code == 422


def test_invalid_json_is_422(client):
    answer = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 422


async def test_responses_route_returns_a_valid_response():
    config = {**SCRIPT, "return_token_id_information": True}
    params = {"input": [{"role": "user", "content": "weather in Paris?"}],
              "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    with serve(ScriptedModel(config).create_app()) as url:
        try:
            first = (await http.request("POST", f"{url}/v1/responses", json=params)).json()
            followup = {**params, "input": [*params["input"], *first["output"],
                                            *({"type": "function_call_output", "call_id": item["call_id"],
                                               "output": "Result: 21C"} for item in first["output"]
                                              if item["type"] == "function_call")]}
            second = (await http.request("POST", f"{url}/v1/responses", json=followup)).json()
        finally:
            await http.close()
    response = Response.model_validate(first)
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert response.output_text == "Let me check." and response.model == "scripted-test"
    last = first["output"][-1]
    assert len(last["generation_token_ids"]) == len(last["generation_log_probs"]) > 0
    assert Response.model_validate(second).output_text == "It is sunny."
    expected_prefix = last["prompt_token_ids"] + last["generation_token_ids"]
    assert second["output"][-1]["prompt_token_ids"][:len(expected_prefix)] == expected_prefix


def test_responses_reasoning_and_length(client):
    answer = client.post("/v1/responses", json={"input": "cystic fibrosis", "max_output_tokens": 40})
    response = Response.model_validate(answer.json())
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].summary[0].text == "It is genetic."
    cut = Response.model_validate(client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2}).json())
    assert cut.status == "incomplete" and cut.incomplete_details["reason"] == "max_output_tokens"


# ------------------------------------------------------------------------------------------------ config


def test_bad_regex_names_the_rule():
    rules = [{"match": "fine", "text": "a"}, {"match": "(unclosed", "text": "b"}]
    with pytest.raises(ValidationError, match=r"rules\.1\.match[\s\S]*invalid regular expression '\(unclosed'"):
        ScriptedModel({"rules": rules})


@pytest.mark.parametrize(
    "rule",
    [
        {"match": "x", "finish_reason": "length", "tool_calls": [{"name": "f"}]},
        {"match": "x", "match_in": "first_user"},
        {"match": "x", "txt": "typo"},
    ],
    ids=["length_with_tool_calls", "unknown_on", "unknown_key"],
)
def test_bad_rule_is_a_config_error(rule):
    with pytest.raises(ValidationError, match=r"rules\.0"):
        ScriptedModelConfig(rules=[rule])


def test_shipped_config_validates_and_answers():
    """Loaded the way ng_run loads it (OmegaConf, YAML 1.1), not with a friendlier loader."""
    path = Path(__file__).parents[1] / "configs" / "scripted_model.yaml"
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=[f"+config_paths=[{path}]"],
                                                              skip_load_from_dotenv=True))
    fields = json.loads(json.dumps(config.instance("scripted_llm").fields))  # as the child process receives it
    with serve(ScriptedModel(fields).create_app()) as url, httpx.Client(base_url=url) as shipped:
        weather = chat(shipped, "What's the weather in Paris?")["choices"][0]["message"]
        assert weather["tool_calls"][0]["function"]["name"] == "get_weather"
        mcqa = chat(shipped, "Pick one:\nA) red\nB) blue")["choices"][0]["message"]
        assert mcqa["content"] == "The answer is \\boxed{A}."
        assert chat(shipped, "hello")["choices"][0]["message"]["content"] == "I am not sure."


def test_malformed_tool_arguments_are_sent_verbatim():
    """Real models emit broken JSON arguments; the script must be able to as well."""
    config = ScriptedModelConfig(rules=[{"match": "x", "tool_calls": [{"name": "f", "arguments": "{city: Paris"}]}])
    assert config.rules[0].tool_calls[0].arguments_json() == "{city: Paris"


# ------------------------------------------------------------------------------------------------ faults and turns

FAULTS = {
    "name": "faulty",
    "rules": [
        {"match": "burst", "status": 429, "fail_times": 2, "retry_after_s": 1.5, "text": "Through."},
        {"match": "down", "status": 503},
        {"match": "edge", "status": 520},
        {"match": "overflow", "status": 400, "error_message": "This model's maximum context length is 8 tokens."},
        {"match": "slow", "delay_s": 5, "text": "Eventually."},
        {"match": "step", "turn": 0, "tool_calls": [{"name": "a"}]},
        {"match": "step", "turn": 1, "tool_calls": [{"name": "b"}]},
        {"match": "step", "text": "All steps done."},
    ],
}


@pytest.fixture(scope="module")
def faulty():
    with serve(ScriptedModel(FAULTS).create_app()) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def _post(client: httpx.Client, text: str, path: str = "/v1/chat/completions") -> httpx.Response:
    body = {"input": text} if path == "/v1/responses" else {"messages": [{"role": "user", "content": text}]}
    return client.post(path, json=body)


def test_fail_times_fails_then_answers(faulty):
    answers = [_post(faulty, "burst") for _ in range(3)]
    assert [answer.status_code for answer in answers] == [429, 429, 200]
    assert answers[0].headers["retry-after"] == "1.5"
    assert answers[0].json() == {"error": {"message": "Too Many Requests (scripted fault)", "type": "RateLimitError",
                                           "param": None, "code": 429}}
    assert answers[2].json()["choices"][0]["message"]["content"] == "Through."
    assert _post(faulty, "burst").status_code == 200, "the rule keeps answering once its failures are spent"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_status_without_fail_times_fails_every_time(faulty, path):
    answers = [_post(faulty, "down", path) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [503] * 3
    assert "retry-after" not in answers[0].headers
    assert answers[0].json()["error"]["type"] == "ServiceUnavailableError"


def test_nonstandard_status(faulty):
    answer = _post(faulty, "edge")
    assert answer.status_code == 520 and answer.json()["error"]["message"] == "HTTP 520 (scripted fault)"


def test_error_message_mimics_vllm(faulty):
    answer = _post(faulty, "overflow")
    assert answer.status_code == 400 and "maximum context length" in answer.json()["error"]["message"]


def test_delay_outlasts_a_short_client_deadline(faulty):
    with pytest.raises(httpx.ReadTimeout):
        faulty.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "slow"}]}, timeout=0.3)


@pytest.mark.parametrize(
    ("assistant_turns", "expected"),
    [(0, ("a", None)), (1, ("b", None)), (2, (None, "All steps done."))],
    ids=["turn_0", "turn_1", "turn_2_falls_through"],
)
def test_turn_picks_the_step(faulty, assistant_turns, expected):
    messages = [{"role": "user", "content": "step"}]
    for turn in range(assistant_turns):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{turn}", "type": "function", "function": {"name": "a", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "ok"}]
    message = chat(faulty, messages)["choices"][0]["message"]
    name = message["tool_calls"][0]["function"]["name"] if message.get("tool_calls") else None
    assert (name, message["content"] or None) == expected


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": "x", "fail_times": 2}, "fail_times only apply to a failing rule: set `status`"),
        ({"match": "x", "retry_after_s": 1, "error_message": "m"}, "retry_after_s, error_message only apply"),
        ({"match": "x", "status": 200}, "greater than or equal to 400"),
        ({"match": "x", "status": 600}, "less than or equal to 599"),
        ({"match": "x", "status": 500, "fail_times": 0}, "greater than or equal to 1"),
        ({"match": "x", "delay_s": -1}, "greater than or equal to 0"),
        ({"match": "x", "turn": -1}, "greater than or equal to 0"),
        ({"match": "x", "fail_time": 2, "status": 500}, "Extra inputs are not permitted"),
    ],
    ids=["fail_times_without_status", "orphan_fault_fields", "status_too_low", "status_too_high", "zero_fail_times",
         "negative_delay", "negative_turn", "typo"],
)
def test_bad_fault_fields_are_config_errors(rule, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        ScriptedModelConfig(rules=[rule])
