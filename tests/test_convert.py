"""gymfleet.serving.convert: every Responses ⇄ Chat Completions rule, as tables."""

from __future__ import annotations

import doctest
import json
import logging
import re

import pytest

import gymfleet.serving.convert
from gymfleet.errors import BadRequestError
from gymfleet.serving.convert import chat_extras, chat_to_response, place_reasoning, responses_to_chat, split_reasoning
from gymfleet.testing import NEWER_RESPONSES_PARAMS
from gymfleet.wire import Response

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]}
USER = {"role": "user", "content": "Q"}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]}
ANSWER = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
          "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
CALL_OUT = {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature": 21}'}
CHAT_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_MSG = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                 "parameters": WEATHER["parameters"]}}


# ------------------------------------------------------------------------------------------ Responses → Chat messages


@pytest.mark.parametrize(
    ("params", "options", "expected"),
    [
        ({"input": "hi"}, {}, [{"role": "user", "content": "hi"}]),
        ({"input": [USER], "instructions": "Be brief."}, {},
         [{"role": "system", "content": "Be brief."}, USER]),
        ({"input": [{"role": "system", "content": "S"}, {"role": "developer", "content": "D"}, USER],
          "instructions": "Be brief."}, {},
         [{"role": "system", "content": "Be brief.\n\nS\n\nD"}, USER]),
        ({"input": [USER, {"role": "developer", "content": "D"}]}, {},
         [USER, {"role": "developer", "content": "D"}]),
        ({"input": [USER, {"role": "developer", "content": "D"}]}, {"developer_as_system": True},
         [USER, {"role": "system", "content": "D"}]),
        ({"input": [USER, REASONING, ANSWER, CALL, CALL_OUT]}, {},
         [USER, {"role": "assistant", "content": "<think>plan</think>Checking.", "tool_calls": [CHAT_CALL]},
          TOOL_MSG]),
        ({"input": [USER, REASONING, ANSWER, CALL, CALL_OUT]}, {"reasoning": "field"},
         [USER, {"role": "assistant", "content": "Checking.", "tool_calls": [CHAT_CALL], "reasoning_content": "plan",
                 "reasoning": "plan"}, TOOL_MSG]),
        ({"input": [USER, REASONING, ANSWER, CALL, CALL_OUT]}, {"reasoning": "drop"},
         [USER, {"role": "assistant", "content": "Checking.", "tool_calls": [CHAT_CALL]}, TOOL_MSG]),
        ({"input": [USER, {"role": "assistant", "content": "<think>plan</think>Answer"}]}, {"reasoning": "field"},
         [USER, {"role": "assistant", "content": "Answer", "reasoning_content": "plan", "reasoning": "plan"}]),
        ({"input": [USER, {"role": "assistant", "content": "<think>plan</think>Answer"}]}, {"reasoning": "drop"},
         [USER, {"role": "assistant", "content": "Answer"}]),
        ({"input": [USER, {"role": "assistant", "content": "<think>plan</think>Answer"}]}, {},
         [USER, {"role": "assistant", "content": "<think>plan</think>Answer"}]),
        ({"input": [USER, REASONING, {"role": "assistant", "content": "<think>more</think>Answer"}]},
         {"reasoning": "field"},
         [USER, {"role": "assistant", "content": "Answer", "reasoning_content": "plan\nmore",
                 "reasoning": "plan\nmore"}]),
        ({"input": [USER, {**REASONING, "summary": []}, ANSWER]}, {},
         [USER, {"role": "assistant", "content": "Checking."}]),
        ({"input": [USER, CALL, CALL_OUT, {**CALL, "call_id": "call_2"},
                    {**CALL_OUT, "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]}]}, {},
         [USER, {"role": "assistant", "content": "", "tool_calls": [CHAT_CALL]}, TOOL_MSG,
          {"role": "assistant", "content": "", "tool_calls": [{**CHAT_CALL, "id": "call_2"}]},
          {"role": "tool", "tool_call_id": "call_2", "content": "rain"}]),
        ({"input": [USER, ANSWER, CALL, {**CALL, "call_id": "call_2"}]}, {},
         [USER, {"role": "assistant", "content": "Checking.",
                 "tool_calls": [CHAT_CALL, {**CHAT_CALL, "id": "call_2"}]}]),
        ({"input": [{"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]}, {},
         [{"role": "user", "content": "ab"}]),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                 {"type": "input_image", "image_url": "data:image/png;base64,AA",
                                                  "detail": "low"}]}]}, {},
         [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                       {"type": "image_url",
                                        "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}}]}]),
    ],
    ids=["string_input", "instructions", "instructions_fold_leading_system_and_developer", "mid_developer_kept",
         "developer_as_system", "merge_assistant_side_think_in_content", "merge_reasoning_field",
         "merge_reasoning_drop",
         "think_in_content_moves_to_field", "think_in_content_dropped", "think_in_content_kept",
         "reasoning_item_and_inline_think", "empty_reasoning_skipped", "tool_turns_stay_separate",
         "parallel_calls_in_one_message", "text_parts_join", "image_parts"],
)
def test_responses_to_chat_messages(params, options, expected):
    assert responses_to_chat(params, **options)["messages"] == expected


@pytest.mark.parametrize(
    ("items", "carrier"),
    [
        ([USER, {**CALL, **TOKENS}, CALL_OUT], 1),
        ([USER, REASONING, {**ANSWER, **TOKENS}], 1),
        ([USER, {**ANSWER, **TOKENS}, CALL_OUT, {"role": "user", "content": "again"}, {**ANSWER, **TOKENS}], 1),
    ],
    ids=["on_function_call", "on_message_after_reasoning", "each_turn_its_own"],
)
def test_token_fields_travel_on_the_assistant_message(items, carrier):
    messages = responses_to_chat({"input": items}, reasoning="field")["messages"]
    assert {name: messages[carrier][name] for name in TOKENS} == TOKENS
    assert [index for index, message in enumerate(messages) if "prompt_token_ids" in message][0] == carrier
    assert all("prompt_token_ids" not in message for message in messages if message["role"] != "assistant")


# ------------------------------------------------------------------------------------------ Responses → Chat fields


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False},
         {"tools": [CHAT_WEATHER], "tool_choice": "auto", "parallel_tool_calls": False}),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}},
         {"tools": [CHAT_WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ({"tools": [{"type": "function", "name": "f"}]},
         {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                 "properties": {}}}}]}),
        ({"tools": [], "tool_choice": "required", "parallel_tool_calls": True}, {}),
        ({"max_output_tokens": 64}, {"max_tokens": 64}),
        ({"reasoning": {"effort": "high"}}, {"reasoning_effort": "high"}),
        ({"reasoning": {"summary": "auto"}}, {}),
        ({"temperature": 0.0, "top_p": 1.0}, {"temperature": 0.0, "top_p": 1.0}),
        ({"temperature": 0.7}, {"temperature": 0.7}),
        ({"model": "m", "user": "u"}, {"model": "m", "user": "u"}),
        ({"top_logprobs": 3}, {"logprobs": True, "top_logprobs": 3}),
        ({"text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}}},
         {"response_format": {"type": "json_schema",
                              "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}}}),
        ({"text": {"format": {"type": "json_object"}}}, {"response_format": {"type": "json_object"}}),
        ({"text": {"format": {"type": "text"}}}, {}),
        ({"metadata": {"a": "b"}, "store": True, "truncation": "auto", "include": []}, {}),
    ],
    ids=["tools_flatten_strict_dropped", "tool_choice_function", "tool_without_parameters",
         "no_tools_drops_choice_and_parallel", "max_output_tokens", "reasoning_effort", "reasoning_without_effort",
         "temperature_zero_and_top_p_forwarded", "temperature_only", "model_and_user", "top_logprobs",
         "json_schema_format", "json_object_format", "text_format", "responses_only_fields_not_sent"],
)
def test_responses_to_chat_fields(params, expected):
    body = responses_to_chat({"input": "hi", **params})
    assert {key: value for key, value in body.items() if key != "messages"} == expected


def test_docstring_examples():
    assert doctest.testmod(gymfleet.serving.convert).failed == 0


NEWER_PARAMS = NEWER_RESPONSES_PARAMS  # parameters of the Responses API gymfleet's own model does not declare


@pytest.fixture
def warned(monkeypatch, caplog) -> pytest.LogCaptureFixture:
    """Captures the drop warnings logged from now on (the once-per-process memory starts empty)."""
    monkeypatch.setattr(gymfleet.serving.convert, "_warned_dropped", set())
    caplog.set_level(logging.WARNING, logger="gymfleet.serving.convert")
    return caplog


def test_newer_parameters_are_forwarded_when_chat_has_them_else_dropped_with_one_warning_each(warned):
    params = {"input": "hi", "temperature": 0.5, "store": False, "safety_identifier": "u1", "prompt_cache_key": "k",
              "truncation": "auto", "include": ["reasoning.encrypted_content"], "max_tool_calls": None, **NEWER_PARAMS}
    forwarded = {"store": False, "safety_identifier": "u1", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
                 "prompt_cache_options": {"ttl": "30m"}, "moderation": {"model": "omni-moderation-latest"}}
    assert chat_extras(params) == forwarded
    assert chat_extras(params) == forwarded
    dropped = ["truncation", "include", "context_management", "stream_options", "image", "access_programs",
               "background_options"]
    assert sorted(re.search(r"parameter '(\w+)'", message)[1] for message in warned.messages) == sorted(dropped)
    assert all("Chat Completions has no equivalent" in message for message in warned.messages)


def test_an_unknown_parameter_is_dropped_with_a_did_you_mean(warned):
    assert chat_extras({"input": "hi", "temprature": 0.2, "metadata": {"a": "b"}}, consumed=("metadata",)) == {}
    [message] = warned.messages
    assert "'temprature'" in message and "Did you mean 'temperature'?" in message


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stream": True}, "stream=true cannot be served"),
        ({"background": True}, "background=true cannot be served"),
        ({"previous_response_id": "resp_1"}, "previous_response_id=\"resp_1\" cannot be served: no responses"),
        ({"conversation": "conv_1"}, "conversation=\"conv_1\" cannot be served"),
        ({"prompt": {"id": "pmpt_1"}}, "put the text in `instructions` or `input`"),
    ],
    ids=["stream", "background", "previous_response_id", "conversation", "stored_prompt"],
)
def test_what_a_chat_upstream_cannot_honour_is_a_bad_request(params, message):
    with pytest.raises(BadRequestError, match=re.escape(message)):
        chat_extras({"input": "hi", **params})


