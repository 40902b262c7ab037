"""NeMo-Gym's `nemo_gym.responses_converter.ResponsesConverter` on gymfleet's own Responses ⇄ Chat Completions
conversion (`gymfleet.serving.convert`, what gymfleet's model servers do in front of a Chat upstream).

- `responses_to_chat_completion_create_params(params)`: a `NeMoGymResponseCreateParamsNonStreaming` (the fields that
  were set, `None`s left out) as a `NeMoGymChatCompletionCreateParamsNonStreaming` whose `messages` are plain dicts:
  tool calls keep their ids and each `function_call_output` becomes a `tool` message with its `tool_call_id`;
  reasoning goes inline as `<think>…</think>`; an assistant turn without tool calls has no `tool_calls` key.
  What a Chat upstream cannot express is a `BadRequestError`, never dropped silently.
- `chat_completion_to_response(params, completion)`: a Chat completion (a dict or a `NeMoGymChatCompletion`) back as
  the `NeMoGymResponse` to the request `params`.

`return_token_id_information` is kept as given: gymfleet's conversion always carries the training token fields it
finds (`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`) on the assistant messages.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gymfleet.serving.convert import chat_to_response, responses_to_chat
from gymfleet.serving.nemo_gym_types import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)

__all__ = ["ResponsesConverter"]


def _plain(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True, exclude_unset=True)
    return dict(value)


class ResponsesConverter(BaseModel):
    """Responses ⇄ Chat Completions, as NeMo-Gym's model servers convert (see the module docstring)."""

    return_token_id_information: bool = False

    def responses_to_chat_completion_create_params(
        self, responses_create_params: NeMoGymResponseCreateParamsNonStreaming | dict[str, Any],
    ) -> NeMoGymChatCompletionCreateParamsNonStreaming:
        body = responses_to_chat(_plain(responses_create_params))
        for message in body.get("messages", []):
            if message.get("tool_calls") == []:
                del message["tool_calls"]
        return NeMoGymChatCompletionCreateParamsNonStreaming(**body)

    def chat_completion_to_response(self, responses_create_params: NeMoGymResponseCreateParamsNonStreaming |
                                    dict[str, Any], chat_completion: Any) -> NeMoGymResponse:
        plain, completion = _plain(responses_create_params), _plain(chat_completion)
        model = plain.get("model") or completion.get("model") or ""
        return NeMoGymResponse.model_validate(chat_to_response(completion, plain, model=model))
