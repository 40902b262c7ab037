"""vllm_model: the policy model server in front of vLLM (or any OpenAI Chat Completions upstream).

## What it does
`POST /v1/responses` converts the Responses request to Chat Completions (`gymfleet.convert`), calls
`POST {base_url}/chat/completions`, and converts the completion back to a Responses object. `POST
/v1/chat/completions` passes through (judges use it). `base_url` may be a list (one URL per vLLM data-parallel
rank): a rollout sticks to one upstream, chosen from its model-server session cookie.

With `return_token_id_information: true` the request asks for `logprobs`, `top_logprobs: 0` and
`return_tokens_as_token_ids`, prompt ids come from `POST {base without /v1}/tokenize`, and the last output item of
each call carries `prompt_token_ids`, `generation_token_ids` and `generation_log_probs` (equal lengths).

An upstream 400 about the context length or `max_tokens` becomes an empty completion with `finish_reason: length`
(the agent stops cleanly). 429 and 5xx are retried with backoff, a bounded number of times; what is left becomes a
502 naming the upstream.

## Config
See `VLLMModelConfig` (each field documents itself). `temperature` and `top_p` from the request are always
forwarded (NeMo-RL's server asserts them).

## Version history
- v1: Responses ⇄ Chat conversion, sticky routing, token capture, context-overflow handling.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gymfleet import http
from gymfleet.convert import chat_to_response, responses_to_chat
from gymfleet.errors import BadRequestError, UpstreamError
from gymfleet.model import ModelServer, ModelServerConfig
from gymfleet.sessions import session_id
from gymfleet.wire import ResponseCreateParams

UPSTREAM_RETRY = http.RetryPolicy(max_attempts=5, backoff_s=0.5, max_backoff_s=15.0,
                                  retry_statuses=frozenset({429, 500, 502, 503, 504, 520}))
CONTEXT_OVERFLOW_MARKERS = ("context length", "max_tokens", "maximum context")


class VLLMModelConfig(ModelServerConfig):
    """vllm_model's fields (NeMo-Gym's names)."""

    base_url: str | list[str]
    """Upstream `.../v1` URL, or one per data-parallel rank (a rollout sticks to one)."""
    api_key: str = "EMPTY"
    """Bearer token for the upstream (from env.yaml or `${oc.env:...}`; never logged)."""
    model: str = ""
    """Model name sent upstream (`${policy_model_name}` in recipes)."""
    return_token_id_information: bool = False
    """Capture prompt/generation token ids and logprobs for training."""
    uses_reasoning_parser: bool = False
    """The upstream splits reasoning into `reasoning_content`; prior `<think>` text is sent back that way."""
    uses_interleaved_reasoning: bool = True
    request_prompt_and_generation_token_ids: bool = False
    """Ask vLLM for `return_token_ids` instead of calling `/tokenize`."""
    preserve_reasoning_in_assistant_content: bool = False
    replace_developer_role_with_system: bool = False
    sequential_reasoning_allowed: bool = True
    is_responses_native: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    """Sent as `chat_template_kwargs` (merged under the request's `metadata.chat_template_kwargs`)."""
    extra_body: dict[str, Any] | None = None
    """Extra upstream body fields (the request's own fields win)."""
    sampling_overrides: dict[str, Any] | None = None
    """Applied last, over everything (e.g. force `temperature`)."""
    default_headers: dict[str, str] | None = None
    timeout_s: float = 900.0
    """Deadline for one upstream call."""


class VLLMModel(ModelServer):
    """Responses API in front of a Chat Completions upstream."""

    config: VLLMModelConfig

    @property
    def base_urls(self) -> list[str]:
        urls = self.config.base_url
        return [url.rstrip("/") for url in (urls if isinstance(urls, list) else [urls])]

    def _pick_base_url(self) -> str:
        urls = self.base_urls
        if len(urls) == 1:
            return urls[0]
        digest = hashlib.sha256(session_id().encode()).digest()
        return urls[int.from_bytes(digest[:8], "big") % len(urls)]

    def _chat_body(self, params: dict[str, Any]) -> dict[str, Any]:
        body = responses_to_chat(params, reasoning_as_content=not self.config.uses_reasoning_parser)
        if self.config.replace_developer_role_with_system:
            for message in body["messages"]:
                if message["role"] == "developer":
                    message["role"] = "system"
        metadata = params.get("metadata") or {}
        template_kwargs = {**(self.config.chat_template_kwargs or {}),
                           **_json_field(metadata, "chat_template_kwargs")}
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        body = {**(self.config.extra_body or {}), **_json_field(metadata, "extra_body"), **body}
        if self.config.model:
            body["model"] = self.config.model
        if self.config.return_token_id_information:
            body.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True)
            if self.config.request_prompt_and_generation_token_ids:
                body["return_token_ids"] = True
        body.update(self.config.sampling_overrides or {})
        return body

    async def _post(self, url: str, body: dict[str, Any]) -> http.HttpResponse:
        headers = {"Authorization": f"Bearer {self.config.api_key}", **(self.config.default_headers or {})}
        return await http.request("POST", url, json=body, headers=headers, timeout_s=self.config.timeout_s,
                                  retry=UPSTREAM_RETRY)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.config.model:
            body = {**body, "model": self.config.model}
        answer = await self._post(self._pick_base_url() + "/chat/completions", body)
        _raise_upstream(answer)
        return answer.json()

    async def responses(self, params: ResponseCreateParams, raw: dict[str, Any]) -> dict[str, Any]:
        base = self._pick_base_url()
        body = self._chat_body(raw)
        answer = await self._post(base + "/chat/completions", body)
        if answer.status == 400 and any(marker in answer.text for marker in CONTEXT_OVERFLOW_MARKERS):
            completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None},
                                       "finish_reason": "length"}], "usage": {}}
        else:
            _raise_upstream(answer)
            completion = answer.json()
            if self.config.return_token_id_information:
                await self._attach_tokens(base, body, completion)
        return chat_to_response(completion, raw, model=self.config.model or body.get("model") or "")

    async def _attach_tokens(self, base: str, body: dict[str, Any], completion: dict[str, Any]) -> None:
        choice = completion["choices"][0]
        message = choice["message"]
        if message.get("generation_token_ids") is not None:
            return
        if completion.get("prompt_token_ids") is not None and choice.get("token_ids") is not None:
            prompt_ids, generation_ids = completion["prompt_token_ids"], choice["token_ids"]
            logprobs = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or []]
        else:
            entries = (choice.get("logprobs") or {}).get("content") or []
            generation_ids = [_token_id(entry["token"]) for entry in entries]
            logprobs = [entry["logprob"] for entry in entries]
            tokenize_body = {key: body[key] for key in ("model", "messages", "tools", "chat_template_kwargs")
                             if key in body}
            tokenized = await self._post(base.removesuffix("/v1") + "/tokenize", tokenize_body)
            _raise_upstream(tokenized)
            prompt_ids = tokenized.json()["tokens"]
        if len(generation_ids) != len(logprobs):
            raise UpstreamError(f"upstream returned {len(generation_ids)} token ids but {len(logprobs)} logprobs",
                                url=base)
        message.update(prompt_token_ids=prompt_ids, generation_token_ids=generation_ids,
                       generation_log_probs=logprobs)


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise UpstreamError(f"upstream token {token[:40]!r} is not 'token_id:<int>': start vLLM with "
                            "return_tokens_as_token_ids support")
    return int(token.removeprefix("token_id:"))


def _json_field(metadata: dict[str, str], key: str) -> dict[str, Any]:
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


def _raise_upstream(answer: http.HttpResponse) -> None:
    if not answer.ok:
        raise UpstreamError(f"upstream {answer.url} answered {answer.status}: {answer.text[:500]}",
                            status=answer.status, url=answer.url, response_content=answer.body,
                            failure_class="upstream_error")