def test_unset_parameters_are_neither_sent_nor_refused(warned):
    unset = {"stream": False, "background": False, "previous_response_id": None, "conversation": None, "prompt": None,
             "include": [], "truncation": None, "store": None, "service_tier": None, "metadata": None}
    assert chat_extras({"input": "hi", **unset}) == {}
    assert warned.messages == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input item of type 'web_search_call'"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "content part of type 'input_file'"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tool of type 'web_search'"),
    ],
    ids=["hosted_tool_item", "file_part", "hosted_tool"],
)
def test_what_chat_cannot_express_is_a_bad_request(params, message):
    with pytest.raises(BadRequestError, match=re.escape(message)):
        responses_to_chat(params)


@pytest.mark.parametrize(
    ("content", "thoughts", "mode", "expected"),
    [
        ("Hi", ["a", "b"], "content", {"content": "<think>a</think><think>b</think>Hi"}),
        ("Hi", [], "field", {"content": "Hi"}),
        ("<think>a</think>Hi", ["r"], "field", {"content": "Hi", "reasoning_content": "r\na", "reasoning": "r\na"}),
        ("<think>a</think>Hi", ["r"], "drop", {"content": "Hi"}),
        ("a</think>Hi", [], "field", {"content": "Hi", "reasoning_content": "a", "reasoning": "a"}),
    ],
    ids=["content", "field_without_reasoning", "field", "drop", "field_unopened_think"],
)
def test_place_reasoning(content, thoughts, mode, expected):
    assert place_reasoning({"role": "assistant", "content": content}, thoughts, mode) == {"role": "assistant",
                                                                                           **expected}


