"""Scripted model: a real OpenAI/vLLM-compatible LLM server that answers from a script.

## What it is
The stand-in for vLLM wherever there is no GPU: the fleet's embedded default model and the LLM of every test. It
speaks the upstream API the way vLLM serves it (base URL `http://host:port/v1`), so `vllm_model` with token capture,
judges and agents talk to it unchanged. Each request is answered by the first rule whose regex matches the
conversation, else by the default reply. A deterministic byte-level tokenizer gives real prompt and generation
token ids and logprobs, with the prefix contiguity across turns that RL training relies on.

## Config
- `model` ("scripted"): the model name reported in every answer.
- `max_model_len` (32768): a prompt that leaves no room for one generated token is an HTTP 400 whose message names
  the "maximum context length", as vLLM's is; generations are also cut to fit.
- `rules` (list): `{match, match_in, turn, text, reasoning, tool_calls, finish_reason}` plus fault fields; first match
  wins. `match` is a Python regex searched (DOTALL) in the `match_in` text: `last_user` (default), `last_message` (any
  role, e.g. a tool output) or `transcript` (every message's content). `turn: N` restricts a rule to the request
  whose conversation already holds N assistant messages (0 = the first call of a rollout), for multi-step scripts.
  `tool_calls` are `{name, arguments}` (an object or a JSON string). `finish_reason` defaults to "tool_calls" with
  tool calls, else "stop"; "length" ends the generation without `<|im_end|>`. A bad regex fails at startup naming
  the rule (`rules.<index>.match`). (The field was once `on`; YAML 1.1 reads an unquoted `on:` as `true`, so
  config files refuse such keys with their line: see `gymfleet.fleet.config_merge.check_yaml_keys`.)
- Fault injection (per rule, to test clients' retries and deadlines): `status` (400-599) answers that HTTP status
  with vLLM's error body `{"error": {message, type, param, code}}`; `fail_times: N` fails only the first N
  matching requests and then gives the rule's reply (unset: fail every time); `retry_after_s` adds a `Retry-After`
  header; `error_message` sets the message (e.g. "maximum context length" to mimic an overflow); `delay_s` sleeps
  before answering, failing or not. Fault fields without `status` are a config error. Counts are per server process.
- `default` ({text: "I am not sure."}): the reply when no rule matches (same fields, without `match`/`match_in`).
- `reasoning_parser` (true): reasoning comes back as `reasoning_content` (vLLM `--reasoning-parser`); off, it stays
  in `content` as `<think>...</think>` text.
- `return_token_id_information` (false): on `/v1/responses`, put `prompt_token_ids`, `generation_token_ids` and
  `generation_log_probs` on the last output item, as `vllm_model` does.

## Routes
- `POST /v1/chat/completions`: non-streaming Chat Completions (`stream: true` and `n > 1` are 400s). Honours
  `max_tokens`/`max_completion_tokens` (cut generation, `finish_reason: "length"`, no tool calls), `logprobs`
  (one `{token, logprob, bytes, top_logprobs: []}` per generated token), vLLM's `return_tokens_as_token_ids`
  (`token: "token_id:<int>"`) and `return_token_ids` (top-level `prompt_token_ids`, `choices[0].token_ids`).
  Unknown fields are ignored; wrongly typed known fields are a 422.
- `POST /tokenize` (vLLM's, at the root): `{messages, tools?, add_generation_prompt?}` or `{prompt}` →
  `{tokens, count, max_model_len}`; agrees with `prompt_token_ids`.
- `POST /v1/responses`: Responses → Chat (`gymfleet.serving.convert`), the same script (faults included), Chat →
  Responses.
- `GET /v1/models`: `{"object": "list", "data": [{"id": <model>, "object": "model", ...}]}`.
- `GET /` liveness and `GET /metrics`, from the base server.

## Tokenizer
`tokenizer.py`: ids 0-255 are UTF-8 bytes, 256+ the special tokens `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`,
`<think>`, `</think>`, `<tool_call>`, `</tool_call>`. A ChatML-like template; the generation is the assistant body
the template would render for the reply, plus `<|im_end|>`. Logprobs are `-((id * 7919 + position) % 1000) / 1000
- 0.001`. Tool call ids are `call_<8 hex of sha256(prompt + index)>`.

## Version history
- v1: initial.
- v2: fault injection (`status`, `fail_times`, `retry_after_s`, `error_message`, `delay_s`) and `turn`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from pydantic import Field
from starlette.responses import Response as StarletteResponse

from gymfleet.serving.bodies import read_json, validate
from gymfleet.serving.convert import chat_to_response, responses_to_chat
from gymfleet.serving.model import ModelServer, ModelServerConfig
from gymfleet.serving.server import JSONResponse
from gymfleet.wire import ResponseCreateParams
from responses_api_models.scripted_model.schema import ChatRequest, TokenizeRequest, plain_messages
from responses_api_models.scripted_model.script import Reply, Rule, choose
from responses_api_models.scripted_model.tokenizer import (
    IM_END_ID,
    THINK_CLOSE,
    THINK_OPEN,
    assistant_body,
    decode,
    encode,
    logprob,
    render_chat,
    split_think,
    token_bytes,
)


class ScriptedModelConfig(ModelServerConfig):
    """The scripted model's fields (see the module docstring)."""

    model: str = "scripted"
    """Model name reported in answers and by `/v1/models`."""
    max_model_len: int = Field(default=32768, gt=0)
    """Context window: prompt plus generation, in tokens."""
    rules: list[Rule] = []
    """Scripted replies, checked in order; the first whose `match` is found wins."""
    default: Reply = Reply(text="I am not sure.")
    """Reply when no rule matches."""
    reasoning_parser: bool = True
    """Return reasoning as `reasoning_content` (vLLM with `--reasoning-parser`); off, it stays in `content`."""
    return_token_id_information: bool = False
    """On `/v1/responses`, attach the training token fields to the last output item (as `vllm_model` does)."""


