"""Tool-call comparison: read a model's next action and compare it with an expected one.

Shared by the environments that grade a single next action against an expert's (behaviour cloning, "pivot" data):
`single_step_tool_use_with_argument_comparison`, `swe_pivot`, and later `terminal_pivot` / `workplace_assistant`.

Public names:
- `Call` (a tool call: `name`, `arguments` as the JSON text the model wrote), `Action` (the model's next action:
  tool calls or a message), `function_calls(response)`, `first_message_text(response)`, `extract_action(response)`.
- `parse_arguments(text)`: JSON arguments, or `ArgumentsError` (a `ValueError`) naming what is wrong.
- `word_overlap(expected, actual)`: the multiset word overlap `|E ∩ A| / (|E| + |A|)` (0 to 0.5).
- `compare_values(expected, actual, threshold)`: `None` when an actual argument value matches the expected one, else
  the reason it does not (the recursive rule below).
- `compare_calls(expected, actual, threshold)`: the same for two whole calls (name, then arguments).
- `max_matching(n_left, n_right, edge)`: a maximum bipartite matching as `(left, right)` pairs.
- `match_calls(expected, actual, threshold)`: every expected call paired with a distinct actual call that matches it,
  as many as possible (`CallMatching`).

## The comparison rule (NeMo-Gym's `single_step_tool_use_with_argument_comparison`, spec §2.10)
Two calls match when their names are equal and the actual arguments parse as JSON and match the expected ones:
- a dict needs the very same key set, and each value must match;
- a list needs the same length, element by element;
- a string: when either side has fewer than two whitespace-separated words, the strings must be equal exactly;
  otherwise `word_overlap` of the lower-cased words must be at least `threshold` (so threshold 0 accepts any pair
  of multi-word strings);
- a number matches a number within `1e-6` (ints exactly); any other value (`true`, `null`) must be equal.
Departures from NeMo-Gym (which asks `isinstance(actual, type(expected))`): numbers compare by value whatever their
JSON spelling (`3` matches `3.0` and back; NeMo-Gym rejects `3` for an expected float and `3.0` for an int), and a
boolean is never a number (NeMo-Gym lets `true` match an expected `1`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FLOAT_TOLERANCE = 1e-6
"""Two non-integer numbers match when they differ by less than this."""


@dataclass(frozen=True)
class Call:
    """One tool call: the tool's name and its arguments as the JSON text written (not yet parsed)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Action:
    """A model's next action: `kind == "calls"` with `calls` (one or more), or `kind == "message"` with `text`."""

    kind: Literal["calls", "message"]
    calls: tuple[Call, ...] = ()
    text: str = ""


class ArgumentsError(ValueError):
    """Tool-call arguments that are not JSON."""


def _item_type(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def _field(item: Any, name: str, default: Any = None) -> Any:
    return item.get(name, default) if isinstance(item, dict) else getattr(item, name, default)


def function_calls(response: Any) -> list[Call]:
    """Every `function_call` item of a Responses object (model or wire dict), in output order."""
    output = _field(response, "output") or []
    return [Call(str(_field(item, "name") or ""), str(_field(item, "arguments") or ""))
            for item in output if _item_type(item) == "function_call"]


def first_message_text(response: Any) -> str | None:
    """The first `output_text` part of the first assistant message (None when there is no such part)."""
    for item in _field(response, "output") or []:
        if _item_type(item) == "message" and _field(item, "role", "assistant") == "assistant":
            for part in _field(item, "content") or []:
                if _item_type(part) == "output_text":
                    return str(_field(part, "text") or "")
            return None
    return None


def extract_action(response: Any) -> Action | None:
    """The next action a response takes: all its tool calls if it made any, else its first message, else None.

    Reasoning items and tool outputs are never an action; a message that comes with tool calls is ignored.
    """
    calls = function_calls(response)
    if calls:
        return Action("calls", calls=tuple(calls))
    text = first_message_text(response)
    if text is not None:
        return Action("message", text=text)
    return None


def parse_arguments(text: str) -> Any:
    """The JSON value `text` holds; `ArgumentsError` when it is not JSON (or nests deeper than Python can parse)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ArgumentsError(f"arguments are not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def word_overlap(expected: str, actual: str) -> float:
    """`|E ∩ A| / (|E| + |A|)` over the lower-cased whitespace words, as multisets; 0 when both are empty."""
    expected_words = Counter(expected.lower().split())
    actual_words = Counter(actual.lower().split())
    total = expected_words.total() + actual_words.total()
    return (expected_words & actual_words).total() / total if total else 0.0


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numbers_match(expected: int | float, actual: int | float) -> bool:
    if isinstance(expected, int) and isinstance(actual, int):
        return expected == actual
    try:
        return abs(float(actual) - float(expected)) < FLOAT_TOLERANCE
    except OverflowError:  # an int too large for a float cannot be within the tolerance of anything finite
        return False


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def compare_values(expected: Any, actual: Any, threshold: float, path: str = "arguments") -> str | None:
    """None when `actual` matches `expected` under the module's rule, else why not (naming the JSON path)."""
    if _is_number(expected):
        if not _is_number(actual):
            return f"{path}: expected a number, got {_type_name(actual)}"
        return None if _numbers_match(expected, actual) else f"{path}: expected {expected!r}, got {_short(actual)}"
    if not isinstance(actual, type(expected)):  # expected is not a number here, so neither may actual be
        return f"{path}: expected {_type_name(expected)}, got {_type_name(actual)}"
    if isinstance(expected, dict):
        if set(expected) != set(actual):
            missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
            return f"{path}: keys differ (missing {missing}, unexpected {extra[:10]})"
        for key, value in expected.items():
            reason = compare_values(value, actual[key], threshold, f"{path}.{key}")
            if reason:
                return reason
        return None
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} items, got {len(actual)}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            reason = compare_values(want, got, threshold, f"{path}[{index}]")
            if reason:
                return reason
        return None
    if isinstance(expected, str):
        return _compare_strings(expected, actual, threshold, path)
    return None if expected == actual else f"{path}: expected {_short(expected)}, got {_short(actual)}"