@pytest.mark.parametrize(
    ("content", "reasoning", "expected"),
    [
        ("Answer", None, ([], "Answer")),
        ("  Answer  ", None, ([], "  Answer  ")),
        ("<think>\nplan\n</think>\n\nAnswer", None, (["plan"], "Answer")),
        ("<think>a</think><think>b</think>Answer", None, (["a", "b"], "Answer")),
        ("plan</think>Answer", None, (["plan"], "Answer")),
        ("Answer", "plan", (["plan"], "Answer")),
        ("<think></think>Answer", None, ([], "Answer")),
        (None, None, ([], "")),
    ],
    ids=["plain", "plain_untouched", "one_block", "two_blocks", "unopened", "reasoning_field", "empty_block", "none"],
)
def test_split_reasoning(content, reasoning, expected):
    assert split_reasoning(content, reasoning) == expected


# ------------------------------------------------------------------------------------------ Chat → Responses


def _completion(message: dict, finish_reason: str = "stop", usage: dict | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "up",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
            "usage": usage if usage is not None else {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}


def _shape(output: list[dict]) -> list[tuple]:
    """(type, text-or-name) per output item."""
    shapes = []
    for item in output:
        if item["type"] == "reasoning":
            shapes.append(("reasoning", tuple(part["text"] for part in item["summary"])))
        elif item["type"] == "message":
            shapes.append(("message", item["content"][0]["text"]))
        else:
            shapes.append(("function_call", item["name"], item["arguments"]))
    return shapes


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"content": "Hello"}, [("message", "Hello")]),
        ({"content": "Hello", "reasoning_content": "plan"}, [("reasoning", ("plan",)), ("message", "Hello")]),
        ({"content": "Hello", "reasoning": "plan"}, [("reasoning", ("plan",)), ("message", "Hello")]),
        ({"content": "<think>a</think>\n<think>b</think>\nHello"}, [("reasoning", ("a", "b")), ("message", "Hello")]),
        ({"content": "a</think>Hello"}, [("reasoning", ("a",)), ("message", "Hello")]),
        ({"content": None, "reasoning_content": "plan"}, [("reasoning", ("plan",))]),
        ({"content": None}, [("message", "")]),
        ({"content": None, "tool_calls": [CHAT_CALL]}, [("function_call", "get_weather", '{"city": "Paris"}')]),
        ({"content": "Checking.", "tool_calls": [CHAT_CALL, {**CHAT_CALL, "id": "call_2"}]},
         [("message", "Checking."), ("function_call", "get_weather", '{"city": "Paris"}'),
          ("function_call", "get_weather", '{"city": "Paris"}')]),
        ({"content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
         [("function_call", "f", '{"x": 1}')]),
    ],
    ids=["text", "reasoning_content", "reasoning_field", "think_blocks_one_item", "unopened_think",
         "reasoning_only_no_empty_message", "empty", "tool_call_only", "text_and_calls", "dict_arguments"],
)
def test_chat_to_response_output(message, expected):
    response = chat_to_response(_completion(message), {"input": "hi"}, model="policy")
    assert _shape(response["output"]) == expected
    Response.model_validate(response)
    assert response["model"] == "policy" and response["object"] == "response"
    assert re.fullmatch(r"resp_[0-9a-f]{32}", response["id"])