class UpstreamFault(Exception):
    """An error answer in vLLM's shape: a request it refuses (400) or a fault a rule injects."""

    def __init__(self, message: str, status: int = 400, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError", 500: "InternalServerError",
                503: "ServiceUnavailableError"}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # e.g. Cloudflare's 520
        return f"HTTP {status}"


async def _fault_response(request: Request, exc: UpstreamFault) -> StarletteResponse:
    error = {"message": str(exc), "type": _ERROR_TYPES.get(exc.status, "APIError"), "param": None, "code": exc.status}
    headers = {"Retry-After": f"{exc.retry_after_s:g}"} if exc.retry_after_s is not None else None
    return JSONResponse({"error": error}, status_code=exc.status, headers=headers)


class ScriptedModel(ModelServer):
    """Answers Chat Completions, Responses and `/tokenize` from a script with a deterministic tokenizer."""

    config: ScriptedModelConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._matches: dict[int, int] = {}
        """How many requests each failing rule (by `id`) has matched so far (for `fail_times`)."""

    def routes(self, app: FastAPI) -> None:
        super().routes(app)
        app.add_exception_handler(UpstreamFault, _fault_response)

        async def tokenize_route(request: Request) -> StarletteResponse:
            return JSONResponse(self.tokenize(validate(TokenizeRequest, await read_json(request))))

        async def models_route() -> StarletteResponse:
            return JSONResponse({"object": "list", "data": [
                {"id": self.config.model, "object": "model", "created": 0, "owned_by": "gymfleet",
                 "root": self.config.model, "max_model_len": self.config.max_model_len}]})

        app.post("/tokenize")(tokenize_route)
        app.get("/v1/models")(models_route)

    def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        if body.prompt is not None:
            tokens = encode(body.prompt)
        else:
            tokens = encode(render_chat(plain_messages(body.messages), body.tools, body.add_generation_prompt))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.config.max_model_len}

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.answer(validate(ChatRequest, body))

    async def responses(self, params: ResponseCreateParams, raw: dict[str, Any]) -> dict[str, Any]:
        body = responses_to_chat(raw, reasoning="field")
        capture = self.config.return_token_id_information
        completion = await self.answer(
            validate(ChatRequest, {**body, "logprobs": capture, "return_token_ids": capture})
        )
        if capture:
            choice = completion["choices"][0]
            choice["message"].update(
                prompt_token_ids=completion["prompt_token_ids"],
                generation_token_ids=choice["token_ids"],
                generation_log_probs=[entry["logprob"] for entry in choice["logprobs"]["content"]],
            )
        return chat_to_response(completion, raw, model=self.config.model)

    async def answer(self, request: ChatRequest) -> dict[str, Any]:
        """The Chat completion (wire dict) the script gives for `request`, after the rule's delay and faults."""
        if request.stream:
            raise UpstreamFault("the scripted model does not stream; send `stream: false` (or leave it out)")
        if request.n not in (None, 1):
            raise UpstreamFault(f"the scripted model returns one choice; got n={request.n}")
        messages = plain_messages(request.messages)
        reply = choose(self.config.rules, self.config.default, messages)
        if isinstance(reply, Rule):
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.status is not None:
                count = self._matches[id(reply)] = self._matches.get(id(reply), 0) + 1
                if reply.fail_times is None or count <= reply.fail_times:
                    message = reply.error_message or f"{_phrase(reply.status)} (scripted fault)"
                    raise UpstreamFault(message, reply.status, reply.retry_after_s)
        return self.complete(request, messages, reply)

    def complete(self, request: ChatRequest, messages: list[dict[str, Any]], reply: Reply) -> dict[str, Any]:
        """The Chat completion (wire dict) of `reply` to `request`."""
        prompt = render_chat(messages, request.tools)
        prompt_ids = encode(prompt)
        room = self.config.max_model_len - len(prompt_ids)
        if room <= 0:
            raise UpstreamFault(
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, your request "
                f"has {len(prompt_ids)} input tokens. Please reduce the length of the input messages."
            )
        calls = [
            {"id": _call_id(prompt, index), "type": "function",
             "function": {"name": call.name, "arguments": call.arguments_json()}}
            for index, call in enumerate(reply.tool_calls)
        ]
        ids = encode(assistant_body({"content": reply.text, "reasoning_content": reply.reasoning,
                                     "tool_calls": calls}))
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        if finish != "length":
            ids.append(IM_END_ID)
        limit = min(room, request.max_completion_tokens or request.max_tokens or room)
        if len(ids) > limit:
            ids, finish, calls = ids[:limit], "length", []
            reasoning, content = split_think(decode(ids)) if self.config.reasoning_parser else (None, decode(ids))
        else:
            reasoning, content = reply.reasoning, reply.text
            if reasoning is not None and not self.config.reasoning_parser:
                reasoning, content = None, f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n{content}"

        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if request.logprobs:
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{token}" if request.return_tokens_as_token_ids else
                 token_bytes(token).decode("utf-8", errors="replace"),
                 "logprob": logprob(token, position), "bytes": list(token_bytes(token)), "top_logprobs": []}
                for position, token in enumerate(ids)
            ]}
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.config.model, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                      "total_tokens": len(prompt_ids) + len(ids)},
        }
        if request.return_token_ids:
            completion["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        return completion


def _call_id(prompt: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{prompt}{index}".encode()).hexdigest()[:8]
