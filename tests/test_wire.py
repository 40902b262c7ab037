"""gymfleet.wire's request model: the fields gymfleet reads are validated, every other Responses parameter (the
`openai` package adds some with each release) is kept as sent, in a request and in a dataset row."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from pydantic import ValidationError

from gymfleet.rollouts.prepare_data import check_row, placeholder_response
from gymfleet.testing import NEWER_RESPONSES_PARAMS, make_response
from gymfleet.wire import KNOWN_PARAMS, Response, ResponseCreateParams

NEWER_PARAMS = {**NEWER_RESPONSES_PARAMS, "a_parameter_from_a_future_release": {"any": ["json", 1]}}


def test_parameters_gymfleet_does_not_declare_are_kept_as_sent():
    params = ResponseCreateParams.model_validate({"input": "hi", "temperature": 0.5, **NEWER_PARAMS})
    assert params.model_extra == NEWER_PARAMS
    assert params.model_dump(exclude_none=True) == {"input": "hi", "temperature": 0.5, **NEWER_PARAMS}


def test_every_parameter_of_the_installed_openai_package_is_known():
    assert set(ResponseCreateParamsBase.__annotations__) <= KNOWN_PARAMS
    assert set(NEWER_PARAMS) - KNOWN_PARAMS == {"a_parameter_from_a_future_release"}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"input": 3}, "input"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"stream": True}, "stream"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
    ],
    ids=["temperature", "input", "tools", "stream", "max_output_tokens"],
)
def test_the_fields_gymfleet_reads_are_still_validated(params, field):
    with pytest.raises(ValidationError) as info:
        ResponseCreateParams.model_validate({"input": "hi", **NEWER_PARAMS, **params})
    assert info.value.errors()[0]["loc"][0] == field


def test_a_dataset_row_with_newer_parameters_passes_prepare_data_validation():
    line = json.dumps({"responses_create_params": {"input": [{"role": "user", "content": "Q"}], **NEWER_PARAMS}})
    row, reason = check_row(line, None, placeholder_response())
    assert reason is None
    assert row["responses_create_params"]["context_management"] == NEWER_PARAMS["context_management"]


def test_last_user_text_reads_content_parts():
    params = ResponseCreateParams(input=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
                                         {"role": "user", "content": [{"type": "input_text", "text": "second"}]}])
    assert params.last_user_text() == "second"
    assert ResponseCreateParams(input="only").last_user_text() == "only"
    assert ResponseCreateParams(input=[{"role": "system", "content": "s"}]).last_user_text() == ""


def test_last_message_text_is_the_last_assistant_message_only():
    response = Response.model_validate(make_response("final", reasoning="thinking"))
    assert response.last_message_text == "final"
    two = Response.model_validate({"output": [
        {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
         "content": [{"type": "output_text", "text": "first", "annotations": []}]},
        {"type": "message", "role": "assistant", "id": "m2", "status": "completed",
         "content": [{"type": "output_text", "text": "second", "annotations": []}]}]})
    assert two.last_message_text == "second" and two.output_text == "firstsecond"
    assert Response.model_validate({"output": []}).last_message_text == ""


# ---------------------------------------------------------------------------------------------- the openai shapes

_TEXT = {"type": "output_text", "text": "hi", "annotations": []}
_ANNOTATIONS = [
    {"type": "file_citation", "file_id": "f", "filename": "a.txt", "index": 1},
    {"type": "url_citation", "start_index": 0, "end_index": 2, "title": "t", "url": "https://x"},
    {"type": "container_file_citation", "container_id": "c", "file_id": "f", "filename": "a", "start_index": 0,
     "end_index": 1},
    {"type": "file_path", "file_id": "f", "index": 0},
]
_LOGPROBS = [{"token": "h", "bytes": [104], "logprob": -0.1, "top_logprobs": [{"token": "h", "bytes": [104],
                                                                                "logprob": -0.1}]}]
_MESSAGE = {"type": "message", "role": "assistant", "id": "m", "status": "completed", "content": [_TEXT]}
_CALL = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}
_REASONING = {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "s"}]}
_TOKENS = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.5]}
# Each item shape with every optional field, extras, aliases and the wrong values of each field's type.
ITEM_CASES = [
    _MESSAGE,
    {**_MESSAGE, "content": [{**_TEXT, "annotations": _ANNOTATIONS, "logprobs": _LOGPROBS}], "phase": "commentary"},
    {**_MESSAGE, "content": [{"type": "refusal", "refusal": "no"}, _TEXT], "extra_key": {"kept": 1}, **_TOKENS},
    {**_MESSAGE, "content": [{**_TEXT, "annotations": [{"type": "file_path", "file_id": "f"}]}]},
    {**_MESSAGE, "content": [{"type": "refusal"}]},
    {**_MESSAGE, "status": "done"},
    {**_MESSAGE, "role": "user"},
    {**_MESSAGE, "phase": "draft"},
    {**_MESSAGE, "content": [{**_TEXT, "logprobs": [{"token": "h"}]}]},
    {k: v for k, v in _MESSAGE.items() if k != "id"},
    _CALL,
    {**_CALL, "async": True, "caller": {"type": "direct"}, "namespace": "ns", "status": "completed", "id": "i"},
    {**_CALL, "async_": True, "caller": {"type": "program", "caller_id": "p"}},
    {**_CALL, "caller": {"type": "program"}},
    {**_CALL, "caller": None, "status": "bad", **_TOKENS},
    {**_CALL, "arguments": {"a": 1}},
    {**_CALL, **{**_TOKENS, "generation_log_probs": None}},
    _REASONING,
    {**_REASONING, "content": [{"type": "reasoning_text", "text": "t"}], "encrypted_content": "e",
     "status": "incomplete", "other": [1]},
    {**_REASONING, "summary": [{"type": "summary_text"}]},
    {**_REASONING, "content": [{"type": "summary_text", "text": "t"}]},
]


def _outcome(model: type, data: dict) -> object:
    try:
        item = model.model_validate(data)
    except ValidationError as exc:
        return [(error["loc"], error["type"]) for error in exc.errors()]
    return item.model_dump(), item.model_dump(by_alias=True, exclude_none=True), item.model_dump_json()


def test_the_item_models_validate_and_dump_as_the_openai_packages_do():
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseReasoningItem

    from gymfleet.wire import FunctionCall, OutputMessage, Reasoning, TokenFields

    class TheirMessage(ResponseOutputMessage, TokenFields): ...

    class TheirCall(ResponseFunctionToolCall, TokenFields): ...

    class TheirReasoning(ResponseReasoningItem, TokenFields): ...

    pairs = {"message": (OutputMessage, TheirMessage), "function_call": (FunctionCall, TheirCall),
             "reasoning": (Reasoning, TheirReasoning)}
    for ours, theirs in pairs.values():
        assert list(ours.model_fields) == list(theirs.model_fields)
        assert ours.model_config == theirs.model_config
    for case in ITEM_CASES:
        ours, theirs = pairs[case["type"]]
        assert _outcome(ours, case) == _outcome(theirs, case), case


def test_known_params_reads_the_openai_parameter_names_without_importing_openai():
    code = ("import sys; from gymfleet.wire import known_params; names = known_params(); "
            "print(sorted(names)); assert 'openai' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert frozenset(json.loads(result.stdout.replace("'", '"'))) == KNOWN_PARAMS
