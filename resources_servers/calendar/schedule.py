"""calendar grading: read the model's calendar out of its answer and check it against the expected events.

A pure function of (answer text, expected events), table-tested without a server; `app.py` adapts it to /verify.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

Reason = Literal[
    "pass", "empty_response", "think_found", "no_json_list", "too_many_events", "malformed_event", "duplicate_event",
    "different_number_of_events", "conflicting_events", "unknown_event", "constraint_violated",
]  # fmt: skip
MAX_EVENTS = 200
"""A calendar listing more entries scores 0 unread: the overlap check is quadratic, and no task has that many."""

# Matches "10am", "1:45pm", " 12:05 pm"; not "10AM", "13pm", "1:5pm" or "10 o'clock".
TWELVE_HOUR = re.compile(r"\s*(1[0-2]|0?[1-9])(?::([0-5][0-9]))?\s*(am|pm)\s*")
# Matches "13:30", "09:05", "9:05"; not "24:00", "13:5" or "1330".
TWENTY_FOUR_HOUR = re.compile(r"\s*([01]?[0-9]|2[0-3]):([0-5][0-9])\s*")


def parse_time(text: str) -> int:
    """Minutes after midnight for a clock time written "10am", "1:45pm" or "13:30".

    12-hour times need a lowercase `am`/`pm` (12am is midnight, 12pm noon); 24-hour times need `H:MM` or `HH:MM`.

    Raises:
        ValueError: If `text` is none of these.

    Examples:
        >>> parse_time("10am"), parse_time("1:45pm"), parse_time("13:30"), parse_time("12am")
        (600, 825, 810, 0)
    """
    if match := TWELVE_HOUR.fullmatch(text):
        hour, minute, half = int(match[1]) % 12, int(match[2] or 0), match[3]
        return (hour + (12 if half == "pm" else 0)) * 60 + minute
    if match := TWENTY_FOUR_HOUR.fullmatch(text):
        return int(match[1]) * 60 + int(match[2])
    raise ValueError(f"not a clock time: {text!r} (expected e.g. '10am', '1:45pm' or '13:30')")


@dataclass(frozen=True)
class Constraint:
    """When an event may sit: `kind` "before" (end <= first), "after" (start >= first), "between" (start >= first
    and end <= second), "at" (start == first), or None (anywhere). Times are minutes after midnight."""

    kind: Literal["before", "after", "between", "at"] | None = None
    first: int = 0
    second: int = 0

    @classmethod
    def parse(cls, text: str | None) -> Constraint:
        """Read "before 1:45pm", "after 10am", "between 10am and 11:45am", "at 2pm" or None.

        A text with any other prefix places no constraint (as in NeMo-Gym); a known prefix with bad times raises.
        """
        for kind in ("before", "after", "at"):
            if text is not None and text.startswith(f"{kind} "):
                return cls(kind, parse_time(text[len(kind) + 1 :]))
        if text is not None and text.startswith("between "):
            parts = text[len("between ") :].split(" and ")
            if len(parts) != 2:
                raise ValueError(f"'between' needs exactly one ' and ': {text!r}")
            return cls("between", parse_time(parts[0]), parse_time(parts[1]))
        return cls()

    def allows(self, start: int, end: int) -> bool:
        """Whether an event running [start, end) satisfies the constraint."""
        if self.kind == "before":
            return end <= self.first
        if self.kind == "after":
            return start >= self.first
        if self.kind == "between":
            return start >= self.first and end <= self.second
        if self.kind == "at":
            return start == self.first
        return True


@dataclass(frozen=True)
class Expected:
    """One event the calendar must hold: its duration, the window it must fit in and its constraint."""

    duration: float
    earliest: int
    latest: int
    constraint: Constraint


# ---------------------------------------------------------------------------------------------- finding the list

_SPECIAL = re.compile(r"[\[\]{}]")


def event_lists(text: str) -> list[str]:
    r"""Every `[...]` span holding an object, left to right, as `re.finditer` with NeMo-Gym's calendar regex finds
    them, in linear time.

    NeMo-Gym searches with `\[(?:[^\[\]]|\{[^}]*\})*\{(?:[^\[\]]|\{[^}]*\})*\}(?:[^\[\]]|\{[^}]*\})*\]`: a `[`, then
    characters where a bracket may only appear inside a brace group (`{` up to the first `}`), with at least one
    `{...}`, up to a `]`. Its nested stars backtrack exponentially when no match exists (`"[" + "{x}" * 25` takes
    hours), so this function computes the same leftmost, backtracking-preferred matches with dynamic programming
    over the bracket and brace characters only; after each match the search goes on from its end.

    One consequence: a list whose only object holds a list is not found (the required `{...}` may not contain a
    bracket), while the same object followed by a second one is.

    Examples:
        >>> event_lists('Draft [v2]: [{"event_id": 0}] final: [{"event_id": 1}]')
        ['[{"event_id": 0}]', '[{"event_id": 1}]']
        >>> event_lists('[{"tags": ["x"]}, {"event_id": 1}] and [{"tags": ["x"]}]')
        ['[{"tags": ["x"]}, {"event_id": 1}]']
        >>> event_lists("no calendar [here]")
        []
    """
    spots = [(match.start(), match.group()) for match in _SPECIAL.finditer(text)]
    count = len(spots)
    next_close = [count] * (count + 1)  # index of the first "}" after each special character
    for index in range(count - 1, -1, -1):
        next_close[index] = index if spots[index][1] == "}" else next_close[index + 1]
    # can[s][k]: from regex star s (0, 1, 2: before the required "{", before the required "}", before the final "]")
    # standing at special character k, some way to finish the match exists. k == count is the end of the text.
    can = [[False] * (count + 1) for _ in range(3)]
    for k in range(count - 1, -1, -1):
        char = spots[k][1]
        close = next_close[k + 1] if char == "{" else count
        for star, literal in ((2, "]"), (1, "}"), (0, "{")):
            can[star][k] = (
                (char in "{}" and can[star][k + 1])
                or (close < count and can[star][close + 1])
                or (char == literal and (star == 2 or can[star + 1][k + 1]))
            )
    found, start = [], 0
    while start < count:
        if spots[start][1] == "[" and can[0][start + 1]:
            end = _walk(spots, next_close, can, start + 1)
            found.append(text[spots[start][0] : spots[end][0] + 1])
            start = end + 1
        else:
            start += 1
    return found


def first_event_list(text: str) -> str | None:
    """The first of `event_lists(text)` (the one NeMo-Gym grades), or None.

    Examples:
        >>> first_event_list('Draft: [{"event_id": 0}] final: [{"event_id": 1}]')
        '[{"event_id": 0}]'
    """
    lists = event_lists(text)
    return lists[0] if lists else None


def last_event_list(text: str) -> str | None:
    """The last of `event_lists(text)` (the final calendar, the one graded here), or None.

    Examples:
        >>> last_event_list('Draft: [{"event_id": 0}] final: [{"event_id": 1}]')
        '[{"event_id": 1}]'
        >>> last_event_list("no list") is None
        True
    """
    lists = event_lists(text)
    return lists[-1] if lists else None


def _walk(spots: list[tuple[int, str]], next_close: list[int], can: list[list[bool]], k: int) -> int:
    """Follow the regex engine's preferred path (one more character, else a brace group, else leave the star);
    return the index in `spots` of the match's final "]"."""
    count, star = len(spots), 0
    while True:
        char = spots[k][1]
        close = next_close[k + 1] if char == "{" else count
        if char in "{}" and can[star][k + 1]:
            k += 1
        elif close < count and can[star][close + 1]:
            k = close + 1
        elif star == 2:
            return k
        else:
            star, k = star + 1, k + 1


