"""vllm_model: the policy model server in front of vLLM (or any OpenAI Chat Completions upstream).

## What it does
`POST /v1/responses` converts the Responses request to a Chat Completions body (`gymfleet.convert`, then
`request.py`: metadata JSON, extra bodies, chat template kwargs, sampling overrides), calls
`POST {base_url}/chat/completions`, and converts the completion back to a Responses object. `POST
/v1/chat/completions` is a pass-through for judges and Chat-speaking harnesses (config `model`, extra bodies,
overrides and token capture applied the same way). `base_url` may be a list (one URL per vLLM data-parallel
rank): a rollout sticks to one upstream, chosen from its model-server session cookie
(`sha256(session id)[:8] mod len(base_url)`), so every turn of a rollout and its `/tokenize` calls hit one engine.

## Training (token capture)
With `return_token_id_information: true` the upstream is asked for `logprobs: true, top_logprobs: 0,
return_tokens_as_token_ids: true` (+ `return_token_ids` with `request_prompt_and_generation_token_ids`); prompt ids
come from `POST {base without /v1}/tokenize` (`{model, messages, tools, chat_template_kwargs}`) unless the answer
carries them. The last output item of each call gets `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs` (equal lengths; `tokens.py` rejects NaN logprobs and mismatches with a typed 502). Token
fields on input items travel upstream on the matching assistant message, so the engine can splice the exact prefix.

## Failures
- Upstream 400 about the context length or `max_tokens` → an empty answer with `incomplete_details.reason:
  max_output_tokens` and no token fields: the agent stops cleanly.
- 429/500/502/503/504 and refused connections → retried (`upstream_max_attempts`, exponential backoff with
  jitter, `Retry-After` honoured), then HTTP 502 `error_type: upstream_error` (or `connection_error`).
- No answer within `timeout_s` → HTTP 502 `error_type: timeout` (not retried: the engine may still be generating);
  likewise a connection dropped after the request was sent → HTTP 502 `error_type: connection_error`. `/tokenize`
  calls are idempotent and are retried after a dropped connection too.
- Upstream 401/403 (the configured `api_key` refused) → HTTP 502 `error_type: auth_failed`, not retried.
- Other upstream 4xx → passed on with their status; bad `metadata` JSON, `n > 1`, unsupported input → 400.

## Config
`VLLMModelConfig` (`config.py`; every field says why it exists).

## Version history
- v1: Responses ⇄ Chat conversion, sticky routing, token capture, context-overflow handling.
- v2: full NeMo-Gym reasoning options, bounded configurable retries, checked token data, chat pass-through with
  the same preprocessing.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from gymfleet import http
from gymfleet.convert import chat_to_response
from gymfleet.errors import UpstreamError
from gymfleet.model import ModelServer
from gymfleet.sessions import session_id
from gymfleet.wire import ResponseCreateParams
from responses_api_models.vllm_model.config import VLLMModelConfig
from responses_api_models.vllm_model.request import chat_body, ends_with_bare_reasoning, passthrough_body
from responses_api_models.vllm_model.tokens import capture_tokens
from responses_api_models.vllm_model.upstream import (
    RETRY_STATUSES,
    empty_completion,
    is_context_overflow,
    read_completion,
    read_json,
)

__all__ = ["VLLMModel", "VLLMModelConfig"]

TOKENIZE_FIELDS = ("model", "messages", "tools", "chat_template_kwargs", "mm_processor_kwargs",
                   "required_prefix_token_ids")


class VLLMModel(ModelServer):
    """Responses API (and a Chat Completions pass-through) in front of a Chat Completions upstream."""

    config: VLLMModelConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        urls = self.config.base_url
        self.base_urls = [url.rstrip("/") for url in (urls if isinstance(urls, list) else [urls])]
        self.retry = http.RetryPolicy(
            max_attempts=self.config.upstream_max_attempts,
            backoff_s=self.config.upstream_backoff_s,
            max_backoff_s=self.config.upstream_max_backoff_s,
            retry_statuses=RETRY_STATUSES,
        )
        # Tokenizing is a pure function of the body: safe to resend after a dropped connection.
        self.tokenize_retry = dataclasses.replace(self.retry, idempotent=True)
        self.headers = {"Authorization": f"Bearer {self.config.api_key}", **(self.config.default_headers or {})}

    def pick_base_url(self) -> str:
        """This rollout's upstream: stable for a model-server session, spread across sessions."""
        if len(self.base_urls) == 1:
            return self.base_urls[0]
        digest = hashlib.sha256(session_id().encode()).digest()
        return self.base_urls[int.from_bytes(digest[:8], "big") % len(self.base_urls)]

    async def responses(self, params: ResponseCreateParams, raw: dict[str, Any]) -> dict[str, Any]:
        body = chat_body(raw, self.config)
        completion = await self.complete(body)
        message = completion["choices"][0]["message"]
        if not self.config.uses_reasoning_parser and (message.get("reasoning_content") or message.get("reasoning")):
            raise UpstreamError(
                "the upstream answered with a separate reasoning field but uses_reasoning_parser is false; set "
                "uses_reasoning_parser: true (or start vLLM without --reasoning-parser)",
                url=self.pick_base_url(), failure_class="upstream_config_mismatch",
            )
        return chat_to_response(completion, raw, model=self.config.model or body.get("model") or "")

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.complete(passthrough_body(body, self.config))

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One upstream Chat completion for `body` (token fields on its message in training mode)."""
        model = body.get("model") or ""
        if not self.config.sequential_reasoning_allowed and ends_with_bare_reasoning(body["messages"]):
            return empty_completion("content_filter", model)
        base = self.pick_base_url()
        answer = await self._post(base + "/chat/completions", body)
        if is_context_overflow(answer):
            return empty_completion("length", model)
        completion = read_completion(answer)
        if self.config.return_token_id_information:
            message = completion["choices"][0]["message"]
            message.update(await capture_tokens(completion, lambda: self._tokenize(base, body), url=answer.url))
        return completion

    async def _tokenize(self, base: str, body: dict[str, Any]) -> list[int]:
        tokenize_body = {key: body[key] for key in TOKENIZE_FIELDS if key in body}
        answer = await self._post(base.removesuffix("/v1") + "/tokenize", tokenize_body, retry=self.tokenize_retry)
        tokenized = read_json(answer) if answer.ok else None
        tokens = tokenized.get("tokens") if isinstance(tokenized, dict) else None
        if tokens is None:
            # Not the caller's fault whatever the status (an upstream without vLLM's /tokenize answers 404): a 502.
            raise UpstreamError(
                f"upstream {answer.url} answered {answer.status} without `tokens` ({answer.text[:200]!r}); token "
                "capture needs vLLM's /tokenize, or request_prompt_and_generation_token_ids: true",
                url=answer.url, failure_class="upstream_bad_response",
            )
        return tokens

    async def _post(self, url: str, body: dict[str, Any], retry: http.RetryPolicy | None = None) -> http.HttpResponse:
        return await http.request("POST", url, json=body, headers=self.headers, timeout_s=self.config.timeout_s,
                                  retry=retry or self.retry)
