"""openai_model: a model server that passes requests through to any OpenAI-compatible endpoint.

## What it does
Serves a policy or judge model from a hosted API (OpenAI, an NVIDIA-hosted endpoint, a remote vLLM or SGLang)
without `vllm_model`'s training extras (no token ids, no sticky data-parallel routing): training token fields on
`input` items (a transcript from a training rollout) are dropped before sending, as hosted APIs reject unknown item
fields. The model name is replaced by the configured `model` on every upstream call (the request's own is kept
when `model` is empty).

- `is_responses_native: true` (default): `POST /v1/responses` posts the request to `{base_url}/responses` as sent
  (every parameter, those gymfleet does not know included: the upstream judges them), `extra_body` merged under it,
  and returns the upstream's Responses object once it validates as `gymfleet.wire.Response`. `background: true` is a
  400: the answer to this request is returned, there is no background job to poll for.
- `is_responses_native: false` (endpoints without the Responses API): the request is converted to Chat Completions
  (`gymfleet.serving.convert.responses_to_chat`, plus `chat_extras`: other parameters forwarded, dropped with a warning
  or refused with a 400; reasoning goes back as `<think>` text), posted to `{base_url}/chat/completions`, and the
  completion converted back (`chat_to_response`).

Failures: failures to connect and 429/5xx answers are retried with exponential backoff, `max_attempts` tries in
all (a call whose connection dropped after it was sent is not: the upstream may have run it, and bills it); what is
left is a 502 naming the upstream (`error_type` `upstream_error`, `connection_error` or `timeout`). Any
401/403 (the configured key refused) is a 502 `error_type: auth_failed`, not the caller's fault; any other 4xx
is: it comes back with the same status and the upstream's error message.

The API key is a pydantic `SecretStr`. It is only ever sent in the `Authorization: Bearer` header (none is sent when
it is empty): the config's `repr` shows `**********`, nothing is logged with it, and an upstream error message that
echoes it has it replaced by `****` before it reaches a log line or an error body.

## Config
See `OpenAIModelConfig` (each field documents itself). The canonical names are `base_url`, `api_key` and `model`;
NeMo-Gym's `openai_base_url`, `openai_api_key` and `openai_model` are accepted as aliases (give one or the other).
`configs/openai_model.yaml` wires them to `${policy_base_url}`, `${policy_api_key}` and `${policy_model_name}`,
usually set in env.yaml, e.g. `policy_api_key: ${oc.env:OPENAI_API_KEY}`.

## Routes
- `POST /v1/responses`: a `ResponseCreateParams` body; a Responses object back.
- `POST /v1/chat/completions`: passed through to `{base_url}/chat/completions` (model substituted, `extra_body` not
  applied); `stream: true` is a 400.
- `GET /` liveness and `GET /metrics`, from the base server.

## Version history
- v1: initial: Responses-native and Chat-converted modes, chat pass-through, bounded retries, secret API key.
- v2: training token fields on input items are not sent upstream.
"""

from __future__ import annotations

import functools
import logging
from typing import Annotated, Any

import orjson
from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, ValidationError

from gymfleet import http
from gymfleet.errors import BadRequestError, UpstreamError
from gymfleet.serving.convert import chat_extras, chat_to_response, responses_to_chat
from gymfleet.serving.model import ModelServer, ModelServerConfig
from gymfleet.wire import TOKEN_FIELDS, Response, ResponseCreateParams

log = logging.getLogger(__name__)

# 520-529 are Cloudflare's origin errors and "overloaded", which hosted APIs behind it answer under load.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 520, 522, 524, 529})


def _secret_str(value: Any) -> Any:
    # A numeric key in YAML would otherwise fail validation with the value quoted in the error message.
    return str(value) if isinstance(value, int | float) else value


class OpenAIModelConfig(ModelServerConfig):
    """openai_model's fields (NeMo-Gym's `openai_*` names are accepted as aliases)."""

    base_url: str = Field(validation_alias=AliasChoices("base_url", "openai_base_url"))
    """Upstream URL up to and including the API version, e.g. `https://api.openai.com/v1`."""
    api_key: Annotated[SecretStr, BeforeValidator(_secret_str)] = Field(
        default=SecretStr(""), validation_alias=AliasChoices("api_key", "openai_api_key")
    )
    """Bearer token (`${policy_api_key}` or `${oc.env:OPENAI_API_KEY}`); never logged. Empty: no header is sent."""
    model: str = Field(default="", validation_alias=AliasChoices("model", "openai_model"))
    """Model name sent upstream in place of the request's (`${policy_model_name}`); empty keeps the request's."""
    is_responses_native: bool = True
    """Post `/v1/responses` requests to `{base_url}/responses` as they are; false converts them to Chat Completions
    for endpoints that only serve `{base_url}/chat/completions`."""
    drop_input_reasoning_items: bool = False
    """Remove `reasoning` items from the request's `input` before sending it. Workaround for endpoints that reject
    them, e.g. ones that 500 with KeyError 'content' on a reasoning item from an earlier turn."""
    extra_body: dict[str, Any] | None = None
    """Fields merged under every body sent for `/v1/responses` (the request's own fields win), e.g.
    `{store: false}`. In Chat mode they go into the Chat body."""
    default_headers: dict[str, str] | None = None
    """Extra headers on every upstream call (e.g. an organization or routing header); they may override
    `Authorization`. Keep secrets in `api_key`: header values are not masked."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Deadline for one upstream attempt, connect included."""
    max_attempts: int = Field(default=5, ge=1)
    """Tries per upstream call, the first included; failures to connect and 429/5xx answers are retried."""