# ---------------------------------------------------------------------------------------------- grading


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _read(entry: Any) -> tuple[str, int, float] | None:
    """(event id, start, duration) of one calendar entry, or None when it is not a well-formed entry."""
    if not isinstance(entry, dict) or "event_id" not in entry or not _number(entry.get("duration")):
        return None
    start = entry.get("start_time")
    try:
        return str(entry["event_id"]), parse_time(start), entry["duration"]
    except (TypeError, ValueError):
        return None


def _overlap(a: tuple[int, float], b: tuple[int, float]) -> bool:
    return not (a[0] + a[1] <= b[0] or a[0] >= b[0] + b[1])


def score(text: str, expected: dict[str, Expected]) -> tuple[float, Reason, str | None]:
    """Grade one answer: `(reward, reason, the calendar list text found or None)`.

    The calendar is the answer's last list (`last_event_list`): a draft followed by a final calendar is graded on the
    final one. Each event id may appear once: a second entry for an id, even an identical one, is `duplicate_event`.

    Args:
        text: The answer (the first content part of the response's last output item).
        expected: Event id (as a string) to what that event must satisfy.
    """
    if not text:
        return 0.0, "empty_response", None
    if "<think>" in text:
        return 0.0, "think_found", None
    if not expected:
        return 1.0, "pass", None
    found = last_event_list(text)
    try:
        calendar = json.loads(found) if found is not None else None
    except (ValueError, RecursionError):
        calendar = None
    if not calendar:
        return 0.0, "no_json_list", found
    if len(calendar) > MAX_EVENTS:
        return 0.0, "too_many_events", found
    entries = [_read(entry) for entry in calendar]
    if any(entry is None for entry in entries):
        return 0.0, "malformed_event", found
    by_id = {event_id: (start, duration) for event_id, start, duration in entries}
    if len(by_id) != len(entries):
        return 0.0, "duplicate_event", found
    if len(by_id) != len(expected):
        return 0.0, "different_number_of_events", found
    spans = list(by_id.values())
    if any(_overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :]):
        return 0.0, "conflicting_events", found
    for event_id, want in expected.items():
        if event_id not in by_id:
            return 0.0, "unknown_event", found
        start, duration = by_id[event_id]
        end = start + duration
        if duration != want.duration or start < want.earliest or end > want.latest:
            return 0.0, "constraint_violated", found
        if not want.constraint.allows(start, end):
            return 0.0, "constraint_violated", found
    return 1.0, "pass", found
