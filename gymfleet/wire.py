"""Wire types: the OpenAI Responses API shapes NeMo-Gym servers exchange, plus the training token fields.

The request model (`ResponseCreateParams`) types the fields NeMo-Gym's `NeMoGymResponseCreateParamsNonStreaming`
has (a wrongly typed `temperature` is an error naming the field) and keeps any other top-level key as sent: the
Responses API gains parameters with each `openai` release (`context_management`, `prompt_cache_retention`,
`stream_options`, ...), and a newer client must not break the fleet. Each model server decides what such a key
means for its upstream (`openai_model` passes it on; `vllm_model` forwards, drops with a warning, or refuses it:
`gymfleet.serving.convert.chat_extras`). `known_params()` lists every parameter name the installed `openai` package
knows.
The response model (`Response`) types what gymfleet reads of OpenAI's `Response` (its `output` items are the `openai`
package's item models, written out in `gymfleet.openai_items` so that no server imports `openai` to start), widened
so that message, function_call and reasoning items may carry `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs` (all three or none), and `function_call_output` items may appear (agents put tool outputs
into the episode's output). Unknown item types are kept as-is so hosted-tool items round-trip.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import logging
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from gymfleet.openai_items import ResponseFunctionToolCall, ResponseOutputMessage, ResponseReasoningItem

log = logging.getLogger(__name__)

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


class TokenFields(BaseModel):
    """The training token fields a model server attaches to the last output item of each model call."""

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None

    @model_validator(mode="after")
    def _all_or_none(self):
        present = [name for name in TOKEN_FIELDS if getattr(self, name) is not None]
        if present and len(present) != len(TOKEN_FIELDS):
            missing = sorted(set(TOKEN_FIELDS) - set(present))
            raise ValueError(f"token fields must come together: got {present}, missing {missing}")
        if present and len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                f"generation_token_ids ({len(self.generation_token_ids)}) and generation_log_probs "
                f"({len(self.generation_log_probs)}) must have the same length"
            )
        return self


# ---------------------------------------------------------------------------------------------- output items

# The `openai` package's item models, written out in `gymfleet.openai_items`, with the training token fields.


class OutputMessage(ResponseOutputMessage, TokenFields):
    """An assistant message item (`type: "message"`)."""


class FunctionCall(ResponseFunctionToolCall, TokenFields):
    """A tool call the model made (`type: "function_call"`); `arguments` is a JSON string."""


class Reasoning(ResponseReasoningItem, TokenFields):
    """A reasoning item (`type: "reasoning"`)."""


class FunctionCallOutput(BaseModel):
    """A tool's output fed back to the model (`type: "function_call_output"`)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class OtherItem(BaseModel):
    """Any other item type (hosted tools, MCP, ...), kept verbatim."""

    model_config = ConfigDict(extra="allow")
    type: str


_TYPED_ITEMS = ("message", "function_call", "function_call_output", "reasoning")


def _item_tag(value: Any) -> str:
    """Which item model validates `value`; an input message may omit `type` ("easy" message)."""
    if isinstance(value, dict):
        item_type = value.get("type")
        if item_type is None and "role" in value:
            return "message"
    else:
        item_type = getattr(value, "type", None)
    return item_type if item_type in _TYPED_ITEMS else "other"


def item_union(message: type, call: type, reasoning: type, prompt_message: type | None = None) -> Any:
    """The item union of `input` or `output` with these models for messages, tool calls and reasoning (the
    `nemo_gym` surface builds NeMo-Gym's item classes into it). With `prompt_message`, a message item that is no
    model output (NeMo-Gym's rule: a user, system or developer role, or content that does not start with an
    `output_text` or `refusal` part, or empty content without an `id`) validates into that model instead: NeMo-Gym's
    local agents return the prompt's messages in a response's `output`."""
    items = (Annotated[message, Tag("message")] | Annotated[call, Tag("function_call")]
             | Annotated[FunctionCallOutput, Tag("function_call_output")] | Annotated[reasoning, Tag("reasoning")]
             | Annotated[OtherItem, Tag("other")])
    if prompt_message is None:
        return Annotated[items, Discriminator(_item_tag)]
    return Annotated[items | Annotated[prompt_message, Tag("prompt_message")], Discriminator(_output_item_tag)]


