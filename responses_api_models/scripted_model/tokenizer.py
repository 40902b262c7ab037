"""The scripted model's deterministic byte-level tokenizer and its ChatML-like chat template (pure functions).

Token ids 0-255 are the bytes of the UTF-8 text; `SPECIAL_TOKENS` take ids 256 and up, in order. `encode` splits
on the special-token strings, so `decode(encode(text)) == text` for any text.

The chat template renders each message as `<|im_start|>{role}\\n{body}<|im_end|>\\n`. Given `tools`, a system block
lists them as JSON (folded into a leading system message if there is one). An assistant body is
`<think>\\n{reasoning}\\n</think>\\n` (when there is reasoning), then the content, then one
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` per tool call, each after a newline when the body
is not empty. A completion's generated ids are `encode(assistant_body(reply)) + [IM_END]`, so appending that reply
to the conversation and rendering again reproduces prompt + generation as a prefix, which RL training relies on.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gymfleet.serving.convert import split_reasoning

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>")
SPECIAL_IDS = {token: 256 + index for index, token in enumerate(SPECIAL_TOKENS)}
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
IM_END_ID = SPECIAL_IDS[IM_END]
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

# "a<|im_end|>b" splits into "a", "<|im_end|>", "b"; "<|im_end" (unterminated) stays plain bytes.
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(token) for token in SPECIAL_TOKENS) + ")")
_JSON_SEPARATORS = (", ", ": ")
_TEXT_PART_TYPES = ("text", "input_text", "output_text")


def encode(text: str) -> list[int]:
    """Token ids of `text`: special-token strings become their ids, everything else its UTF-8 bytes."""
    ids: list[int] = []
    for index, piece in enumerate(_SPECIAL_SPLIT.split(text)):
        if index % 2:
            ids.append(SPECIAL_IDS[piece])
        else:
            ids.extend(piece.encode("utf-8"))
    return ids


def token_bytes(token_id: int) -> bytes:
    """The bytes one token stands for (a special token's UTF-8 string)."""
    if 0 <= token_id < 256:
        return bytes((token_id,))
    if 256 <= token_id < VOCAB_SIZE:
        return SPECIAL_TOKENS[token_id - 256].encode("utf-8")
    raise ValueError(f"token id {token_id} is outside the vocabulary [0, {VOCAB_SIZE})")


def decode(ids: list[int]) -> str:
    """Text of `ids`; a multi-byte character cut short (a truncated generation) decodes to U+FFFD."""
    return b"".join(token_bytes(token_id) for token_id in ids).decode("utf-8", errors="replace")


def logprob(token_id: int, position: int) -> float:
    """A deterministic, strictly negative log-probability for the token generated at `position`."""
    return -((token_id * 7919 + position) % 1000) / 1000 - 1e-3


def message_text(content: Any) -> str:
    """The text of a message's `content`: a string, a list of text parts, or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content
                       if isinstance(part, dict) and part.get("type") in _TEXT_PART_TYPES)
    return ""


def tool_call_json(name: str, arguments: str | dict[str, Any]) -> str:
    """One tool call as the template writes it; `arguments` that are not JSON are kept as a JSON string."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=_JSON_SEPARATORS)


def split_think(text: str) -> tuple[str | None, str]:
    """(reasoning, rest) of an assistant body that may open with a `<think>` block, possibly cut short."""
    if not text.startswith(THINK_OPEN):
        return None, text
    inner, closed, rest = text[len(THINK_OPEN):].partition(THINK_CLOSE)
    return inner.removeprefix("\n").removesuffix("\n"), rest.removeprefix("\n") if closed else ""


def _reasoning_and_content(message: dict[str, Any]) -> tuple[str | None, str]:
    reasoning = message.get("reasoning_content") or message.get("reasoning") or None
    content = message_text(message.get("content"))
    if THINK_OPEN in content or THINK_CLOSE in content:
        # Clients without a reasoning parser send the reasoning back inside `content` (the Responses converter
        # writes `<think>r</think>text`); normalizing keeps the rendered prompt identical either way.
        blocks, content = split_reasoning(content, reasoning)
        reasoning = "\n".join(blocks) or None
    return reasoning, content


def assistant_body(message: dict[str, Any]) -> str:
    """What the template writes between `<|im_start|>assistant\\n` and `<|im_end|>` for an assistant message."""
    reasoning, body = _reasoning_and_content(message)
    if reasoning is not None:
        body = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n{body}"
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if body:
            body += "\n"
        body += f"{TOOL_CALL_OPEN}\n{tool_call_json(function.get('name', ''), function.get('arguments', ''))}\n"
        body += TOOL_CALL_CLOSE
    return body


def _tools_block(tools: list[dict[str, Any]]) -> str:
    lines = [json.dumps(tool, ensure_ascii=False, separators=_JSON_SEPARATORS) for tool in tools]
    listing = "\n".join(lines)
    return f"# Tools\n\nYou may call one or more functions. Available tools:\n<tools>\n{listing}\n</tools>"


def render_chat(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = True
) -> str:
    """The prompt text for `messages` (plain dicts in Chat Completions shape) and optional Chat-shaped `tools`."""
    parts: list[str] = []
    if tools:
        system = ""
        if messages and messages[0].get("role") == "system":
            system = message_text(messages[0].get("content")) + "\n\n"
            messages = messages[1:]
        parts.append(f"{IM_START}system\n{system}{_tools_block(tools)}{IM_END}\n")
    for message in messages:
        role = message.get("role", "")
        body = assistant_body(message) if role == "assistant" else message_text(message.get("content"))
        parts.append(f"{IM_START}{role}\n{body}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)
