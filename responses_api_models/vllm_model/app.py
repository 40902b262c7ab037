"""vllm_model: the policy model server in front of vLLM (or any OpenAI Chat Completions upstream).

## What it does
`POST /v1/responses` converts the Responses request to a Chat Completions body (`gymfleet.serving.convert`, then
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

## Upstream readiness
From start-up, each upstream is probed in the background (`GET {base_url}/models`, any HTTP answer counts) until
it answers: the log names each URL it waits for, once it has failed for 5 s and then every minute, with the
timeout (the global `model_endpoint_readiness_timeout_seconds`, default 600 in a fleet; 0 turns the probe off, and a
server built in-process, outside `ng_run`, probes only when the key is set). `GET
/upstream_status` reports `{status, timeout_s, waited_s, upstreams: [{url, ready, answered_after_s, last_error}]}`,
`status` being `ready`, `waiting for upstream`, `upstream unreachable` (past the timeout; still probed, every 10 s)
or `not checked`; `ng_status` shows it. Requests are never held back: while an upstream does not answer they are
sent anyway and fail as typed `connection_error`s.

## Config
`VLLMModelConfig` (`config.py`; every field says why it exists).

## Version history
- v1: Responses ⇄ Chat conversion, sticky routing, token capture, context-overflow handling.
- v2: full NeMo-Gym reasoning options, bounded configurable retries, checked token data, chat pass-through with
  the same preprocessing.
- v3: background upstream readiness probe, reported in the log and on `GET /upstream_status`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response as StarletteResponse

from gymfleet import auth, http
from gymfleet.errors import TransportError, UpstreamError
from gymfleet.serving.convert import chat_to_response
from gymfleet.serving.model import ModelServer
from gymfleet.serving.server import JSONResponse, add_route
from gymfleet.serving.sessions import session_id
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

log = logging.getLogger(__name__)

TOKENIZE_FIELDS = ("model", "messages", "tools", "chat_template_kwargs", "mm_processor_kwargs",
                   "required_prefix_token_ids")
PROBE_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 1.0
PROBE_INTERVAL_PAST_TIMEOUT_S = 10.0
WAITING_LOG_AFTER_S = 5.0
"""Probes fail this long before the log says it waits (the fleet's supervisor names the URL within a second)."""
WAITING_LOG_EVERY_S = 60.0


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
            connect_retry_s=self.config.upstream_connect_retry_s,
        )
        # Tokenizing is a pure function of the body: safe to resend after a dropped connection.
        self.tokenize_retry = dataclasses.replace(self.retry, idempotent=True)
        self.headers = {"Authorization": f"Bearer {self.config.api_key}", **(self.config.default_headers or {})}
        self.upstream = UpstreamWatch(self.base_urls, _probe_timeout_s(self.global_config), self.headers)
        self._probe: asyncio.Task | None = None

    async def startup(self) -> None:
        await super().startup()
        if self.upstream.timeout_s > 0:
            self._probe = asyncio.create_task(self.upstream.run(), name="upstream-probe")

    async def shutdown(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await super().shutdown()

    def routes(self, app: FastAPI) -> None:
        super().routes(app)

        async def upstream_status(request: Request) -> StarletteResponse:
            return JSONResponse(self.upstream.status())

        add_route(app, "/upstream_status", upstream_status, methods=("GET",))

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


def _probe_timeout_s(global_config: dict[str, Any]) -> float:
    """How long the start-up probe reports "waiting for upstream" before "upstream unreachable"; 0: no probe.

    In a fleet (`ng_run` sets a fleet token) the fleet's `model_endpoint_readiness_timeout_seconds`
    (default 600); a server built in-process (tests, library use) probes only when its global config sets the key.
    """
    value = global_config.get("model_endpoint_readiness_timeout_seconds")
    if value is None:
        return 600.0 if auth.fleet_token() else 0.0
    return max(0.0, float(value))


@dataclasses.dataclass(eq=False)
class UpstreamWatch:
    """Whether each upstream answers yet (see "Upstream readiness" in the module docstring)."""

    base_urls: list[str]
    timeout_s: float
    headers: dict[str, str]
    started: float = dataclasses.field(default_factory=time.monotonic, init=False)
    answered_after: dict[str, float] = dataclasses.field(default_factory=dict, init=False)
    errors: dict[str, str] = dataclasses.field(default_factory=dict, init=False)

    def status(self) -> dict[str, Any]:
        waited = time.monotonic() - self.started
        if self.timeout_s <= 0:
            status = "not checked"
        elif len(self.answered_after) == len(self.base_urls):
            status = "ready"
        else:
            status = "waiting for upstream" if waited <= self.timeout_s else "upstream unreachable"
        upstreams = [{"url": url, "ready": url in self.answered_after,
                      "answered_after_s": self.answered_after.get(url),
                      "last_error": None if url in self.answered_after else self.errors.get(url)}
                     for url in self.base_urls]
        return {"status": status, "timeout_s": self.timeout_s, "waited_s": round(waited, 1), "upstreams": upstreams}

    async def run(self) -> None:
        """Probe every upstream until all have answered once."""
        await asyncio.gather(*(self._watch(url) for url in self.base_urls))

    async def _watch(self, url: str) -> None:
        logged_at: float | None = None
        gave_up = False
        while True:
            error = await self._probe(url)
            waited = time.monotonic() - self.started
            if error is None:
                self.answered_after[url] = waited
                if logged_at is not None:
                    log.info("upstream %s answers (after %.1f s)", url, waited)
                return
            self.errors[url] = error
            if logged_at is None and waited < WAITING_LOG_AFTER_S:
                pass  # an upstream started beside this server (a scripted policy in the same fleet) is not news yet
            elif logged_at is None:
                logged_at = waited
                log.warning("waiting for upstream %s: %s; timeout %g s (model_endpoint_readiness_timeout_seconds). "
                            "Requests are served meanwhile and fail as connection_error until it answers",
                            url, error, self.timeout_s)
            elif waited > self.timeout_s and not gave_up:
                gave_up = True
                log.error("upstream %s did not answer within %g s (%s); still probing it every %g s",
                          url, self.timeout_s, error, PROBE_INTERVAL_PAST_TIMEOUT_S)
            elif waited - logged_at >= WAITING_LOG_EVERY_S:
                logged_at = waited
                log.warning("still waiting for upstream %s: %s (%.0f s so far, timeout %g s)",
                            url, error, waited, self.timeout_s)
            await asyncio.sleep(PROBE_INTERVAL_PAST_TIMEOUT_S if gave_up else PROBE_INTERVAL_S)

    async def _probe(self, base_url: str) -> str | None:
        """None when `{base_url}/models` gives any HTTP answer, else why not."""
        try:
            await http.request("GET", base_url + "/models", headers=self.headers, timeout_s=PROBE_TIMEOUT_S,
                               retry=http.NO_RETRY)
        except TransportError as exc:
            return str(exc)
        return None
