"""The scripted model's script: rules (regex → reply) checked in order, first match wins, else the default reply.

A rule may also inject faults, so clients' retries, deadlines and error handling can be tested against a real
server: `status` answers that HTTP status with a vLLM-shaped error body (for the first `fail_times` matching
requests, or always), `retry_after_s` adds a `Retry-After` header, `delay_s` sleeps before answering.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from responses_api_models.scripted_model.tokenizer import message_text


class ScriptedToolCall(BaseModel):
    """One tool call the scripted reply makes."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    """Function name."""
    arguments: dict[str, Any] | str = {}
    """Arguments as an object, or a string sent verbatim (which may be malformed JSON on purpose: real models
    emit broken arguments, and agents and environments must cope)."""

    def arguments_json(self) -> str:
        """Arguments as the JSON string a Chat completion carries."""
        if isinstance(self.arguments, str):
            try:
                return json.dumps(json.loads(self.arguments), ensure_ascii=False)
            except json.JSONDecodeError:
                return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


class Reply(BaseModel):
    """What the model answers."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    text: str = ""
    """Assistant content."""
    reasoning: str | None = None
    """Reasoning, returned as `reasoning_content` and generated as a leading `<think>` block."""
    tool_calls: list[ScriptedToolCall] = []
    """Tool calls, in order."""
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    """Reported finish reason; by default "tool_calls" when there are tool calls, else "stop". With "length" the
    generation ends without `<|im_end|>`, as a model cut off by its token budget does."""

    @model_validator(mode="after")
    def _length_has_no_tool_calls(self):
        if self.finish_reason == "length" and self.tool_calls:
            raise ValueError("a reply cut off by length (finish_reason: length) cannot make tool_calls")
        return self


class Rule(Reply):
    """A reply given when `match` is found in the conversation text chosen by `match_in` (and at `turn`, if set)."""

    match: str
    """Python regex, searched (`re.search`, DOTALL) in the `match_in` text."""
    match_in: Literal["last_user", "last_message", "transcript"] = "last_user"
    """Which text to search: the last user message, the last message of any role (e.g. a tool output), or every
    message's content joined with newlines."""
    turn: int | None = Field(default=None, ge=0)
    """Only when the conversation already holds exactly this many assistant messages (0: the first model call of
    a rollout), so a multi-step script can say what to do at each step whatever the tool outputs are."""
    status: int | None = Field(default=None, ge=400, le=599)
    """Fault: answer this HTTP status (e.g. 429, 500, 503) with a vLLM-shaped error body instead of the reply."""
    fail_times: int | None = Field(default=None, ge=1)
    """Fault: fail only the first N matching requests, then give the reply (tests retries). Unset: always fail."""
    retry_after_s: float | None = Field(default=None, ge=0)
    """Fault: `Retry-After` header (seconds) sent with the error status."""
    error_message: str | None = None
    """Fault: the error body's message (default: the status's reason phrase)."""
    delay_s: float = Field(default=0.0, ge=0)
    """Sleep this long before answering (failing or not), to test clients' deadlines."""

    _pattern: re.Pattern[str] = PrivateAttr()

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _faults_need_status(self):
        fault_fields = ("fail_times", "retry_after_s", "error_message")
        orphans = [name for name in fault_fields if getattr(self, name) is not None]
        if orphans and self.status is None:
            raise ValueError(f"{', '.join(orphans)} only apply to a failing rule: set `status` (e.g. 503) too")
        return self

    def model_post_init(self, context: Any) -> None:
        self._pattern = re.compile(self.match, re.DOTALL)

    def matches(self, messages: list[dict[str, Any]]) -> bool:
        if self.turn is not None and sum(message.get("role") == "assistant" for message in messages) != self.turn:
            return False
        return self._pattern.search(conversation_text(messages, self.match_in)) is not None


def conversation_text(messages: list[dict[str, Any]], match_in: str) -> str:
    """The text a rule searches (see `Rule.match_in`)."""
    if match_in == "transcript":
        return "\n".join(message_text(message.get("content")) for message in messages)
    if match_in == "last_user":
        messages = [message for message in messages if message.get("role") == "user"]
    return message_text(messages[-1].get("content")) if messages else ""


def choose(rules: list[Rule], default: Reply, messages: list[dict[str, Any]]) -> Reply | Rule:
    """The first rule matching `messages`, else `default`."""
    return next((rule for rule in rules if rule.matches(messages)), default)
