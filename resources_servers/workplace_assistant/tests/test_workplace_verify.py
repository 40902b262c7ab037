"""The reward over real HTTP: replayed predictions against replayed ground truth (spec §4.4), realistic outputs."""

from __future__ import annotations

import json

import httpx
import pytest

from gymfleet.testing import make_response
from resources_servers.workplace_assistant.tests.conftest import NEMO_GYM_ROWS
from resources_servers.workplace_assistant.tools import TOOL_NAMES

ROW = NEMO_GYM_ROWS[0]
SEND = ("email_send_email", {"recipient": "a@b.com", "subject": "hello", "body": "world"})
DELETE_57 = ("email_delete_email", {"email_id": "00000057"})
EVENT = {"event_name": "Sync", "participant_email": "a@atlas.com", "event_start": "2023-12-01 10:00:00",
         "duration": "30"}
CREATE_EVENT = ("calendar_create_event", EVENT)
DELETE_EVENT = ("calendar_delete_event", {"event_id": "00000013"})
PLOT = {"time_min": "2023-10-01", "time_max": "2023-10-31", "value_to_plot": "total_visits", "plot_type": "bar"}
RENAME_13 = ("calendar_update_event", {"event_id": "00000013", "field": "event_name", "new_value": "x"})
ADD = {"customer_name": "Kim", "assigned_to_email": "raj.patel@atlas.com", "status": "Won"}