_OUTPUT_PARTS = frozenset({"output_text", "refusal"})


def _output_item_tag(value: Any) -> str:
    tag = _item_tag(value)
    if tag != "message" or not isinstance(value, dict):
        return "prompt_message" if isinstance(value, InputMessage) else tag
    content = value.get("content")
    if value.get("role") in ("user", "system", "developer") or not isinstance(content, list):
        return "prompt_message"
    if not content:
        return "message" if isinstance(value.get("id"), str) else "prompt_message"
    first = content[0]
    part = (first.get("type") or ("refusal" if "refusal" in first else None)) if isinstance(first, dict) else getattr(
        first, "type", None)
    return "message" if part in _OUTPUT_PARTS else "prompt_message"


OutputItem = item_union(OutputMessage, FunctionCall, Reasoning)


class Usage(BaseModel):
    """Token usage; lenient about the detail blocks, which differ between `openai` releases."""

    model_config = ConfigDict(extra="allow")
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: dict[str, Any] | None = None
    output_tokens_details: dict[str, Any] | None = None


class Response(BaseModel):
    """A Responses API response (NeMo-Gym's `NeMoGymResponse`): `output` holds every item of the episode.

    The fields read by gymfleet are typed (`output` items are the `openai` package's item models, as written out
    above, widened with the token fields); every other field of OpenAI's `Response` (`reasoning`, `text`, `tools`,
    ...) is accepted and kept as sent. Declaring all forty of them would triple the cost of validating a `/verify`
    body and break whenever a new `openai` release adds a required field.
    """

    model_config = ConfigDict(extra="allow")
    id: str = ""
    object: Literal["response"] = "response"
    created_at: float = 0
    model: str = ""
    status: str | None = None
    output: Annotated[list[OutputItem], Field(fail_fast=True)]
    """Validation stops at the first bad item: a body of 250k wrong items costs microseconds, not a stalled loop."""
    incomplete_details: dict[str, Any] | None = None
    usage: Usage | None = None

    @property
    def output_text(self) -> str:
        """Concatenation of every `output_text` part of every message item (reasoning excluded)."""
        return "".join(
            part.text
            for item in self.output
            if item.type == "message"
            for part in item.content
            if getattr(part, "type", None) == "output_text"
        )

    @property
    def last_message_text(self) -> str:
        """The `output_text` parts of the last assistant message only ("" when there is none)."""
        for item in reversed(self.output):
            if item.type == "message" and getattr(item, "role", "assistant") == "assistant":
                return "".join(part.text for part in item.content if getattr(part, "type", None) == "output_text")
        return ""


# ---------------------------------------------------------------------------------------------- input items


class InputMessage(TokenFields):
    """A message in `input`: the "easy" form `{role, content}` or a full message item."""

    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    type: Literal["message"] | None = None
    id: str | None = None
    status: str | None = None


