"""NeMo-Gym 0.7.0's `nemo_gym.openai_utils.NeMoGymAsyncOpenAI`: the small OpenAI-compatible client folders use to
call a judge or model endpoint by URL (`create_response`, `create_chat_completion`, `create_completion`,
`create_models`, `create_tokenize`), on gymfleet's one HTTP client.

    client = NeMoGymAsyncOpenAI(base_url=get_server_url("judge") + "/v1", api_key=key)
    answer = await client.create_response(model="m", input=[...])          # the JSON body, as a dict

Each call is `gymfleet.serving.nemo_gym_client.request`: pooled, a deadline per attempt, bounded retries of what is
safe to resend (NeMo-Gym's fixed-sleep loop of up to `max_http_attempts` is gymfleet's backoff here), then
`raise_for_status` (an `HTTPStatusError`: both aiohttp's `ClientResponseError` and a gymfleet `TransportError`, so a
failed judge call in `verify` is a typed failure row, never a reward). As in NeMo-Gym, an answer that says the key is
spent or revoked (401/403 naming an invalid key, 429 naming an exhausted quota) trips the client: that call and every
later one raise `PermanentEndpointError` without going on the wire.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from openai.types.responses import ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import BaseModel, Field, PrivateAttr

from gymfleet.serving.nemo_gym_client import (
    MAX_NUM_TRIES,
    HTTPStatusError,
    NeMoGymClientResponse,
    get_response_json,
    raise_for_status,
    request,
)

log = logging.getLogger(__name__)

PERMANENT_AUTH_CODES = ("invalid_api_key", "invalid_api_token", "authentication_error")
PERMANENT_QUOTA_CODES = ("budget_exceeded", "insufficient_quota")


class PermanentEndpointError(HTTPStatusError):
    """The endpoint's key is spent or unauthorized: this client sends nothing more."""


def _error_codes(body: bytes) -> set[str]:
    """The `code` / `type` strings of an OpenAI-style error body (`{"error": {"code": ..., "type": ...}}`)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return set()
    error = data.get("error", data) if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return set()
    return {str(error[key]).lower() for key in ("code", "type") if isinstance(error.get(key), str)}


def is_permanent(status: int, body: bytes) -> bool:
    """Whether a `status` answer with `body` says the key will never work again (module docstring)."""
    codes = _error_codes(body)
    if status in (401, 403):
        text = body.decode("utf-8", errors="replace").lower()
        return bool(codes & set(PERMANENT_AUTH_CODES)) or "invalid api key" in text or "incorrect api key" in text
    return status == 429 and bool(codes & set(PERMANENT_QUOTA_CODES))


class NeMoGymAsyncOpenAI(BaseModel):
    """An OpenAI-compatible endpoint at `base_url` with bearer `api_key` (module docstring). `internal`,
    `max_connection_retries` and `max_http_attempts` are accepted for NeMo-Gym's signature; gymfleet's client bounds
    the retries of every call."""

    base_url: str
    api_key: str
    internal: bool = False
    max_connection_retries: int | None = None
    max_http_attempts: int = Field(default=MAX_NUM_TRIES, ge=1)
    default_headers: dict[str, str] = Field(default_factory=dict)
    _tripped: tuple[int, bytes, str] | None = PrivateAttr(default=None)

    def _raise_tripped(self) -> None:
        status, body, url = self._tripped
        raise PermanentEndpointError(status, url, body, "http_4xx")

    async def _call(self, method: str, url: str, **options: Any) -> Any:
        if self._tripped is not None:
            self._raise_tripped()
        headers = {**self.default_headers, **options.pop("headers", {}), "Authorization": f"Bearer {self.api_key}"}
        response: NeMoGymClientResponse = await request(method, url, headers=headers, **options)
        if not response.ok:
            body = await response.read()
            if is_permanent(response.status, body):
                log.warning("%s answered %d with a spent or revoked key; no further calls go to it: %s",
                            url, response.status, body[:200].decode("utf-8", errors="replace"))
                self._tripped = (response.status, body, str(url))
                self._raise_tripped()
            await raise_for_status(response)
        return await get_response_json(response)

    async def create_models(self) -> Any:
        return await self._call("GET", f"{self.base_url}/models")

    async def create_chat_completion(self, **params: Any) -> Any:
        return await self._call("POST", f"{self.base_url}/chat/completions", json=params)

    async def create_completion(self, **params: Any) -> Any:
        return await self._call("POST", f"{self.base_url}/completions", json=params)

    async def create_response(self, **params: Any) -> Any:
        return await self._call("POST", f"{self.base_url}/responses", json=params)

    async def create_tokenize(self, **params: Any) -> Any:
        return await self._call("POST", f"{self.base_url.removesuffix('/v1')}/tokenize", json=params)


def _add_known(left: int | None, right: int | None) -> int | None:
    return None if left is None or right is None else left + right  # an unknown count stays unknown


class NeMoGymResponseInputTokensDetails(InputTokensDetails):
    cached_tokens: int | None  # None: the server did not say
    cache_write_tokens: int | None = None  # newer than 0.7.0's openai: its callers never set it


class NeMoGymResponseOutputTokensDetails(OutputTokensDetails):
    reasoning_tokens: int | None


class NeMoGymResponseUsage(ResponseUsage):
    """A response's token usage whose detail counts may be unknown (NeMo-Gym 0.7.0's `openai_utils` type)."""

    input_tokens_details: NeMoGymResponseInputTokensDetails
    output_tokens_details: NeMoGymResponseOutputTokensDetails

    @classmethod
    def sum_from_list(cls, usages: list[NeMoGymResponseUsage]) -> NeMoGymResponseUsage:
        total = cls(input_tokens=0, output_tokens=0, total_tokens=0,
                    input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=0),
                    output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=0))
        for usage in usages:
            total = accumulate_response_usage(total, usage)
        return total


def accumulate_response_usage(total: Any, additional: Any) -> Any:
    """The token usage of two responses together (NeMo-Gym 0.7.0's `openai_utils.accumulate_response_usage`):
    `None` adds nothing; the detail counts (`cached_tokens`, `reasoning_tokens`) add where both sides know them."""
    if additional is None:
        return total
    if total is None:
        return additional.model_copy(deep=True)
    result = total.model_copy(deep=True)
    result.input_tokens += additional.input_tokens
    result.output_tokens += additional.output_tokens
    result.total_tokens += additional.total_tokens
    for details, count in (("input_tokens_details", "cached_tokens"), ("output_tokens_details", "reasoning_tokens")):
        mine, theirs = getattr(result, details, None), getattr(additional, details, None)
        if mine is not None and theirs is not None:
            setattr(mine, count, _add_known(getattr(mine, count), getattr(theirs, count)))
    return result