def test_chat_to_response_ids():
    message = {"content": "x", "reasoning_content": "r", "tool_calls": [CHAT_CALL, {**CHAT_CALL, "id": None}]}
    output = chat_to_response(_completion(message), {}, model="m")["output"]
    assert re.fullmatch(r"rs_[0-9a-f]+", output[0]["id"]) and re.fullmatch(r"msg_[0-9a-f]+", output[1]["id"])
    assert output[2]["id"] == output[2]["call_id"] == "call_1"
    assert output[3]["id"] == output[3]["call_id"] and output[3]["call_id"].startswith("call_")


@pytest.mark.parametrize(
    ("finish_reason", "status", "incomplete"),
    [("stop", "completed", None), ("tool_calls", "completed", None),
     ("length", "incomplete", {"reason": "max_output_tokens"}),
     ("content_filter", "incomplete", {"reason": "content_filter"})],
    ids=["stop", "tool_calls", "length", "content_filter"],
)
def test_chat_to_response_finish_reason(finish_reason, status, incomplete):
    response = chat_to_response(_completion({"content": "x"}, finish_reason), {}, model="m")
    assert (response["status"], response["incomplete_details"]) == (status, incomplete)


@pytest.mark.parametrize(
    ("message", "carrier"),
    [
        ({"content": "Hello", "reasoning_content": "r", **TOKENS}, 1),
        ({"content": "Hi", "tool_calls": [CHAT_CALL], **TOKENS}, 1),
        ({"content": None, "reasoning_content": "r", **TOKENS}, 0),
        ({"content": None, **TOKENS}, 0),
    ],
    ids=["reasoning_and_message", "message_and_call", "reasoning_only", "empty"],
)
def test_token_fields_land_on_the_last_output_item(message, carrier):
    output = chat_to_response(_completion(message), {}, model="m")["output"]
    assert carrier == len(output) - 1
    assert {name: output[carrier][name] for name in TOKENS} == TOKENS
    assert all("prompt_token_ids" not in item for item in output[:carrier])