class InputFunctionCall(TokenFields):
    """A previous tool call in `input`."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function_call"]
    name: str
    arguments: str
    call_id: str
    id: str | None = None
    status: str | None = None


class InputReasoning(TokenFields):
    """A previous reasoning item in `input`."""

    model_config = ConfigDict(extra="allow")
    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    id: str | None = None
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = item_union(InputMessage, InputFunctionCall, InputReasoning)


class ResponseCreateParams(BaseModel):
    """`POST /v1/responses` body (non-streaming) and every dataset row's `responses_create_params`.

    The fields declared here are validated; any other top-level key is kept as sent (`model_extra`) for the model
    server to honour, pass on or refuse.
    """

    model_config = ConfigDict(extra="allow")

    input: str | Annotated[list[InputItem], Field(fail_fast=True)]
    """A string, or items; validation stops at the first bad item (see `Response.output`)."""
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: Annotated[list[dict[str, Any]], Field(fail_fast=True)] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: str | None = None
    user: str | None = None
    background: bool | None = None
    include: Annotated[list[str], Field(fail_fast=True)] | None = None
    conversation: str | dict[str, Any] | None = None
    stream: Literal[False] | None = None
    """Gymfleet servers answer whole responses, never event streams: `stream: true` is refused."""

    @model_validator(mode="after")
    def _check_tools(self):
        for index, tool in enumerate(self.tools or []):
            if tool.get("type", "function") == "function" and not tool.get("name"):
                raise ValueError(f"tools[{index}]: a function tool needs a 'name' (Responses shape, not Chat's)")
        return self

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as a list of item dicts (a string becomes one user message)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return [item.model_dump(exclude_none=True) for item in self.input]

    def last_user_text(self) -> str:
        """The text of the last user message of `input` ("" when there is none); text parts are joined."""
        for item in reversed(self.input_items()):
            if item.get("role") == "user":
                content = item.get("content")
                if isinstance(content, str):
                    return content
                return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))
        return ""


@functools.cache
def known_params() -> frozenset[str]:
    """Every top-level Responses parameter name gymfleet or the installed `openai` package knows (for did-you-mean).

    The package's names are its `ResponseCreateParamsBase` keys, read from its source file (a millisecond) rather
    than by importing it (a second of CPU, on the event loop of the server that first warns); where the file cannot
    be read that way, the class is imported.
    """
    return frozenset(ResponseCreateParams.model_fields) | _openai_params()


def _openai_params() -> frozenset[str]:
    try:
        folder = Path(next(iter(importlib.util.find_spec("openai").submodule_search_locations)))  # no __init__ run
        tree = ast.parse((folder / "types/responses/response_create_params.py").read_text(encoding="utf-8"))
        names = frozenset(node.target.id for cls in tree.body
                          if isinstance(cls, ast.ClassDef) and cls.name == "ResponseCreateParamsBase"
                          for node in cls.body if isinstance(node, ast.AnnAssign) and hasattr(node.target, "id"))
    except (AttributeError, OSError, StopIteration, SyntaxError, TypeError, ValueError) as exc:
        log.debug("reading openai's Responses parameters from its source failed (%s); importing it", exc)
        names = frozenset()
    if not names:
        from openai.types.responses.response_create_params import ResponseCreateParamsBase

        names = frozenset(ResponseCreateParamsBase.__annotations__)
    return names


def __getattr__(name: str) -> Any:
    if name == "KNOWN_PARAMS":  # `known_params()` under its former constant's name
        return known_params()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------- building


def make_response(
    text: str | None = None,
    *,
    tool_calls: list[tuple[str, dict[str, Any] | str]] | None = None,
    reasoning: str | None = None,
    incomplete: bool = False,
) -> dict[str, Any]:
    """A Responses object (wire dict) with optional reasoning, one assistant message and tool calls."""
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append(
            {
                "id": f"rs_{uuid.uuid4().hex[:8]}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    if text is not None:
        output.append(
            {
                "id": f"msg_{uuid.uuid4().hex[:8]}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for name, arguments in tool_calls or []:
        call_id = f"call_{uuid.uuid4().hex[:8]}"
        output.append(
            {
                "id": call_id,
                "call_id": call_id,
                "type": "function_call",
                "status": "completed",
                "name": name,
                "arguments": arguments if isinstance(arguments, str) else _dumps(arguments),
            }
        )
    return {
        "id": f"resp_{uuid.uuid4().hex[:8]}",
        "object": "response",
        "created_at": 0,
        "model": "test-model",
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        },
    }


def _dumps(value: Any) -> str:
    return json.dumps(value)
