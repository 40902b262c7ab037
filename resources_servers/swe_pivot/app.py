"""swe_pivot: the PivotRL verifier — one SWE-agent tool call graded against the expert's, level by level.

The prompt is a coding agent's trajectory cut before one of the expert's actions; the model must make that next
tool call. Grading is layered, cheapest first, and needs no judge:
Level 0 the tool (same name or category), Level 1 the target (file, editor sub-command, lines viewed, shell program
and paths), Level 2 the content (string similarity), Level 4 a size penalty on edits (continuous mode).

## Task fields
- `expected_action`: `{"type": "function_call", "name": ..., "arguments": "<JSON object text>"}`. When absent, the
  same object as JSON text in `expected_answer`, or in `metadata.expected_action`, is used (NeMo-Gym's order).
  A row without a readable expected call (or whose arguments are not a JSON object) is a 422 naming the field.
- Any other field (`uuid`, `pivot_tags`, `metadata`, ...) is echoed untouched.

## Reward
Only the response's first `function_call` item is graded; a response without one scores 0 (`model_output_invalid`),
as do arguments that are not a JSON object.
- Level 0 (`tool_name_match`): the same tool name (any case), or two names of the same known category: `edit`
  (`str_replace_editor`, `edit_file`, `apply_patch`, `write_file`, ...), `bash` (`execute_bash`, `shell`,
  `terminal`, ...), `search` (`grep`, `glob`, `list_dir`, ...), `read` (`read_file`, `view`, ...), `finish`,
  `think`, `planning`; each also in CamelCase (`StrReplaceEditor`). Else 0 (`tool_name_mismatch`).
- Level 1 (`target_match`, `enable_target_match`), else 0 (`target_mismatch`):
  edit vs edit: the editor sub-command (`command`: view / str_replace / create / ...) must be the expected one; the
  file (`path`, `file`, `file_path`, `filename`, `file_name`) must end in the same last two path components; for
  `view`, when both give a `view_range`, the model's must cover at least 80% of the expected lines.
  bash vs bash: the same program (first word, directory stripped); when both commands name paths, at least one
  path's last three components in common; and a command similarity of at least 0.3.
  search / read vs search / read: the same last three path components.
- Level 2 (`similarity_score`, `enable_argument_similarity`): `difflib.SequenceMatcher` ratio with each side cut to
  2,000 characters. Edits that replace text: the smaller of the `old_str` and `new_str` similarities (an empty side
  matches only an empty side); other edits: the written content (`patch`, `diff`, `content`, `file_text`), 1 when
  neither writes any and 0 when only one does; bash: the commands; other tools: 1.
- `reward_mode: binary`: 1 when the similarity is at least `similarity_full_credit` (0.8), else 0
  (`similarity_below_threshold`). `continuous`: 1 at or above 0.8; `0.5 + 0.5 · (s − 0.4) / (0.8 − 0.4)` from
  `similarity_threshold` (0.4) up; else 0. Then, for edits (`enable_diff_size_shaping`), times
  `1 − diff_size_alpha · min(len(edit) / 500, 1)` (`diff_size_penalty`), where the edit is `old_str` + `new_str`
  or the written content.
The response adds `tool_name_match`, `target_match`, `similarity_score`, `diff_size_penalty` (null for levels not
reached), `failure_reason` (`none` or the codes above), `reason` (text) and `model_output` (`name(arguments)`, cut
to 500 characters of arguments).

## Departures from NeMo-Gym
Each closes a way to score without naming the expert's target:
- An expected target the call leaves out is a mismatch: no `path` when the expert names a file, no editor
  sub-command when the expert gives one, no `command` for an expected bash command. NeMo-Gym skips the comparison
  when either side is empty, so `execute_bash({})` or `str_replace_editor({"command": "view"})` scored 1.
- Arguments that are not a JSON object score 0 (`model_output_invalid`); NeMo-Gym reads them as `{}` (then the
  skipped comparisons above let them pass).
- A row without a readable expected call is a 422, not a reward-0 row (`expected_action_invalid`).
- Rollouts run through `simple_agent` with `max_steps: 1` (NeMo-Gym: `tool_simulation_agent`); the agent POSTs
  the call to this server, which has no tool routes, so the episode records a 404 as its output. Only the model's
  first call is graded.

## Config
- `reward_mode`: `binary` (default, as NeMo-Gym's code; its README says continuous) or `continuous`.
- `enable_target_match` (true), `enable_argument_similarity` (true), `enable_diff_size_shaping` (true, continuous
  only): switch levels 1, 2 and 4.
- `similarity_threshold` (0.4) < `similarity_full_credit` (0.8): the continuous ramp; binary uses the latter.
- `diff_size_alpha` (0.1): the largest size penalty.

## Tools
None: the model's call is graded, never executed.

## Version history
- v1: NeMo-Gym's PivotRL verifier with the departures above.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from gymfleet.grading.toolcalls import ArgumentsError, Call, function_calls, parse_arguments
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.swe_pivot.levels import (
    argument_similarity,
    edit_size_penalty,
    target_mismatch,
    tool_category,
)

log = logging.getLogger(__name__)

FailureReason = Literal[
    "none", "model_output_invalid", "tool_name_mismatch", "target_mismatch", "similarity_below_threshold"
]


class SwePivotConfig(ResourcesServerConfig):
    """swe_pivot's fields (NeMo-Gym's names and defaults)."""

    reward_mode: Literal["binary", "continuous"] = "binary"
    enable_target_match: bool = True
    """Level 1: the call must work on the expected file / command."""
    enable_argument_similarity: bool = True
    """Level 2: the call's content must be similar enough."""
    similarity_threshold: float = Field(default=0.4, ge=0.0, le=1.0)
    """Continuous mode: the least similarity earning partial credit (0.5)."""
    similarity_full_credit: float = Field(default=0.8, ge=0.0, le=1.0)
    """The similarity earning full credit (binary mode: the only one that earns any)."""
    enable_diff_size_shaping: bool = True
    """Level 4, continuous mode only: shrink the reward of long edits."""
    diff_size_alpha: float = Field(default=0.1, ge=0.0, le=1.0)
    """The largest share of the reward a long edit loses."""

    @model_validator(mode="after")
    def _ramp(self) -> Self:
        if self.similarity_threshold >= self.similarity_full_credit:
            raise ValueError(
                f"similarity_threshold ({self.similarity_threshold}) must be below similarity_full_credit "
                f"({self.similarity_full_credit})"
            )
        return self