def test_partial_token_fields_are_not_attached():
    output = chat_to_response(_completion({"content": "x", "prompt_token_ids": [1]}), {}, model="m")["output"]
    assert "prompt_token_ids" not in output[0]


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
         {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 8}),
        ({"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4},
          "completion_tokens_details": {"reasoning_tokens": 2}},
         {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
          "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 8}),
        ({}, {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}),
    ],
    ids=["plain", "details", "missing"],
)
def test_chat_to_response_usage(usage, expected):
    assert chat_to_response(_completion({"content": "x"}, usage=usage), {}, model="m")["usage"] == expected


def test_chat_to_response_echoes_the_request():
    params = {"input": "hi", "instructions": "I", "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 9,
              "tools": [WEATHER], "metadata": {"k": "v"}, "reasoning": {"effort": "low"}}
    response = chat_to_response(_completion({"content": "x"}), params, model="m")
    echoed = {key: value for key, value in params.items() if key != "input"}
    assert {key: response[key] for key in echoed} == echoed
    assert response["tool_choice"] == "auto" and response["parallel_tool_calls"] is True
    assert response["created_at"] == 7


@pytest.mark.parametrize("mode", ["content", "field"])
def test_round_trip_reproduces_the_assistant_message(mode):
    """What the model said comes back unchanged as history (the basis of prefix contiguity)."""
    message = {"content": "Checking.", "reasoning_content": "plan", "tool_calls": [CHAT_CALL]}
    output = chat_to_response(_completion(message), {}, model="m")["output"]
    history = responses_to_chat({"input": [USER, *output]}, reasoning=mode)["messages"][1]
    assert history["tool_calls"] == [CHAT_CALL]
    if mode == "field":
        assert (history["content"], history["reasoning_content"]) == ("Checking.", "plan")
    else:
        assert history["content"] == "<think>plan</think>Checking."
    assert json.loads(history["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