def _compare_strings(expected: str, actual: str, threshold: float, path: str) -> str | None:
    if len(expected.split()) < 2 or len(actual.split()) < 2:
        return None if expected == actual else f"{path}: expected {_short(expected)}, got {_short(actual)}"
    overlap = word_overlap(expected, actual)
    if overlap < threshold:
        return f"{path}: word overlap {overlap:.3f} is below {threshold}"
    return None


def compare_calls(expected: Call, actual: Call, threshold: float) -> str | None:
    """None when `actual` is the expected call (same name, matching arguments), else why not.

    `expected.arguments` must be JSON (the row's to guarantee; `ArgumentsError` otherwise); actual arguments that
    are not JSON are a mismatch.
    """
    return _compare_parsed(expected.name, parse_arguments(expected.arguments), actual.name, _parsed(actual), threshold)


def _parsed(call: Call) -> Any:
    """The call's arguments, or the `ArgumentsError` saying why they are not JSON."""
    try:
        return parse_arguments(call.arguments)
    except ArgumentsError as exc:
        return exc


def _compare_parsed(name: str, want: Any, actual_name: str, got: Any, threshold: float) -> str | None:
    if actual_name != name:
        return f"called {actual_name!r}, expected {name!r}"
    if isinstance(got, ArgumentsError):
        return f"{actual_name}: {got}"
    reason = compare_values(want, got, threshold)
    return f"{actual_name}: {reason}" if reason else None


def max_matching(n_left: int, n_right: int, edge: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """A maximum matching of the bipartite graph whose edges are the pairs with `edge(left, right)`, sorted by left.

    Kuhn's augmenting paths: `edge` is called once per pair (n_left · n_right calls), the search is O(n_left · E);
    recursion depth is at most `n_left`, so keep the left side the small one (the expected calls).
    """
    neighbours = [[right for right in range(n_right) if edge(left, right)] for left in range(n_left)]
    owner: list[int | None] = [None] * n_right

    def augment(left: int, seen: set[int]) -> bool:
        for right in neighbours[left]:
            if right in seen:
                continue
            seen.add(right)
            holder = owner[right]
            if holder is None or augment(holder, seen):
                owner[right] = left
                return True
        return False

    for left in range(n_left):
        augment(left, set())
    return sorted((left, right) for right, left in enumerate(owner) if left is not None)


@dataclass(frozen=True)
class CallMatching:
    """How expected calls pair with actual ones: `pairs` (expected index, actual index), and per unmatched expected
    call the reason its best candidate failed (`reasons`, keyed by expected index)."""

    pairs: list[tuple[int, int]]
    expected_count: int
    actual_count: int
    reasons: dict[int, str] = field(default_factory=dict)

    @property
    def all_expected_matched(self) -> bool:
        """Every expected call found its own actual call."""
        return len(self.pairs) == self.expected_count

    @property
    def extra_calls(self) -> int:
        """Actual calls left unmatched."""
        return self.actual_count - len(self.pairs)


def match_calls(expected: Sequence[Call], actual: Sequence[Call], threshold: float) -> CallMatching:
    """Pair each expected call with a distinct matching actual call, as many pairs as possible (order-free).

    Each call's arguments are parsed once; `ArgumentsError` when an expected call's arguments are not JSON.
    """
    wants = [parse_arguments(call.arguments) for call in expected]
    gots = [_parsed(call) if any(call.name == want.name for want in expected) else None for call in actual]
    reasons: dict[tuple[int, int], str | None] = {
        (i, j): _compare_parsed(want.name, wants[i], got.name, gots[j], threshold)
        for i, want in enumerate(expected) for j, got in enumerate(actual)
    }
    pairs = max_matching(len(expected), len(actual), lambda i, j: reasons[i, j] is None)
    matched = {i for i, _ in pairs}
    unmatched: dict[int, str] = {}
    for i, want in enumerate(expected):
        if i in matched:
            continue
        same_name = [reasons[i, j] for j, got in enumerate(actual) if got.name == want.name]
        taken = {j for _, j in pairs}
        spare = [reasons[i, j] for j, got in enumerate(actual) if got.name == want.name and j not in taken]
        failures = [reason for reason in spare + same_name if reason]  # a spare call's failure explains best
        if not same_name:
            called = sorted({call.name for call in actual})[:10]
            unmatched[i] = f"no call to {want.name!r}" + (f" (called {called})" if called else "")
        elif None in same_name:
            unmatched[i] = f"every matching call to {want.name!r} is taken by another expected call"
        else:
            unmatched[i] = failures[0]
    return CallMatching(pairs, len(expected), len(actual), unmatched)
