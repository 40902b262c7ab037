"""gymfleet.wire's request model: the fields gymfleet reads are validated, every other Responses parameter (the
`openai` package adds some with each release) is kept as sent, in a request and in a dataset row."""

from __future__ import annotations

import json

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
