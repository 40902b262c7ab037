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


RESPONSE_OUTPUT_BOUNDARY_TYPES = frozenset({
    "apply_patch_call", "code_interpreter_call", "computer_call", "custom_tool_call", "file_search_call",
    "function_call", "image_generation_call", "local_shell_call", "mcp_approval_request", "mcp_call", "mcp_list_tools",
    "reasoning", "shell_call", "tool_search_call", "web_search_call",
})
"""Item types only the model produces: the first one (or an assistant message) opens a turn's output."""


def split_responses_input_output_items(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """`(input, output)`: `items` cut before the first assistant message or model-produced item (NeMo-Gym 0.7.0's
    `nemo_gym.responses_converter.split_responses_input_output_items`); all input when there is none."""
    for at, item in enumerate(items or []):
        kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
        role = item.get("role") if isinstance(item, dict) else getattr(item, "role", None)
        if (kind == "message" and role == "assistant") or kind in RESPONSE_OUTPUT_BOUNDARY_TYPES:
            return list(items[:at]), list(items[at:])
    return list(items or []), []
