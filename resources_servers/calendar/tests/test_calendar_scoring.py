"""calendar grading, table-tested on realistic model answers (no server)."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from resources_servers.calendar.app import ExpectedEvent
from resources_servers.calendar.schedule import Constraint, event_lists, first_event_list, parse_time, score

# The calendar regex NeMo-Gym's calendar environment searches with (quoted in the behaviour spec, section 2.8).
NEMO_PATTERN = re.compile(r"\[(?:[^\[\]]|\{[^}]*\})*\{(?:[^\[\]]|\{[^}]*\})*\}(?:[^\[\]]|\{[^}]*\})*\]", re.DOTALL)


def _expected(**constraints):
    """Event id -> constraint; durations are 30 minutes for "0" and 60 for the others."""
    return {
        event_id: ExpectedEvent(
            duration=30 if event_id == "0" else 60, constraint=text, min_time="10:00", max_time="16:00"
        ).expected()
        for event_id, text in constraints.items()
    }


EXPECTED = _expected(**{"0": "at 11am", "1": "before 2pm"})


def cal(*events, **extra):
    return json.dumps([{"event_id": i, "event_name": f"event {i}", "start_time": t, "duration": d, **extra}
                       for i, t, d in events])


GOLD = cal((0, "11:00", 30), (1, "12:00", 60))
CASES = [
    pytest.param(GOLD, 1.0, "pass", id="correct"),
    pytest.param("Here is your updated calendar:\n" + GOLD + "\nLet me know!", 1.0, "pass", id="prose-around"),
    pytest.param("```json\n" + json.dumps(json.loads(GOLD), indent=2) + "\n```", 1.0, "pass", id="fenced-pretty"),
    pytest.param(cal((0, "11:00am", 30), (1, "12pm", 60)), 1.0, "pass", id="twelve-hour-start-times"),
    pytest.param(cal(("0", "11:00", 30), ("1", "10:00", 60)), 1.0, "pass", id="string-ids-and-earliest-slot"),
    pytest.param(cal((0, "11:00", 30), (1, "13:00", 60)), 1.0, "pass", id="ends-exactly-at-deadline"),
    pytest.param("Moved [per your note]: " + GOLD, 1.0, "pass", id="bracketed-words-before"),
    # Each event once: a second entry for an id is a violation, whatever it says.
    pytest.param(cal((0, "11:00", 30), (0, "11:00", 30), (1, "12:00", 60)), 0.0, "duplicate_event",
                 id="identical-duplicate"),
    pytest.param(cal((0, "11:00", 30), (0, "11:00", 30.0), (1, "12:00", 60)), 0.0, "duplicate_event",
                 id="duplicate-equal-as-python-values"),
    pytest.param(cal((0, "15:00", 30), (0, "11:00", 30), (1, "12:00", 60)), 0.0, "duplicate_event",
                 id="same-id-in-two-slots"),
    pytest.param(cal((0, "11:00", 30), (1, "10:00", 60), (1, "12:00", 60), (1, "14:30", 60)), 0.0, "duplicate_event",
                 id="same-id-in-every-free-slot"),
    pytest.param(cal((0, "11:00", 30), ("0", "11:00", 30), (1, "12:00", 60)), 0.0, "duplicate_event",
                 id="same-id-as-number-and-string"),
    pytest.param(cal((0, "11:00", 30), (1, "12:00", 60), (1, "12:00", 60), (2, "14:00", 30)), 0.0,
                 "duplicate_event", id="duplicate-hides-an-invented-event"),
    pytest.param(cal((0, "11:30", 30), (1, "12:00", 60)), 0.0, "constraint_violated", id="at-time-missed"),
    pytest.param(cal((0, "11:00", 30), (1, "13:30", 60)), 0.0, "constraint_violated", id="deadline-missed"),
    pytest.param(cal((0, "11:00", 45), (1, "12:00", 60)), 0.0, "constraint_violated", id="duration-changed"),
    pytest.param(cal((0, "11:00", 30), (1, "09:00", 60)), 0.0, "constraint_violated", id="before-day-window"),
    pytest.param(cal((0, "11:00", 30), (1, "10:30", 60)), 0.0, "conflicting_events", id="overlap"),
    pytest.param(cal((0, "11:00", 30), (0, "11:15", 30), (1, "12:00", 60)), 0.0, "duplicate_event",
                 id="repeated-id-overlapping-itself"),
    pytest.param(cal((0, "11:00", 30)), 0.0, "different_number_of_events", id="event-dropped"),
    pytest.param(cal((0, "11:00", 30), (1, "12:00", 60), (2, "14:00", 30)), 0.0, "different_number_of_events",
                 id="event-invented"),
    pytest.param(cal((0, "11:00", 30), (7, "12:00", 60)), 0.0, "unknown_event", id="wrong-id"),
    pytest.param(cal((0, "11:00", 30), (1, "25:00", 60)), 0.0, "malformed_event", id="hour-out-of-range"),
    pytest.param(cal((0, "11:00", 30), (1, "11:75", 60)), 0.0, "malformed_event", id="minute-out-of-range"),
    pytest.param(cal((0, "11:00", 30), (1, "12:00", "60")), 0.0, "malformed_event", id="duration-as-string"),
    pytest.param(cal((0, "11:00", 30), (1, 1200, 60)), 0.0, "malformed_event", id="start-time-as-number"),
    pytest.param('[{"event_id": 0, "start_time": "11:00", "duration": 30}, "lunch"]', 0.0, "malformed_event",
                 id="entry-not-an-object"),
    pytest.param("[{'event_id': 0, 'start_time': '11:00', 'duration': 30}]", 0.0, "no_json_list",
                 id="python-repr-not-json"),
    pytest.param(GOLD[:-5], 0.0, "no_json_list", id="truncated"),
    pytest.param("I've moved the review to noon and kept the call at 11.", 0.0, "no_json_list", id="prose-only"),
    # The final calendar is graded, not a draft before it.
    pytest.param(cal((0, "10:00", 30)) + "\n\nUpdated:\n" + GOLD, 1.0, "pass", id="draft-then-correct-final"),
    pytest.param("Draft:\n" + GOLD + "\n\nFinal:\n" + cal((0, "11:00", 30), (1, "13:30", 60)), 0.0,
                 "constraint_violated", id="correct-draft-then-wrong-final"),
    pytest.param(GOLD + "\nOr, if you prefer:\n" + cal((0, "11:00", 30), (1, "10:30", 60)), 0.0,
                 "conflicting_events", id="two-alternatives-last-graded"),
    pytest.param("Draft:\n" + GOLD + "\nFinal:\n" + GOLD, 1.0, "pass", id="draft-equal-to-final"),
    pytest.param(GOLD + "\n\nFinal calendar: [{'event_id': 0}]", 0.0, "no_json_list",
                 id="correct-draft-then-unparseable-final"),
    pytest.param("Previously you had " + GOLD + ". Now: " + cal((0, "11:00", 30)), 0.0,
                 "different_number_of_events", id="echoed-calendar-then-short-final"),
    pytest.param("<think>The review must end by 2pm.</think>\n" + GOLD, 0.0, "think_found", id="think-tags"),
    pytest.param("", 0.0, "empty_response", id="empty"),
    pytest.param("[" + "{x}" * 200_000, 0.0, "no_json_list", id="adversarial-backtracking-bait"),
    pytest.param(cal(*[(0, "11:00", 30)] * 150, *[(1, "12:00", 60)] * 60), 0.0, "too_many_events",
                 id="over-200-entries"),
]


@pytest.mark.parametrize("text, reward, reason", CASES)
def test_score(text, reward, reason):
    start = time.thread_time()
    got_reward, got_reason, found = score(text, EXPECTED)
    assert (got_reward, got_reason) == (reward, reason)
    assert time.thread_time() - start < 5
    assert reason in ("empty_response", "think_found", "no_json_list") or found is not None


def test_nothing_expected_passes_any_answer():
    assert score("Wait about two hours before eating.", {}) == (1.0, "pass", None)
    assert score("<think>hm</think> two hours", {})[1] == "think_found"


@pytest.mark.parametrize(
    "constraint, start, end, allowed",
    [
        pytest.param("between 10:30am and 1:30pm", 630, 720, True, id="between-inside"),
        pytest.param("between 10:30am and 1:30pm", 600, 690, False, id="between-starts-early"),
        pytest.param("between 10:30am and 1:30pm", 750, 840, False, id="between-ends-late"),
        pytest.param("after 3pm", 900, 930, True, id="after-at-boundary"),
        pytest.param("after 3pm", 870, 930, False, id="after-too-early"),
        pytest.param("before 12pm", 690, 720, True, id="before-ends-at-boundary"),
        pytest.param("at 11:30am", 690, 780, True, id="at-exact"),
        pytest.param(None, 600, 960, True, id="none"),
        pytest.param("sometime after lunch", 600, 630, True, id="unknown-prefix-places-no-constraint"),
    ],
)
def test_constraints(constraint, start, end, allowed):
    assert Constraint.parse(constraint).allows(start, end) is allowed


@pytest.mark.parametrize(
    "text, minutes",
    [("10am", 600), ("1:45pm", 825), ("13:30", 810), ("9:05", 545), ("12am", 0), ("12pm", 720), (" 4 pm ", 960),
     ("12:30am", 30), ("00:00", 0), ("23:59", 1439)],
)
def test_parse_time(text, minutes):
    assert parse_time(text) == minutes


@pytest.mark.parametrize("text", ["10AM", "13pm", "0am", "24:00", "10:5", "1330", "10", "", "noon", "１０:００"])
def test_parse_time_rejects(text):
    with pytest.raises(ValueError, match="clock time"):
        parse_time(text)


@pytest.mark.parametrize("bad", ["between 10am", "at 25:00", "before noon"])
def test_bad_row_constraints_raise(bad):
    with pytest.raises(ValueError):
        ExpectedEvent(duration=30, constraint=bad, min_time="10:00", max_time="16:00")


def test_first_event_list_equals_nemo_regex_on_random_text():
    rng = random.Random(7)
    for _ in range(20_000):
        text = "".join(rng.choice('[]{}x"') for _ in range(rng.randint(0, 14)))
        match = NEMO_PATTERN.search(text)
        assert first_event_list(text) == (match.group() if match else None), text


@pytest.mark.parametrize(
    "text",
    [
        'Old: [{"event_id": 0}] New: [{"event_id": 0}, {"event_id": 1}]',
        '[{"event_id": 0, "tags": ["a", "b"]}, {"event_id": 1}]',
        '[{"event_id": 0, "tags": ["a"]}]',
        "[draft] [{}] [{]}]",
        '[{"a": {"b": 1}}, {"c": [2]}]',
        "[{x}{y}] trailing ] [",
    ],
)
def test_first_event_list_equals_nemo_regex_on_calendar_text(text):
    match = NEMO_PATTERN.search(text)
    assert first_event_list(text) == (match.group() if match else None)


def test_event_lists_equal_nemo_regex_finditer_on_random_text():
    rng = random.Random(11)
    for _ in range(20_000):
        text = "".join(rng.choice('[]{}x"') for _ in range(rng.randint(0, 18)))
        assert event_lists(text) == [match.group() for match in NEMO_PATTERN.finditer(text)], text


def test_event_lists_on_calendar_text():
    text = 'Old: [{"event_id": 0}] New: [{"event_id": 0}, {"event_id": 1, "tags": ["x"]}] [note] [{"x": 1}]'
    assert event_lists(text) == [match.group() for match in NEMO_PATTERN.finditer(text)]
    assert len(event_lists(text)) == 3


def test_event_lists_is_linear_on_many_lists():
    start = time.thread_time()
    assert len(event_lists("[{x}] " * 100_000 + "[" + "{x}" * 100_000)) == 100_000
    assert time.thread_time() - start < 5
