"""Responses API ⇄ Chat Completions conversion (what a model server in front of a Chat upstream does).

`responses_to_chat` turns a Responses request into a Chat Completions body:

- consecutive assistant-side items (reasoning, assistant message, function calls) merge into one assistant
  message; `reasoning` chooses where their reasoning goes (`REASONING_MODES`): `<think>…</think>` before the
  content, the `reasoning_content` (and vLLM ≥ 0.10's `reasoning`) field, or nowhere. In the last two modes
  `<think>` blocks already inside the content move too. Training token fields found on any of those items travel
  on that assistant message, so a trainer's engine can splice the exact token prefix;
- `function_call_output` becomes a `tool` message; other messages keep their role (`developer` becomes `system`
  with `developer_as_system`); text parts join into a string, images become `image_url` parts;
- `instructions` and the leading system/developer messages fold into one leading system message;
- function tools flatten to `{type: function, function: {name, description, parameters}}` (`strict` dropped);
  without tools, `tool_choice` and `parallel_tool_calls` are dropped;
- `max_output_tokens` → `max_tokens`, `reasoning.effort` → `reasoning_effort`, `text.format` →
  `response_format`, `top_logprobs` → `logprobs` + `top_logprobs`; `temperature`, `top_p`, `model`, `user`
  are copied whenever they are set (0.0 included).

Anything a Chat upstream cannot express (hosted-tool items or tools, file or audio parts) is a `BadRequestError`
(HTTP 400) rather than being silently dropped.

`chat_extras` decides the fate of every other top-level Responses parameter (the `openai` package grows new ones
every few releases; gymfleet's `ResponseCreateParams` accepts them unvalidated): forwarded when Chat Completions has
the same parameter (`CHAT_SAME_MEANING`), a 400 when answering without it would not be what was asked
(`CHAT_REFUSED`: a stream, a background job, a stored conversation or prompt), else dropped with one logged warning
per parameter name per process.

`chat_to_response` turns a Chat completion back into a Responses object: one `reasoning` item (one summary per
`<think>` block or reasoning field), one assistant `message` (when there is text, or nothing else), then one
`function_call` per tool call (`id == call_id` == the upstream's tool call id). The training token fields of the
completion's message land on the last output item. `finish_reason` "length" and "content_filter" make the response
`incomplete` with that reason; `usage` maps to the Responses names.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Collection
from typing import Any, Literal

from gymfleet.errors import BadRequestError, did_you_mean
from gymfleet.wire import TOKEN_FIELDS, known_params

log = logging.getLogger(__name__)

# `<think>plan</think>answer` → ("plan", "answer"); text without tags has no reasoning.
THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
REASONING_MODES = ("content", "field", "drop")
ReasoningMode = Literal["content", "field", "drop"]
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_ASSISTANT_SIDE = ("reasoning", "function_call")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text") or "" for part in content if isinstance(part, dict) and part.get("type") in _TEXT_PARTS
        )
    return ""


def _chat_content(content: Any) -> str | list[dict[str, Any]]:
    """Chat `content` for a Responses message's content: a string when it is all text, else Chat parts."""
    if isinstance(content, str) or content is None:
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "input_image" and part.get("image_url"):
            image = {"url": part["image_url"], **({"detail": part["detail"]} if part.get("detail") else {})}
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise BadRequestError(
                f"content part of type {kind!r} cannot be sent to a Chat Completions model; supported: text parts "
                "and input_image with an image_url"
            )
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def responses_to_chat(
    params: dict[str, Any], *, reasoning: ReasoningMode = "content", developer_as_system: bool = False
) -> dict[str, Any]:
    """Chat Completions request body equivalent to a Responses request (`params`, a plain dict)."""
    if reasoning not in REASONING_MODES:
        raise ValueError(f"reasoning must be one of {REASONING_MODES}, got {reasoning!r}")
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None
    thoughts: list[str] = []

    for item in items or []:
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind in _ASSISTANT_SIDE or (kind == "message" and role == "assistant"):
            if assistant is None:
                assistant, thoughts = {"role": "assistant", "content": ""}, []
            if kind == "reasoning":
                thoughts.append(_text_of(item.get("summary")) or _text_of(item.get("content")))
            elif kind == "message":
                assistant["content"] += _text_of(item.get("content"))
            else:
                assistant.setdefault("tool_calls", []).append(
                    {
                        "id": item["call_id"],
                        "type": "function",
                        "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
                    }
                )
            if item.get("generation_token_ids") is not None:
                assistant.update({name: item[name] for name in TOKEN_FIELDS})
            continue
        if assistant is not None:
            messages.append(place_reasoning(assistant, thoughts, reasoning))
            assistant = None
        if kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text_of(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        elif kind == "message":
            messages.append({"role": role, "content": _chat_content(item.get("content"))})
        else:
            raise BadRequestError(
                f"input item of type {kind!r} cannot be sent to a Chat Completions model; "
                "supported: message, function_call, function_call_output, reasoning"
            )
    if assistant is not None:
        messages.append(place_reasoning(assistant, thoughts, reasoning))
    messages = _fold_system(messages, params.get("instructions"))
    if developer_as_system:
        messages = [{**message, "role": "system"} if message["role"] == "developer" else message
                    for message in messages]
    return {"messages": messages, **_chat_fields(params)}


def place_reasoning(message: dict[str, Any], thoughts: list[str], mode: ReasoningMode) -> dict[str, Any]:
    """Put an assistant message's reasoning (`thoughts`, plus `<think>` blocks in its content) where `mode` says.

    Examples:
        >>> place_reasoning({"role": "assistant", "content": "Hi"}, ["plan"], "content")["content"]
        '<think>plan</think>Hi'
        >>> sorted(place_reasoning({"role": "assistant", "content": "<think>plan</think>Hi"}, [], "field").items())
        [('content', 'Hi'), ('reasoning', 'plan'), ('reasoning_content', 'plan'), ('role', 'assistant')]
    """
    thoughts = [thought for thought in thoughts if thought]
    if mode == "content":
        message["content"] = "".join(f"<think>{thought}</think>" for thought in thoughts) + message["content"]
        return message
    inline, message["content"] = split_reasoning(message["content"])
    blocks = thoughts + inline
    if mode == "field" and blocks:
        message["reasoning_content"] = message["reasoning"] = "\n".join(blocks)
    return message


def _chat_fields(params: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key in ("model", "temperature", "top_p", "user", "parallel_tool_calls"):
        if params.get(key) is not None:
            body[key] = params[key]
    if params.get("max_output_tokens") is not None:
        body["max_tokens"] = params["max_output_tokens"]
    if params.get("top_logprobs") is not None:
        body["logprobs"], body["top_logprobs"] = True, params["top_logprobs"]
    effort = (params.get("reasoning") or {}).get("effort")
    if effort:
        body["reasoning_effort"] = effort
    response_format = _response_format((params.get("text") or {}).get("format"))
    if response_format:
        body["response_format"] = response_format
    tools = [_chat_tool(tool) for tool in params.get("tools") or []]
    if tools:
        body["tools"] = tools
        if params.get("tool_choice") is not None:
            body["tool_choice"] = _chat_tool_choice(params["tool_choice"])
    else:
        body.pop("parallel_tool_calls", None)
    return body


CHAT_CONVERTED = frozenset({"input", "instructions", "max_output_tokens", "model", "temperature", "top_p", "user",
                            "parallel_tool_calls", "top_logprobs", "reasoning", "text", "tools", "tool_choice"})
"""Responses parameters `responses_to_chat` converts."""
CHAT_SAME_MEANING = frozenset({"metadata", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
                               "safety_identifier", "service_tier", "store", "moderation"})
"""Responses parameters that Chat Completions has under the same name with the same meaning: forwarded as sent."""
CHAT_REFUSED = {
    "stream": "answers are read whole from a Chat upstream, never streamed; send stream: false",
    "background": "answers come back on the same request, there is no background job to poll; send background: false",
    "previous_response_id": "no responses are stored to continue from; send the whole conversation in `input`",
    "conversation": "no conversations are stored; send the whole conversation in `input`",
    "prompt": "stored prompt templates cannot be expanded; put the text in `instructions` or `input`",
}
"""Responses parameters a Chat upstream cannot honour, and why; set to anything but null/false they are a 400."""
_warned_dropped: set[str] = set()


def chat_extras(params: dict[str, Any], *, consumed: Collection[str] = ()) -> dict[str, Any]:
    """The top-level Responses parameters of `params` to add to the Chat body besides what `responses_to_chat`
    converts (nor the caller reads: `consumed`): those in `CHAT_SAME_MEANING` that are not null, as sent. Every
    other parameter that is set (not null, false or empty) is refused when it is in `CHAT_REFUSED`, else dropped
    with one warning per name per process (an unknown name, maybe a typo, with a did-you-mean).

    Raises:
        BadRequestError: a `CHAT_REFUSED` parameter is set (HTTP 400 naming it and the fix).

    Examples:
        >>> chat_extras({"input": "hi", "store": False, "prompt_cache_key": "k", "truncation": None})
        {'store': False, 'prompt_cache_key': 'k'}
    """
    extras: dict[str, Any] = {}
    for name, value in params.items():
        if name in CHAT_CONVERTED or name in consumed or value is None:
            continue
        if name in CHAT_SAME_MEANING:
            extras[name] = value
        elif value is False or value == [] or value == {}:
            continue
        elif name in CHAT_REFUSED:
            raise BadRequestError(f"{name}={json.dumps(value)[:100]} cannot be served: {CHAT_REFUSED[name]}")
        else:
            _warn_dropped(name)
    return extras


def _warn_dropped(name: str) -> None:
    if name in _warned_dropped:
        return
    _warned_dropped.add(name)
    if name in known_params():
        why = "Chat Completions has no equivalent"
    else:
        why = f"not a Responses API parameter gymfleet knows.{did_you_mean(name, known_params())}"
    log.warning("Responses parameter %r is not sent to the Chat Completions upstream (%s); warned once per process",
                name, why)


def _fold_system(messages: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    leading = 0
    while leading < len(messages) and messages[leading]["role"] in ("system", "developer"):
        leading += 1
    texts = ([instructions] if instructions else []) + [_text_of(m["content"]) for m in messages[:leading]]
    if not texts:
        return messages
    return [{"role": "system", "content": "\n\n".join(texts)}, *messages[leading:]]


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type", "function") != "function":
        raise BadRequestError(f"tool of type {tool.get('type')!r} cannot be served by a Chat Completions model; "
                              "only function tools can")
    function = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(text_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not text_format or text_format.get("type") == "text":
        return None
    if text_format.get("type") == "json_schema":
        schema = {key: text_format[key] for key in ("name", "schema", "strict", "description") if key in text_format}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": text_format["type"]}


def split_reasoning(content: str | None, reasoning: str | None = None) -> tuple[list[str], str]:
    """Reasoning blocks and the remaining answer text of an assistant message.

    Examples:
        >>> split_reasoning("<think> a </think>\\n<think>b</think> Answer")
        (['a', 'b'], 'Answer')
        >>> split_reasoning("plan</think>Answer")  # the opening tag was in the prompt
        (['plan'], 'Answer')
        >>> split_reasoning("Answer", "plan")
        (['plan'], 'Answer')
    """
    blocks = [reasoning] if reasoning else []
    text = content or ""
    if "<think>" in text or "</think>" in text:
        blocks += [block.strip() for block in THINK_BLOCK.findall(text)]
        text = THINK_BLOCK.sub("", text)
        if "</think>" in text:  # the opening tag was in the prompt (reasoning-parser templates)
            head, _, text = text.rpartition("</think>")
            blocks.insert(0, head.strip())
    return [block for block in blocks if block], text.strip() if blocks else text


def chat_to_response(completion: dict[str, Any], params: dict[str, Any], *, model: str) -> dict[str, Any]:
    """Responses object (plain dict) for a Chat completion answering `params`."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    blocks, text = split_reasoning(message.get("content"), reasoning)
    tool_calls = message.get("tool_calls") or []
    output: list[dict[str, Any]] = []
    if blocks:
        output.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": block} for block in blocks],
            }
        )
    if text or not (blocks or tool_calls):
        output.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in tool_calls:
        function = call.get("function") or {}
        call_id = call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
        arguments = function.get("arguments")
        output.append(
            {
                "id": call_id,
                "call_id": call_id,
                "type": "function_call",
                "status": "completed",
                "name": function.get("name", ""),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
            }
        )
    tokens = {name: message[name] for name in TOKEN_FIELDS if message.get(name) is not None}
    if len(tokens) == len(TOKEN_FIELDS):
        output[-1].update(tokens)

    incomplete = {"length": {"reason": "max_output_tokens"}, "content_filter": {"reason": "content_filter"}}.get(
        choice.get("finish_reason")
    )
    echoed = ("instructions", "metadata", "temperature", "top_p", "max_output_tokens", "max_tool_calls", "reasoning",
              "text", "top_logprobs", "truncation", "user", "previous_response_id", "service_tier", "store")
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": completion.get("created") or int(time.time()),
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": incomplete,
        "error": None,
        "output": output,
        **{key: params.get(key) for key in echoed},
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": params.get("tools") or [],
        "usage": _usage(completion.get("usage") or {}),
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Chat usage in the Responses names (cached and reasoning token counts kept when the upstream gives them)."""
    prompt_tokens, completion_tokens = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt_tokens + completion_tokens,
    }


def tool_call_arguments(arguments: str) -> dict[str, Any]:
    """Parse a tool call's JSON arguments; raises ValueError with the reason on anything but an object."""
    value = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value