def _as_call(value: Any, where: str) -> Call | None:
    """The function call `value` describes (a dict, or its JSON text), None when it is not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or value.get("type") != "function_call":
        return None
    name, arguments = value.get("name"), value.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name must be the expected tool's name (a non-empty string)")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments)
    if not isinstance(arguments, str) or not isinstance(_object_or_none(arguments), dict):
        raise ValueError(f"{where}.arguments must be a JSON object's text, e.g. '{{\"command\": \"ls\"}}'")
    return Call(name, arguments)


def _object_or_none(text: str) -> Any:
    try:
        value = parse_arguments(text)
    except ArgumentsError:
        return None
    return value if isinstance(value, dict) else None


class SwePivotRequest(VerifyRequest):
    """A row to grade."""

    expected_action: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _has_expected_call(self) -> Self:
        self.expected_call()
        return self

    def expected_call(self) -> Call:
        """The expert's call: `expected_action`, else `expected_answer` (JSON text), else metadata's."""
        extra = self.model_extra or {}
        metadata = extra.get("metadata")
        sources = [
            ("expected_action", self.expected_action),
            ("expected_answer", extra.get("expected_answer")),
            ("metadata.expected_action", metadata.get("expected_action") if isinstance(metadata, dict) else None),
        ]
        for where, value in sources:
            if value is not None and (call := _as_call(value, where)) is not None:
                return call
        raise ValueError(
            "the row needs expected_action = {'type': 'function_call', 'name': ..., 'arguments': '<JSON object>'} "
            "(or the same as JSON text in expected_answer, or in metadata.expected_action)"
        )


class SwePivotResponse(VerifyResponse):
    """The graded row."""

    tool_name_match: bool
    target_match: bool | None = None
    similarity_score: float | None = None
    diff_size_penalty: float | None = None
    failure_reason: FailureReason
    reason: str | None = None
    model_output: str


def _ramp(score: float, config: SwePivotConfig) -> float:
    """Level 2's reward for a similarity `score`."""
    full, low = config.similarity_full_credit, config.similarity_threshold
    if score >= full:
        return 1.0
    if config.reward_mode == "continuous" and score >= low:
        return 0.5 + 0.5 * (score - low) / (full - low)
    return 0.0


def grade(expected: Call, response: Any, config: SwePivotConfig) -> dict[str, Any]:
    """The response fields (`reward` included) for a response whose first call should be `expected`."""
    calls = function_calls(response)
    if not calls:
        return {"reward": 0.0, "tool_name_match": False, "failure_reason": "model_output_invalid",
                "reason": "the response makes no tool call", "model_output": "(no function_call in response)"}
    call = calls[0]
    model_output = f"{call.name}({call.arguments[:500]})"
    result: dict[str, Any] = {"reward": 0.0, "tool_name_match": False, "model_output": model_output}
    got = _object_or_none(call.arguments)
    if got is None:
        reason = f"{call.name}: arguments are not a JSON object"
        return {**result, "failure_reason": "model_output_invalid", "reason": reason}
    want = json.loads(expected.arguments)
    category_got, category_want = tool_category(call.name), tool_category(expected.name)
    if call.name.lower() != expected.name.lower() and (category_got != category_want or category_got == "unknown"):
        return {**result, "failure_reason": "tool_name_mismatch",
                "reason": f"called {call.name!r} ({category_got}), expected {expected.name!r} ({category_want})"}
    result["tool_name_match"] = True
    reward = 1.0
    if config.enable_target_match:
        mismatch = target_mismatch(category_got, got, category_want, want)
        result["target_match"] = mismatch is None
        if mismatch:
            return {**result, "failure_reason": "target_mismatch", "reason": mismatch}
    if config.enable_argument_similarity:
        score = argument_similarity(category_got, got, category_want, want)
        result["similarity_score"] = score
        reward = _ramp(score, config)
        if reward == 0.0:
            continuous = config.reward_mode == "continuous"
            floor = config.similarity_threshold if continuous else config.similarity_full_credit
            reason = f"similarity {score:.3f} is below {floor}"
            return {**result, "failure_reason": "similarity_below_threshold", "reason": reason}
    if config.enable_diff_size_shaping and config.reward_mode == "continuous":
        penalty = edit_size_penalty(category_got, got, config.diff_size_alpha)
        result["diff_size_penalty"] = penalty
        reward *= 1.0 - penalty
    return {**result, "reward": reward, "failure_reason": "none", "reason": None}


class SwePivotServer(ResourcesServer):
    """Grades one SWE-agent tool call against the expert's."""

    config: SwePivotConfig
    reverify_mode = "stateless"
    reward_libraries = ()

    async def verify(self, body: SwePivotRequest) -> SwePivotResponse:
        fields = grade(body.expected_call(), body.response, self.config)
        log.debug("verify: reward=%s failure=%s", fields["reward"], fields["failure_reason"])
        return SwePivotResponse.echo(body, **fields)
