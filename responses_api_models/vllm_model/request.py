"""The Chat Completions body vllm_model sends upstream (pure functions of the request and the config).

The converted request is `gymfleet.serving.convert.responses_to_chat` plus the Responses parameters Chat Completions
has under the same name (`chat_extras`: `store`, `service_tier`, `prompt_cache_key`, ...); a parameter the upstream
cannot honour (`background: true`, `previous_response_id`, `conversation`, `prompt`) is a 400, and any other one
(`include`, `truncation`, `context_management`, an unknown name) is dropped with one warning per name per process.
`metadata` is read here, not forwarded.

Precedence, lowest first: config `extra_body`, the request's `metadata.extra_body` (a JSON string), the converted
request itself; `chat_template_kwargs` merge key by key in the same order with config `chat_template_kwargs` between
the two extra bodies and `metadata.chat_template_kwargs` on top; then the config `model`, the token-capture flags,
and `sampling_overrides` last. `temperature` and `top_p` are forwarded whenever the request has them (NeMo-RL's
vLLM server asserts both on every call). A body asking for more than one choice or a stream is a 400.
"""

from __future__ import annotations

import json
from typing import Any

from gymfleet.errors import BadRequestError
from gymfleet.serving.convert import ReasoningMode, chat_extras, responses_to_chat, split_reasoning
from responses_api_models.vllm_model.config import VLLMModelConfig

CAPTURE_FLAGS = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}


def reasoning_mode(config: VLLMModelConfig) -> ReasoningMode:
    """Where prior turns' reasoning goes in the history sent upstream."""
    if not config.uses_interleaved_reasoning:
        return "drop"
    if config.preserve_reasoning_in_assistant_content or not config.uses_reasoning_parser:
        return "content"
    return "field"


def chat_body(params: dict[str, Any], config: VLLMModelConfig) -> dict[str, Any]:
    """Upstream body for a Responses request (`params`, the raw JSON dict)."""
    body = responses_to_chat(
        params, reasoning=reasoning_mode(config), developer_as_system=config.replace_developer_role_with_system
    )
    body.update(chat_extras(params, consumed=("metadata",)))
    metadata = params.get("metadata") or {}
    extra, template_kwargs = (_metadata_json(metadata, key) for key in ("extra_body", "chat_template_kwargs"))
    return _finish(body, config, extra, template_kwargs)


def passthrough_body(body: dict[str, Any], config: VLLMModelConfig) -> dict[str, Any]:
    """Upstream body for a `/v1/chat/completions` request (judges, Chat-speaking harnesses)."""
    return _finish(dict(body), config, {}, {})


def _finish(
    body: dict[str, Any], config: VLLMModelConfig, request_extra: dict[str, Any], request_kwargs: dict[str, Any]
) -> dict[str, Any]:
    config_extra = config.extra_body or {}
    template_kwargs = {
        **(config_extra.get("chat_template_kwargs") or {}),
        **(config.chat_template_kwargs or {}),
        **(request_extra.get("chat_template_kwargs") or {}),
        **(body.get("chat_template_kwargs") or {}),
        **request_kwargs,
    }
    body = {**config_extra, **request_extra, **body}
    if template_kwargs:
        body["chat_template_kwargs"] = template_kwargs
    if config.model:
        body["model"] = config.model
    if config.return_token_id_information:
        body.update(CAPTURE_FLAGS)
        if config.request_prompt_and_generation_token_ids:
            body["return_token_ids"] = True
    body.update(config.sampling_overrides or {})
    if body.get("n") not in (None, 1):
        raise BadRequestError(f"n must be 1 (one choice per call; send several requests instead), got {body['n']!r}")
    if body.get("stream"):
        raise BadRequestError("stream must be false: vllm_model reads whole answers from its upstream")
    return body


def _metadata_json(metadata: dict[str, str], key: str) -> dict[str, Any]:
    """`metadata[key]` parsed as a JSON object ({} when absent); anything else is the caller's error (400)."""
    value = metadata.get(key)
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"metadata.{key} must be a JSON object string: {exc}") from None
    if not isinstance(parsed, dict):
        raise BadRequestError(f"metadata.{key} must be a JSON object string, got {type(parsed).__name__}")
    return parsed


def ends_with_bare_reasoning(messages: list[dict[str, Any]]) -> bool:
    """Whether the conversation ends with an assistant message that has no answer text and no tool call."""
    if not messages or messages[-1].get("role") != "assistant" or messages[-1].get("tool_calls"):
        return False
    content = messages[-1].get("content")
    return not split_reasoning(content if isinstance(content, str) else "")[1].strip()
