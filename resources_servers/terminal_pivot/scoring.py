"""terminal_pivot grading: pure functions from a model's reply and a gold Terminus turn to a reward.

A Terminus turn is one JSON object holding the next batch of terminal keystrokes. The reply is parsed, checked
against its harness's schema, gated on the task-complete flag, and scored by how closely its keystrokes, joined,
match the gold's (`gymfleet.grading.text.sequence_similarity`). `resources_servers/terminal_pivot/app.py` documents the
rules for users; this module holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from jsonschema import Draft202012Validator

from gymfleet.grading.text import sequence_similarity
from gymfleet.wire import Response

Harness = Literal["terminus_1", "terminus_2"]
HARNESSES: tuple[Harness, ...] = ("terminus_1", "terminus_2")
THINK_CLOSE = "</think>"

# Terminus 1 answers with a strict object (the pydantic schema the harness prints into its prompt): four fields,
# each command with all three of its fields, nothing else.
TERMINUS_1_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["state_analysis", "explanation", "commands", "is_task_complete"],
    "properties": {
        "state_analysis": {"type": "string"},
        "explanation": {"type": "string"},
        "commands": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["keystrokes", "is_blocking", "timeout_sec"],
                "properties": {
                    "keystrokes": {"type": "string"},
                    "is_blocking": {"type": "boolean"},
                    "timeout_sec": {"type": "number"},
                },
            },
        },
        "is_task_complete": {"type": "boolean"},
    },
}

# Terminus 2 requires `analysis`, `plan` and `commands`; `task_complete` and each command's `duration` are optional
# (the harness defaults them), and the harness tolerates other keys, so they are allowed.
TERMINUS_2_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["analysis", "plan", "commands"],
    "properties": {
        "analysis": {"type": "string"},
        "plan": {"type": "string"},
        "commands": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["keystrokes"],
                "properties": {"keystrokes": {"type": "string"}, "duration": {"type": "number"}},
            },
        },
        "task_complete": {"type": "boolean"},
    },
}

_VALIDATORS = {
    "terminus_1": Draft202012Validator(TERMINUS_1_SCHEMA),
    "terminus_2": Draft202012Validator(TERMINUS_2_SCHEMA),
}
# The flag that ends the episode, by harness (used by the two-way completion check).
COMPLETION_KEYS: dict[Harness, str] = {"terminus_1": "is_task_complete", "terminus_2": "task_complete"}


class FailureCode(StrEnum):
    """Why a reply scored 0 (NeMo-Gym's codes, plus KEYSTROKES_TOO_LONG)."""

    JSON_PARSING_FAILED = "JSON_PARSING_FAILED"
    UNKNOWN_HARNESS = "UNKNOWN_HARNESS"
    SCHEMA_CHECK_FAILED = "SCHEMA_CHECK_FAILED"
    TASK_COMPLETE_CHECK_FAILED = "TASK_COMPLETE_CHECK_FAILED"
    KEYSTROKES_TOO_LONG = "KEYSTROKES_TOO_LONG"
    COMMAND_CORRECTNESS_FAILED = "COMMAND_CORRECTNESS_FAILED"


@dataclass(frozen=True)
class Rules:
    """Server-wide grading settings (the config's fields)."""

    require_matching_completion: bool = False
    max_keystroke_chars: int = 50_000


@dataclass(frozen=True)
class Grade:
    """The outcome for one reply."""

    reward: float
    model_output: str
    similarity: float | None = None
    failure_reason: FailureCode | None = None


def reply_text(response: Response) -> str:
    """The text graded: every text part of every assistant message joined by line feeds, stripped, and cut to
    what follows the last `</think>` (stripped again) when there is one."""
    parts = [
        part.text
        for item in response.output
        if item.type == "message" and getattr(item, "role", None) == "assistant"
        for part in item.content
        if getattr(part, "type", None) == "output_text"
    ]
    text = "\n".join(parts).strip()
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1].strip()
    return text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_turn(text: str) -> Any:
    """The JSON value `text` holds, or None when it is not JSON.

    Python's `json` extensions `NaN`, `Infinity` and `-Infinity` are refused, as are integers longer than Python
    converts (4,300 digits) and nesting deeper than its parser recurses.
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None


def gold_problem(expected_answer: str) -> str | None:
    """What makes a gold turn unusable for grading (None when it is fine).

    The gold must be a JSON object whose `commands` is a list of objects, each with a string `keystrokes`.
    """
    gold = parse_turn(expected_answer)
    if not isinstance(gold, dict):
        return "must be a JSON object (a Terminus turn) written as a string"
    commands = gold.get("commands")
    if not isinstance(commands, list):
        return "must hold a 'commands' list"
    for index, command in enumerate(commands):
        if not isinstance(command, dict) or not isinstance(command.get("keystrokes"), str):
            return f"commands[{index}] must be an object with a string 'keystrokes'"
    return None


def completion_ok(predicted: dict[str, Any], gold: dict[str, Any], harness: Harness, two_way: bool) -> bool:
    """The task-complete gate.

    A gold turn that declares the task complete (`task_complete`, else `is_task_complete`, true) needs a reply
    declaring it under the same key. With `two_way`, a reply must also not declare completion (its harness's key)
    when the gold does not.
    """
    for key in ("task_complete", "is_task_complete"):
        if gold.get(key):
            return bool(predicted.get(key))
    if two_way:
        return not predicted.get(COMPLETION_KEYS[harness])
    return True


def keystrokes(turn: dict[str, Any]) -> list[str]:
    """The `keystrokes` of each command of `turn`, in order."""
    return [command["keystrokes"] for command in turn["commands"]]


def command_similarity(gold: dict[str, Any], predicted: dict[str, Any], max_chars: int) -> float | None:
    """How alike the two turns' keystrokes are, joined: 1.0 when neither has a command, 0.0 when only one has;
    None when the reply's keystrokes exceed `max_chars` (the comparison's cost grows with the product of lengths)."""
    expected, given = keystrokes(gold), keystrokes(predicted)
    if not expected or not given:
        return float(not expected and not given)
    joined = "".join(given)
    if len(joined) > max_chars:
        return None
    return sequence_similarity("".join(expected), joined)


def grade(
    text: str, expected_answer: str, harness: str | None, threshold: float | None, rules: Rules = Rules()
) -> Grade:
    """Grade the reply `text` (already cut by `reply_text`) against the gold turn.

    Checks, in order, each failing with reward 0: the reply is JSON; the row's harness is known; the reply
    validates under the harness's schema; the completion gate (`completion_ok`); the reply's keystrokes fit in
    `rules.max_keystroke_chars`; the similarity reaches `threshold` (when set). Otherwise the reward is the
    similarity itself.

    Args:
        text: The reply, as `reply_text` gives it.
        expected_answer: The gold turn, a JSON string that passed `gold_problem`.
        harness: The row's `metadata.harness`.
        threshold: The row's similarity threshold, or None for none.
        rules: Server-wide settings.
    """
    predicted = parse_turn(text)
    if predicted is None:
        return Grade(0.0, text, failure_reason=FailureCode.JSON_PARSING_FAILED)
    if harness not in HARNESSES:
        return Grade(0.0, text, failure_reason=FailureCode.UNKNOWN_HARNESS)
    if not _VALIDATORS[harness].is_valid(predicted):
        return Grade(0.0, text, failure_reason=FailureCode.SCHEMA_CHECK_FAILED)
    gold = parse_turn(expected_answer)
    if not completion_ok(predicted, gold, harness, rules.require_matching_completion):
        return Grade(0.0, text, failure_reason=FailureCode.TASK_COMPLETE_CHECK_FAILED)
    similarity = command_similarity(gold, predicted, rules.max_keystroke_chars)
    if similarity is None:
        return Grade(0.0, text, failure_reason=FailureCode.KEYSTROKES_TOO_LONG)
    if threshold is not None and similarity < threshold:
        return Grade(0.0, text, similarity, FailureCode.COMMAND_CORRECTNESS_FAILED)
    return Grade(similarity, text, similarity)
