"""calendar as a real server: gold 1.0, wrong 0.0, empty 0.0 with HTTP 200, malformed row 422, NeMo-Gym rows."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.calendar.app import CalendarServer
from resources_servers.calendar.schedule import Constraint, parse_time

ROOT = Path(__file__).resolve().parents[3]
OURS = ROOT / "resources_servers/calendar/data/example.jsonl"
NEMO = nemo_gym_examples("calendar") / "example.jsonl"
OUR_ROWS = [json.loads(line) for line in OURS.read_text().splitlines()]
NEMO_ROWS = [json.loads(line) for line in NEMO.read_text().splitlines()]


def _cal(*events):
    return json.dumps([{"event_id": i, "event_name": f"event {i}", "start_time": t, "duration": d}
                       for i, t, d in events])


# A correct final calendar for each of our rows (row 3 expects no change: any plain answer passes).
GOLD = [
    _cal((0, "11:00", 30), (1, "12:00", 60)),
    _cal((0, "10:00", 45), (1, "13:30", 30), (2, "10:45", 90)),
    _cal((0, "12:00", 60), (1, "10:00", 45), (2, "15:00", 30)),
    "Give it about two hours, until the numbness wears off.\n\n" + _cal((0, "14:00", 60)),
    _cal((0, "10:00", 15), (1, "11:30", 90), (2, "10:30", 60), (3, "10:15", 15)),
]
WRONG = [  # each breaks one rule
    _cal((0, "11:00", 30), (1, "13:30", 60)),  # review ends after 2pm
    _cal((0, "10:00", 45), (1, "10:45", 30), (2, "11:15", 90)),  # 1:1 not after 1:30pm
    _cal((0, "12:00", 60), (1, "12:30", 45), (2, "15:00", 30)),  # demo overlaps lunch
    "<think>They ask about fillings.</think> About two hours.",  # reasoning leaked into the answer
    _cal((0, "10:00", 15), (1, "10:15", 90), (2, "11:45", 60), (3, "12:45", 15)),  # panel not moved to 11:30
]


@pytest.fixture(scope="module")
def url():
    with serve(CalendarServer({"name": "calendar", "domain": "agent"}).create_app()) as base:
        yield base


def _verify(url: str, row: dict, response: dict) -> dict:
    answer = httpx.post(f"{url}/verify", json={**row, "response": response}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("index", range(5), ids=lambda index: OUR_ROWS[index]["uuid"][9:])
def test_gold_scores_one_and_wrong_scores_zero(url, index):
    row = OUR_ROWS[index]
    gold = _verify(url, row, make_response(GOLD[index]))
    assert (gold["reward"], gold["reason"]) == (1.0, "pass")
    assert _verify(url, row, make_response(WRONG[index]))["reward"] == 0.0


@pytest.mark.parametrize(
    "response, reason",
    [
        pytest.param(make_response(""), "empty_response", id="empty"),
        pytest.param(make_response(None, reasoning="Still thinking about the 2pm deadline"), "empty_response",
                     id="cut-off-while-reasoning"),
        pytest.param(make_response(None, tool_calls=[("add_event", {"id": 1})]), "empty_response",
                     id="tool-call-only"),
        pytest.param(make_response("Done! Both events are booked."), "no_json_list", id="no-calendar"),
        pytest.param(make_response("[" + "{slot}" * 300_000), "no_json_list", id="huge-backtracking-bait"),
    ],
)
def test_non_answers_score_zero_with_http_200(url, response, reason):
    result = _verify(url, OUR_ROWS[0], response)
    assert (result["reward"], result["reason"]) == (0.0, reason)


@pytest.mark.parametrize(
    "text, reason",
    [
        pytest.param("Draft:\n" + GOLD[2] + "\n\nFinal:\n" + WRONG[2], "conflicting_events",
                     id="correct-draft-then-wrong-final"),
        pytest.param(WRONG[2] + "\n\nCorrected:\n" + GOLD[2], "pass", id="wrong-draft-then-correct-final"),
        pytest.param(_cal((0, "12:00", 60), (1, "10:00", 45), (2, "15:00", 30), (2, "15:00", 30)), "duplicate_event",
                     id="event-listed-twice"),
        pytest.param(_cal((0, "12:00", 60), (1, "10:00", 45), (1, "13:15", 45), (2, "15:00", 30)), "duplicate_event",
                     id="event-in-two-slots"),
    ],
)
def test_final_calendar_graded_and_duplicates_refused(url, text, reason):
    result = _verify(url, OUR_ROWS[2], make_response(text))
    assert (result["reward"], result["reason"]) == (1.0 if reason == "pass" else 0.0, reason)


def test_prompt_echo_scores_zero(url):
    row = OUR_ROWS[4]
    echo = "\n".join(message["content"] for message in row["responses_create_params"]["input"])
    assert _verify(url, row, make_response(echo))["reward"] == 0.0


def test_only_the_last_output_item_is_read(url):
    response = make_response(GOLD[0], tool_calls=[("noop", {})])  # the message comes before a tool call
    assert _verify(url, OUR_ROWS[0], response)["reason"] == "empty_response"


@pytest.mark.parametrize(
    "change",
    [{"exp_cal_state": None}, {"exp_cal_state": {"0": {"duration": 30}}},
     {"exp_cal_state": {"0": {"duration": 30, "constraint": "at 25:00", "min_time": "10:00", "max_time": "16:00"}}},
     {"exp_cal_state": {"0": {"duration": -5, "constraint": None, "min_time": "10:00", "max_time": "16:00"}}}],
    ids=["no-state", "event-without-window", "unreadable-constraint-time", "negative-duration"],
)
def test_malformed_rows_are_422_naming_the_field(url, change):
    answer = httpx.post(f"{url}/verify", json={**OUR_ROWS[0], **change, "response": make_response(GOLD[0])})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][1] == "exp_cal_state"


def _nemo_gold(row: dict) -> str:
    """A calendar meeting every expected event's constraint, found by backtracking over 15-minute starts."""
    options = {}
    for event_id, event in row["exp_cal_state"].items():
        constraint = Constraint.parse(event["constraint"])
        earliest, latest = parse_time(event["min_time"]), parse_time(event["max_time"]) - event["duration"]
        options[event_id] = [start for start in range(earliest, latest + 1, 15)
                             if constraint.allows(start, start + event["duration"])]
    order = sorted(options, key=lambda event_id: len(options[event_id]))

    def place(index: int, chosen: dict) -> dict | None:
        if index == len(order):
            return chosen
        event_id = order[index]
        duration = row["exp_cal_state"][event_id]["duration"]
        for start in options[event_id]:
            spans = [(begin, begin + row["exp_cal_state"][other]["duration"]) for other, begin in chosen.items()]
            if all(start + duration <= begin or start >= end for begin, end in spans):
                found = place(index + 1, {**chosen, event_id: start})
                if found:
                    return found
        return None

    chosen = place(0, {})
    assert chosen is not None, "the row has no solution on a 15-minute grid"
    return _cal(*[(int(event_id), f"{start // 60:02d}:{start % 60:02d}", row["exp_cal_state"][event_id]["duration"])
                  for event_id, start in chosen.items()])


@pytest.mark.parametrize("row", NEMO_ROWS, ids=[f"nemo-{index}" for index in range(len(NEMO_ROWS))])
def test_nemo_gym_rows_grade(url, row):
    assert _verify(url, row, make_response(""))["reward"] == 0.0
    last_calendar = row["responses_create_params"]["input"][-2]["content"]
    assert _verify(url, row, make_response(last_calendar))["reward"] in (0.0, 1.0)
    result = _verify(url, row, make_response(_nemo_gold(row)))
    assert {key: result[key] for key in row} == row
    assert (result["reward"], result["reason"]) == (1.0, "pass")



def test_same_input_same_reward(url):
    rewards = {_verify(url, OUR_ROWS[1], make_response(GOLD[1]))["reward"] for _ in range(5)}
    assert rewards == {1.0}
