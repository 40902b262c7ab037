"""reasoning_gym as a real server: gold, wrong, empty and huge answers; malformed rows (422); NeMo-Gym rows."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.reasoning_gym.app import ReasoningGymServer

ROOT = Path(__file__).resolve().parents[3]
OURS = ROOT / "resources_servers/reasoning_gym/data/example.jsonl"
NEMO = nemo_gym_examples("reasoning_gym") / "example.jsonl"
OUR_ROWS = [json.loads(line) for line in OURS.read_text().splitlines()]
NEMO_ROWS = [json.loads(line) for line in NEMO.read_text().splitlines()]
WRONG = {
    "knights_knaves": "Harper is a hero, and Victoria is a villain.",
    "basic_arithmetic": "-3124",
    "word_sorting": "apple, pear",
    "family_relationships": "husband",
    "countdown": "97 + 78",
}


@pytest.fixture(scope="module")
def url():
    with serve(ReasoningGymServer({"name": "reasoning_gym", "domain": "knowledge"}).create_app()) as base:
        yield base


def _verify(url: str, row: dict, text: str | None, **response) -> dict:
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response(text, **response)}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _task(row: dict) -> str:
    return row["metadata"]["source_dataset"]


@pytest.mark.parametrize("row", OUR_ROWS, ids=_task)
def test_gold_scores_one_and_wrong_scores_below_one(url, row):
    gold = _verify(url, row, f"Working through it step by step...\n<answer>{row['answer']}</answer>")
    assert (gold["reward"], gold["score"], gold["task_name"]) == (1.0, 1.0, _task(row))
    assert gold["extracted_answer"] == row["answer"]
    wrong = _verify(url, row, f"<answer>{WRONG[_task(row)]}</answer>")
    assert wrong["reward"] < 0.1  # countdown grants 0.01-0.05 for a well-formed wrong expression


# What each task's scorer gives an answer it cannot read (countdown grants 0.01 for any non-expression).
UNREADABLE = {"knights_knaves": 0.0, "basic_arithmetic": 0.0, "word_sorting": 0.0, "family_relationships": 0.0,
              "countdown": 0.01}


@pytest.mark.parametrize(
    "text, response",
    [
        pytest.param("", {}, id="empty"),
        pytest.param(None, {"reasoning": "<answer>wife</answer>"}, id="answer-only-in-reasoning"),
        pytest.param("<answer>   </answer>", {}, id="empty-answer-tags"),
    ],
)
def test_empty_answers_get_the_task_scorers_verdict_with_http_200(url, text, response):
    for row in OUR_ROWS:
        result = _verify(url, row, text, **response)
        assert (result["reward"], result["extracted_answer"]) == (UNREADABLE[_task(row)], "")


def test_an_answer_over_the_cap_scores_zero_unscored(url):
    for row in OUR_ROWS:
        assert _verify(url, row, "<answer>" + "9" * 50_000 + "</answer>")["reward"] == 0.0


def test_prompt_echo_scores_zero(url):
    for row in OUR_ROWS:
        assert _verify(url, row, row["responses_create_params"]["input"][0]["content"])["reward"] < 0.1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"metadata": {"source_index": 0}}, "must name a reasoning-gym task, got None"),
        ({"metadata": {"source_dataset": "knight_knaves"}}, "Did you mean 'knights_knaves'?"),
        ({"metadata": None}, None),
        ({"answer": 48}, None),
        ({"question": None}, None),
    ],
    ids=["no-task", "misspelt-task", "no-metadata", "answer-not-a-string", "no-question"],
)
def test_malformed_rows_are_422_naming_the_field(url, change, message):
    body = {**OUR_ROWS[0], **change, "response": make_response("<answer>x</answer>")}
    answer = httpx.post(f"{url}/verify", json=body)
    assert answer.status_code == 422
    detail = answer.json()["detail"][0]
    assert detail["loc"][1] == next(iter(change))
    assert message is None or message in detail["msg"]


@pytest.mark.parametrize("row", NEMO_ROWS, ids=lambda row: f"nemo-{row['metadata']['source_index']}")
def test_nemo_gym_rows_grade(url, row):
    gold = _verify(url, row, f"<answer>{row['answer']}</answer>")
    assert gold["reward"] == 1.0 and {key: gold[key] for key in row} == row
    names = row["metadata"]["names"]
    swapped = row["answer"].replace(names[0], "\0").replace(names[1], names[0]).replace("\0", names[1])
    assert _verify(url, row, f"\\boxed{{{swapped}}}")["reward"] == 0.0
    assert _verify(url, row, "")["reward"] == 0.0


def test_same_input_same_reward(url):
    rewards = {_verify(url, OUR_ROWS[4], f"<answer>{OUR_ROWS[4]['answer']}</answer>")["reward"] for _ in range(3)}
    assert rewards == {1.0}