class OpenAIModel(ModelServer):
    """Passes `/v1/responses` and `/v1/chat/completions` through to an OpenAI-compatible endpoint."""

    config: OpenAIModelConfig

    @functools.cached_property
    def base_url(self) -> str:
        return self.config.base_url.rstrip("/")

    @functools.cached_property
    def _headers(self) -> dict[str, str]:
        key = self.config.api_key.get_secret_value()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return {**headers, **(self.config.default_headers or {})}

    @functools.cached_property
    def _retry(self) -> http.RetryPolicy:
        return http.RetryPolicy(
            max_attempts=self.config.max_attempts, backoff_s=0.5, max_backoff_s=15.0, retry_statuses=RETRY_STATUSES
        )

    async def startup(self) -> None:
        log.info(
            "%s: %s model %r via %s",
            self.config.name or type(self).__name__,
            "Responses API" if self.config.is_responses_native else "Chat Completions",
            self.config.model or "<from the request>",
            self.base_url,
        )

    async def responses(self, params: ResponseCreateParams, raw: dict[str, Any]) -> dict[str, Any]:
        if raw.get("background"):
            raise BadRequestError("background: true cannot be served: openai_model returns the upstream's answer to "
                                  "this request and does not poll for a background job; send background: false")
        if isinstance(raw.get("input"), list):
            drop_reasoning = self.config.drop_input_reasoning_items
            raw = {**raw, "input": [_without_token_fields(item) for item in raw["input"]
                                    if not (drop_reasoning and item.get("type") == "reasoning")]}
        if self.config.is_responses_native:
            body = self._with_model({**(self.config.extra_body or {}), **raw})
            answer = await self._post("/responses", body)
            try:
                Response.model_validate(answer)
            except ValidationError as exc:
                what = f"a body that is not a Responses object: {_first_error(exc)}"
                raise self._malformed("/responses", what) from None
            return answer
        body = self._with_model({**(self.config.extra_body or {}), **responses_to_chat(raw), **chat_extras(raw)})
        completion = self._completion(await self._post("/chat/completions", body))
        return chat_to_response(completion, raw, model=self.config.model or completion.get("model") or "")

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise BadRequestError("openai_model does not stream; send `stream: false` (or leave it out)")
        return self._completion(await self._post("/chat/completions", self._with_model(body)))

    def _with_model(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "model": self.config.model} if self.config.model else body

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        url = self.base_url + path
        log.debug("POST %s (model %r)", url, body.get("model"))
        answer = await http.request(
            "POST", url, json=body, headers=self._headers, timeout_s=self.config.timeout_s, retry=self._retry
        )
        if not answer.ok:
            message = self._redact(_error_message(answer))
            raise UpstreamError(
                f"upstream {url} answered {answer.status}: {message}",
                status=answer.status,
                url=url,
                response_content=self._redact(answer.text).encode(),
                failure_class="upstream_error",
            )
        try:
            return answer.json()
        except orjson.JSONDecodeError:
            raise self._malformed(path, f"a body that is not JSON: {self._redact(answer.text[:200])!r}") from None

    def _completion(self, payload: Any) -> dict[str, Any]:
        if not (isinstance(payload, dict) and isinstance(payload.get("choices"), list) and payload["choices"]):
            raise self._malformed("/chat/completions", "a body that is not a Chat completion (no `choices`)")
        return payload

    def _malformed(self, path: str, what: str) -> UpstreamError:
        url = self.base_url + path
        return UpstreamError(f"upstream {url} answered 200 with {what}", url=url, failure_class="upstream_error")

    def _redact(self, text: str) -> str:
        key = self.config.api_key.get_secret_value()
        return text.replace(key, "****") if key else text


def _without_token_fields(item: dict[str, Any]) -> dict[str, Any]:
    """`item` without training token fields: OpenAI-compatible APIs reject unknown item fields, and only
    `vllm_model`'s upstream (a trainer's vLLM) reads them."""
    if any(name in item for name in TOKEN_FIELDS):
        return {key: value for key, value in item.items() if key not in TOKEN_FIELDS}
    return item


def _error_message(answer: http.HttpResponse) -> str:
    """The upstream's own error message: OpenAI's `{"error": {"message"}}`, FastAPI's `{"detail"}`, else the text."""
    try:
        payload = answer.json()
    except orjson.JSONDecodeError:
        return answer.text[:500]
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        if isinstance(error, str) and error:
            return error[:500]
        if payload.get("detail"):
            detail = payload["detail"]
            return (detail if isinstance(detail, str) else orjson.dumps(detail).decode())[:500]
    return answer.text[:500]


def _first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    return f"{'.'.join(map(str, error['loc']))}: {error['msg']} ({exc.error_count()} errors)"
