"""Request bodies the scripted model accepts, as vLLM does: unknown fields (vLLM extensions such as `top_k`,
`chat_template_kwargs`, `required_prefix_token_ids`) are ignored, wrongly typed known fields are a 422."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ChatFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] = ""


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str = "function"
    function: ChatFunction


class ChatMessage(BaseModel):
    """A Chat message; extra fields (a trainer's `prompt_token_ids`, `tool_call_id`, `name`) are kept."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    """vLLM >= 0.10's name for `reasoning_content`."""


def plain_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [message.model_dump(exclude_none=True) for message in messages]


class ChatRequest(BaseModel):
    """`POST /v1/chat/completions` body."""

    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1, fail_fast=True)
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """OpenAI's newer name for `max_tokens`; wins when both are given (as in vLLM)."""
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0)
    return_tokens_as_token_ids: bool | None = False
    """vLLM: logprob entries name tokens as `"token_id:<int>"`."""
    return_token_ids: bool | None = False
    """vLLM: also return top-level `prompt_token_ids` and `choices[0].token_ids`."""
    stream: bool | None = False
    n: int | None = 1


class TokenizeRequest(BaseModel):
    """vLLM's `POST /tokenize` body: a chat (`messages`) or a plain `prompt`."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    prompt: str | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of `messages` (a chat) or `prompt` (plain text)")
        return self
