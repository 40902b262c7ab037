"""single_step_tool_use_with_argument_comparison: grade one next action against an expert's ("pivot" cloning).

The prompt is a conversation (often an expert trajectory cut just before one of its actions); the model must take
the next action: call the right tool(s) with the right arguments, or answer with a message. One model call, no tool
is executed.

## Task fields
- `expected_action`, one of:
  - `{"type": "function_call", "name": ..., "arguments": "<JSON text>"}`: one tool call;
  - `{"type": "function_call_batch", "calls": [<function_call>, ...]}`: several calls made together, in any order;
  - `{"type": "message", "content": ...}`: a chat message (its content is not compared).
  Expected `arguments` must be JSON; a row that breaks these rules is a 422 naming the field.
- Any other field (`uuid`, `agent_ref`, `metadata`, ...) is echoed untouched.

## Reward
The model's action is all of its `function_call` items when it made any, else the first `output_text` of its first
assistant message, else none (`no_action_found`, 0.0). Reasoning items are never an action.
- Expected message: 1.0 for a message (`expected_chat_message_found`), 0.0 for tool calls
  (`unexpected_tool_call`) or a blank message (`empty_message`).
- Expected call(s): 0.0 for a message (`no_tool_call`). Otherwise each expected call must be paired with its own
  actual call (a maximum bipartite matching, so order does not matter) that matches it under
  `gymfleet.grading.toolcalls`' rule: same name; arguments that parse as JSON; dicts with the same keys; lists of the
  same length, element by element; numbers within 1e-6; strings equal when either has fewer than two words, else a
  word overlap `|E ∩ A| / (|E| + |A|)` (lower-cased word multisets, at most 0.5) of at least
  `word_count_similarity_threshold`.
  1.0 when every expected call is matched (`expected_tool_call`), else 0.0 (`tool_call_mismatch`). Calls beyond
  the expected ones are free unless `max_extra_calls` is set (`too_many_calls`).
The response adds `category` (the codes above) and `reason` (why the reward is 0, naming the call and the argument
path, e.g. `get_weather: arguments.city: expected 'Paris', got 'Lyon'`; null at 1.0).

## Departures from NeMo-Gym
- Numbers compare by value: `3` matches an expected `3.0` and `3.0` an expected `3` (NeMo-Gym asks the actual
  value to be an instance of the expected one's type, so it rejects both); `true` never matches a number (NeMo-Gym
  lets `true` match an expected `1`).
- A blank message (empty or whitespace) does not count as the expected message (NeMo-Gym pays any message).
- `max_extra_calls` (new, default null = NeMo-Gym's "extra calls are free") lets a config refuse a policy that
  sprays many argument variants hoping one matches.
- A row whose expected `arguments` is not JSON is a 422 (NeMo-Gym's verify raises, a 500).
- Rollouts run through `simple_agent` with `max_steps: 1` (NeMo-Gym's `tool_simulation_agent` is not ported): one
  model call; the agent still POSTs the calls to this server, which has no tool routes, so the outputs the episode
  records are 404 errors. Only the model's `function_call` and message items are graded.
- `parallel_tool_call_rewarding` accepts only `false`, the value in every NeMo-Gym recipe config.

## Config
- `tool_call_comparator_config.word_count_similarity_threshold` (0 to 1, default 0.1). Shipped configs:
  `single_step_tool_use_with_argument_comparison.yaml` 0.1 (conversational tool use),
  `search_pivot_single_step_tool_use_with_argument_comparison.yaml` 0.3,
  `toolcall_schema_single_step_tool_use_with_argument_comparison.yaml` 0.1,
  `swe_pivot_single_step_tool_use_with_argument_comparison.yaml` 0.0 (multi-word strings always pass).
- `tool_call_comparator_config.parallel_tool_call_rewarding`: `false` only.
- `max_extra_calls`: null (any number of extra calls) or the most calls beyond the expected count.

## Tools
None: the model's calls are graded, never executed.

## Version history
- v1: NeMo-Gym main's behaviour (all calls, bipartite matching; Gym super-v3 / v0.4.0 compared only the first
  call) with the departures above.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gymfleet.grading.toolcalls import ArgumentsError, Call, extract_action, match_calls, parse_arguments
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse

log = logging.getLogger(__name__)

Category = Literal[
    "no_action_found", "expected_chat_message_found", "unexpected_tool_call", "empty_message", "no_tool_call",
    "expected_tool_call", "tool_call_mismatch", "too_many_calls",
]  # fmt: skip


class ToolCallComparatorConfig(BaseModel):
    """How arguments are compared (NeMo-Gym's key names)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    word_count_similarity_threshold: float = Field(default=0.1, ge=0.0, le=1.0)
    """Least word overlap (0 to 0.5 in practice) for two multi-word strings to match."""
    parallel_tool_call_rewarding: Literal[False] = False
    """NeMo-Gym's partial-credit switch for batches; only `false` (all-or-nothing) is implemented."""


class SingleStepConfig(ResourcesServerConfig):
    """single_step_tool_use_with_argument_comparison's fields."""

    tool_call_comparator_config: ToolCallComparatorConfig = Field(default_factory=ToolCallComparatorConfig)
    max_extra_calls: int | None = Field(default=None, ge=0)
    """Most calls beyond the expected ones (null: any number, as NeMo-Gym)."""


def _expected_call(value: Any, where: str) -> Call:
    """The expected call at `where` in the row; ValueError naming the field and the fix otherwise."""
    if not isinstance(value, dict) or value.get("type") != "function_call":
        raise ValueError(f"{where} must be an object with type 'function_call'")
    name, arguments = value.get("name"), value.get("arguments")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name must be the tool's name (a non-empty string)")
    if not isinstance(arguments, str):
        raise ValueError(f"{where}.arguments must be the arguments as JSON text, e.g. '{{\"city\": \"Paris\"}}'")
    try:
        parse_arguments(arguments)
    except ArgumentsError as exc:
        raise ValueError(f"{where}.arguments: {exc}") from None
    return Call(name, arguments)


def expected_calls(action: dict[str, Any]) -> list[Call] | None:
    """The calls an `expected_action` asks for, or None when it asks for a message; ValueError for a bad action."""
    kind = action.get("type")
    if kind == "message":
        if not isinstance(action.get("content"), str):
            raise ValueError("expected_action.content must be a string for type 'message'")
        return None
    if kind == "function_call":
        return [_expected_call(action, "expected_action")]
    if kind == "function_call_batch":
        calls = action.get("calls")
        if not isinstance(calls, list) or not calls:
            raise ValueError("expected_action.calls must be a non-empty list of function_call objects")
        return [_expected_call(call, f"expected_action.calls[{index}]") for index, call in enumerate(calls)]
    raise ValueError(
        f"expected_action.type must be 'function_call', 'function_call_batch' or 'message', not {kind!r}"
    )


class SingleStepRequest(VerifyRequest):
    """A row to grade."""

    expected_action: dict[str, Any]

    @field_validator("expected_action")
    @classmethod
    def _valid_action(cls, value: dict[str, Any]) -> dict[str, Any]:
        expected_calls(value)
        return value


class SingleStepResponse(VerifyResponse):
    """The graded row."""

    category: Category
    reason: str | None = None


def score(
    action: dict[str, Any], response: Any, threshold: float, max_extra_calls: int | None = None
) -> tuple[float, Category, str | None]:
    """`(reward, category, reason)` for a response whose next action should be `action` (a valid expected_action)."""
    wanted = expected_calls(action)
    actual = extract_action(response)
    if actual is None:
        return 0.0, "no_action_found", "the response has no tool call and no message"
    if wanted is None:
        if actual.kind == "calls":
            return 0.0, "unexpected_tool_call", f"expected a message, got a call to {actual.calls[0].name!r}"
        if not actual.text.strip():
            return 0.0, "empty_message", "expected a message, got a blank one"
        return 1.0, "expected_chat_message_found", None
    if actual.kind == "message":
        return 0.0, "no_tool_call", f"expected a call to {wanted[0].name!r}, got a message"
    matching = match_calls(wanted, actual.calls, threshold)
    if not matching.all_expected_matched:
        return 0.0, "tool_call_mismatch", "; ".join(matching.reasons.values())
    if max_extra_calls is not None and matching.extra_calls > max_extra_calls:
        extra = matching.extra_calls
        return 0.0, "too_many_calls", f"{extra} calls beyond the expected ones (at most {max_extra_calls})"
    return 1.0, "expected_tool_call", None


class SingleStepServer(ResourcesServer):
    """Grades one next action (tool calls or a message) against the expected one."""

    config: SingleStepConfig
    reverify_mode = "stateless"
    reward_libraries = ()

    async def verify(self, body: SingleStepRequest) -> SingleStepResponse:
        reward, category, reason = score(
            body.expected_action, body.response,
            self.config.tool_call_comparator_config.word_count_similarity_threshold, self.config.max_extra_calls,
        )
        log.debug("verify: reward=%s category=%s reason=%s", reward, category, reason)
        return SingleStepResponse.echo(body, reward=reward, category=category, reason=reason)