def truth(*calls) -> list[dict]:
    return [{"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}
            for name, arguments in calls]


def verify(url: str, predicted: list, ground_truth, text: str | None = "Done.") -> dict:
    body = {**ROW, "ground_truth": ground_truth, "response": make_response(text, tool_calls=predicted)}
    answer = httpx.post(url + "/verify", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize(
    "predicted, ground_truth, reward",
    [
        pytest.param([DELETE_57, SEND], truth(SEND, DELETE_57), 0.0, id="email-order-changes-labels"),
        pytest.param([SEND, DELETE_57], truth(SEND, DELETE_57), 1.0, id="same-calls-same-order"),
        pytest.param([DELETE_EVENT, CREATE_EVENT], truth(CREATE_EVENT, DELETE_EVENT), 1.0,
                     id="calendar-does-not-relabel"),
        pytest.param([("email_send_email", {"recipient": "A@B.com", "subject": "HELLO", "body": "World"})],
                     truth(SEND), 1.0, id="case-folded"),
        pytest.param([("calendar_create_event", {**EVENT, "duration": 30})], truth(CREATE_EVENT), 0.0,
                     id="number-vs-string-duration"),
        pytest.param([("calendar_create_event", {**EVENT, "duration": 60})],
                     truth(("calendar_create_event", {**EVENT, "duration": 30})), 1.0, id="numbers-both-missing"),
        pytest.param([("customer_relationship_manager_add_customer", {**ADD, "status": "won"})],
                     truth(("customer_relationship_manager_add_customer", ADD)), 0.0, id="status-case-sensitive"),
        pytest.param([("customer_relationship_manager_add_customer", {**ADD, "notes": None})],
                     truth(("customer_relationship_manager_add_customer", ADD)), 0.0, id="null-notes-in-replay"),
        pytest.param([], truth(("email_search_emails", {"query": "carlos"})), 1.0, id="no-calls-read-only-truth"),
        pytest.param([("email_search_emails", {"query": "x"})], [], 1.0, id="read-only-calls"),
        pytest.param([], json.dumps(truth(SEND)), 1.0, id="string-ground-truth-is-no-calls"),
        pytest.param([SEND], json.dumps(truth(SEND)), 0.0, id="string-ground-truth-rejects-right-calls"),
        pytest.param([("email_send_email", "{recipient: a"), ("no_such_tool", {})], [], 1.0,
                     id="malformed-and-unknown-skipped"),
        pytest.param([("analytics_create_plot", PLOT)], [], 0.0, id="plots-compared"),
        pytest.param([("analytics_create_plot", {**PLOT, "time_min": "2023-OCT-01"})],
                     truth(("analytics_create_plot", {**PLOT, "time_min": "2023-oct-01"})), 1.0, id="plot-path-case"),
        pytest.param([RENAME_13] * 2, truth(RENAME_13), 1.0, id="update-twice"),
        pytest.param([("customer_relationship_manager_add_customer", ADD),
                      ("customer_relationship_manager_delete_customer", {"customer_id": "00000200"})], [], 1.0,
                     id="add-then-delete"),
        pytest.param([SEND, ("email_delete_email", {"email_id": "500"})], [], 1.0, id="send-then-delete-unpadded"),
        pytest.param([("calendar_update_event", {"event_id": "00000013", "field": "event_name", "new_value": "abc "})],
                     truth(("calendar_update_event", {"event_id": "00000013", "field": "event_name",
                                                      "new_value": "abc"})), 0.0, id="whitespace-matters"),
        pytest.param([("email_get_email_information_by_id", {"email_id": "00000057", "useless_argument": 1})], [],
                     1.0, id="unexpected-argument-skipped"),
        pytest.param([("email_reply_email", json.loads(ROW["ground_truth"][0]["arguments"]))], ROW["ground_truth"],
                     1.0, id="example-row-correct"),
        pytest.param([], ROW["ground_truth"], 0.0, id="example-row-no-call"),
        pytest.param([("email_reply_email", {"email_id": "00000057", "body": "ok"})], ROW["ground_truth"], 0.0,
                     id="example-row-wrong-body"),
        pytest.param([("email_reply_email", json.loads(ROW["ground_truth"][0]["arguments"])), SEND],
                     ROW["ground_truth"], 0.0, id="example-row-extra-state-change"),
        pytest.param([("email_reply_email", json.loads(ROW["ground_truth"][0]["arguments"]))] * 2,
                     ROW["ground_truth"], 0.0, id="example-row-replied-twice"),
    ],
)
def test_reward_table(workbench, predicted, ground_truth, reward):
    url, _ = workbench
    result = verify(url, predicted, ground_truth)
    assert result["reward"] == reward, result["tables_differing"]


def test_text_answer_is_ignored_and_differing_tables_named(workbench):
    url, _ = workbench
    assert verify(url, [], ROW["ground_truth"], text=None)["tables_differing"] == ["emails"]
    assert verify(url, [], [], text="I deleted everything, trust me.")["reward"] == 1.0


def test_calling_every_tool_scores_zero_and_only_changes_what_it_touched(workbench):
    url, _ = workbench
    spray = [(name, {}) for name in TOOL_NAMES]  # every tool, no arguments: each one's "not provided" message
    assert verify(url, spray, [])["reward"] == 1.0, "no-argument calls change nothing"
    spray += [SEND, ("analytics_create_plot", PLOT)]
    assert verify(url, spray, [])["tables_differing"] == ["emails", "plots"]


def test_huge_and_echoed_outputs_are_graded_like_any_other(workbench):
    url, _ = workbench
    huge = "x" * 2_000_000
    echo = ROW["responses_create_params"]["input"][-1]["content"]
    assert verify(url, [], ROW["ground_truth"], text=huge)["reward"] == 0.0
    sent = ("email_send_email", {"recipient": "a@b.c", "subject": echo, "body": huge})
    assert verify(url, [sent], [])["reward"] == 0.0
    assert verify(url, [], [], text=echo)["reward"] == 1.0


@pytest.mark.parametrize(
    "ground_truth, problem",
    [
        pytest.param([{"name": "email_send_email", "arguments": {"recipient": "a@b.com"}}], "ground_truth",
                     id="arguments-as-object"),
        pytest.param(None, "ground_truth", id="missing"),
    ],
)
def test_bad_rows_are_422_naming_the_field(workbench, ground_truth, problem):
    url, _ = workbench
    body = {**ROW, "response": make_response("x")}
    if ground_truth is None:
        del body["ground_truth"]
    else:
        body["ground_truth"] = ground_truth
    answer = httpx.post(url + "/verify", json=body, timeout=30)
    assert answer.status_code == 422
    assert problem in json.dumps(answer.json()["detail"])


def test_ground_truth_entries_without_name_or_arguments_are_skipped(workbench):
    url, _ = workbench
    assert verify(url, [], [{"name": "email_send_email"}, {"arguments": "{}"}])["reward"] == 1.0
