"""Responses API ⇄ Chat Completions conversion (what a model server in front of a Chat upstream does).

`responses_to_chat` turns a Responses request into Chat messages: consecutive assistant-side items (reasoning,
assistant message, function calls) merge into one assistant message, reasoning becoming `<think>…</think>` before
the content (or `reasoning_content`); `function_call_output` becomes a `tool` message; `instructions` folds into
the leading system message; tools flatten to Chat's `{type: function, function: {...}}`; `max_output_tokens`
becomes `max_tokens`. Training token fields found on assistant-side items travel on that assistant message.

`chat_to_response` turns a Chat completion back into a Responses object: one `reasoning` item (one summary per
`<think>` block), one assistant `message` (when there is text, or nothing else), then one `function_call` per
tool call.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from gymfleet.errors import BadRequestError
from gymfleet.wire import TOKEN_FIELDS

# `<think>plan</think>answer` → ("plan", "answer"); text without tags has no reasoning.
THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict)
            and part.get("type") in ("input_text", "output_text", "text", "summary_text", "reasoning_text")
        )
    return ""


def responses_to_chat(params: dict[str, Any], *, reasoning_as_content: bool = True) -> dict[str, Any]:
    """Chat Completions request body equivalent to a Responses request (`params`, a plain dict)."""
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None
    reasoning_parts: list[str] = []

    def flush() -> None:
        nonlocal assistant, reasoning_parts
        if assistant is not None:
            if reasoning_parts:
                thoughts = "".join(f"<think>{text}</think>" for text in reasoning_parts)
                if reasoning_as_content:
                    assistant["content"] = thoughts + (assistant.get("content") or "")
                else:
                    assistant["reasoning_content"] = "\n".join(reasoning_parts)
            messages.append(assistant)
        assistant, reasoning_parts = None, []

    def assistant_message() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": ""}
        return assistant

    for item in items or []:
        item_type = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if item_type == "reasoning":
            message = assistant_message()
            reasoning_parts.append(_text_of(item.get("summary")) or _text_of(item.get("content")))
        elif item_type == "message" and role == "assistant":
            message = assistant_message()
            message["content"] = (message.get("content") or "") + _text_of(item.get("content"))
        elif item_type == "function_call":
            message = assistant_message()
            message.setdefault("tool_calls", []).append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments", "")},
                }
            )
        else:
            flush()
            message = None
            if item_type == "function_call_output":
                output = item.get("output")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": item["call_id"],
                        "content": output if isinstance(output, str) else _text_of(output),
                    }
                )
            elif item_type == "message":
                content = item.get("content")
                messages.append({"role": role, "content": content if isinstance(content, str) else _text_of(content)})
            else:
                raise BadRequestError(f"input item of type {item_type!r} cannot be sent to a Chat Completions model; "
                                      "supported: message, function_call, function_call_output, reasoning")
        if message is not None and item.get("generation_token_ids") is not None:
            for name in TOKEN_FIELDS:
                message[name] = item[name]
    flush()
    messages = _fold_system(messages, params.get("instructions"))

    body: dict[str, Any] = {"messages": messages}
    for key in ("temperature", "top_p", "model", "parallel_tool_calls", "tool_choice", "user"):
        if params.get(key) is not None:
            body[key] = params[key]
    if params.get("max_output_tokens") is not None:
        body["max_tokens"] = params["max_output_tokens"]
    reasoning = params.get("reasoning") or {}
    if reasoning.get("effort"):
        body["reasoning_effort"] = reasoning["effort"]
    tools = [_chat_tool(tool) for tool in params.get("tools") or [] if tool.get("type", "function") == "function"]
    if tools:
        body["tools"] = tools
    else:
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)
    return body


def _fold_system(messages: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    leading = []
    while len(leading) < len(messages) and messages[len(leading)]["role"] in ("system", "developer"):
        leading.append(messages[len(leading)]["content"])
    texts = ([instructions] if instructions else []) + leading
    if not texts:
        return messages
    return [{"role": "system", "content": "\n\n".join(texts)}, *messages[len(leading) :]]


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def split_reasoning(content: str | None, reasoning: str | None = None) -> tuple[list[str], str]:
    """Reasoning blocks and the remaining answer text of an assistant message."""
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
    reasoning_text = message.get("reasoning_content") or message.get("reasoning")
    blocks, text = split_reasoning(message.get("content"), reasoning_text)
    output: list[dict[str, Any]] = []
    if blocks:
        output.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": block} for block in blocks],
            }
        )
    tool_calls = message.get("tool_calls") or []
    if text or not tool_calls:
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
        output.append(
            {
                "id": call["id"],
                "call_id": call["id"],
                "type": "function_call",
                "status": "completed",
                "name": function.get("name", ""),
                "arguments": function.get("arguments") or "",
            }
        )
    tokens = {name: message[name] for name in TOKEN_FIELDS if message.get(name) is not None}
    if len(tokens) == len(TOKEN_FIELDS):
        output[-1].update(tokens)

    finish = choice.get("finish_reason")
    incomplete = None
    if finish == "length":
        incomplete = {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        incomplete = {"reason": "content_filter"}
    usage = completion.get("usage") or {}
    prompt_tokens, completion_tokens = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": completion.get("created") or int(time.time()),
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": incomplete,
        "output": output,
        "instructions": params.get("instructions"),
        "metadata": params.get("metadata"),
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_output_tokens": params.get("max_output_tokens"),
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": params.get("tools") or [],
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def tool_call_arguments(arguments: str) -> dict[str, Any]:
    """Parse a tool call's JSON arguments; raises ValueError with the reason on anything but an object."""
    value = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value
