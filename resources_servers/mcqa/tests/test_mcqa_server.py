"""mcqa as a real server: NeMo-Gym kinds (full reward, zero reward, malformed, determinism) over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.mcqa.app import MCQAServer

ROOT = Path(__file__).resolve().parents[3]
OUR_ROWS = [json.loads(line) for line in (ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()]
NEMO_GYM = nemo_gym_examples("mcqa")
NEMO_ROWS = [json.loads(line) for line in (NEMO_GYM / "example.jsonl").read_text().splitlines()]
TEMPLATE_ROWS = [json.loads(line) for line in
                 (NEMO_GYM / "example_with_template_metadata.jsonl").read_text().splitlines()]
# How a model following each template's instruction would end its answer (the rows' output_regex).
TEMPLATE_ANSWERS = ["Answer: \\boxed{%s}", "Option Selected: %s", "Answer: %s", "THE ANSWER IS %s",
                    "Final Choice: %s"]


@pytest.fixture(scope="module")
def url():
    with serve(MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()) as base:
        yield base


def _verify(url: str, row: dict, text: str) -> dict:
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response(text)}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _wrong(row: dict) -> str:
    return next(letter for option in row["options"] for letter in option if letter != row["expected_answer"])


@pytest.mark.parametrize("row", OUR_ROWS + NEMO_ROWS, ids=lambda row: row["uuid"][:24])
def test_gold_scores_one_and_wrong_scores_zero(url, row):
    gold = _verify(url, row, f"Reasoning about the options first.\n\n\\boxed{{{row['expected_answer']}}}")
    assert (gold["reward"], gold["extracted_answer"]) == (1.0, row["expected_answer"])
    wrong = _verify(url, row, f"\\boxed{{{_wrong(row)}}}")
    assert (wrong["reward"], wrong["extracted_answer"]) == (0.0, _wrong(row))


@pytest.mark.parametrize(("row", "template"), list(zip(TEMPLATE_ROWS, TEMPLATE_ANSWERS, strict=True)),
                         ids=[row["template_metadata"]["output_regex"][:20] for row in TEMPLATE_ROWS])
def test_template_output_regex_rows(url, row, template):
    assert _verify(url, row, "Thinking...\n" + template % row["expected_answer"])["reward"] == 1.0
    assert _verify(url, row, "Thinking...\n" + template % _wrong(row))["reward"] == 0.0


@pytest.mark.parametrize(
    ("ending", "reward"),
    [
        ("Answer: \\boxed{{%s}}", 1.0),  # the template's doubled braces copied: its regex misses, strict reads
        ("Answer: {%s}", 0.0),  # neither the regex nor the strict mode finds a letter
        ("\\boxed{%s}", 1.0),  # no "Answer:" label: the regex still matches
        ("The answer is (%s).\n\n\\boxed{{%s}}", 1.0),
    ],
    ids=["doubled-braces", "no-box", "bare-box", "sentence-then-doubled-braces"],
)
def test_template_row_falls_back_to_the_mode_when_its_regex_finds_nothing(url, ending, reward):
    row = TEMPLATE_ROWS[0]
    gold, wrong = row["expected_answer"], _wrong(row)
    assert _verify(url, row, "Reasoning...\n" + ending.replace("%s", gold))["reward"] == reward
    result = _verify(url, row, "Reasoning...\n" + ending.replace("%s", wrong))
    assert result["reward"] == 0.0 and result["extracted_answer"] in (wrong, None)


def test_template_row_hedge_scores_zero(url):
    row = TEMPLATE_ROWS[0]
    for text in ("Answer: \\boxed{{B. or C.}}", "Answer: \\boxed{{B, or C}}", "Answer: \\boxed{{(B) and (C)}}"):
        result = _verify(url, {**row, "expected_answer": "B"}, text)
        assert (result["reward"], result["extracted_answer"]) == (0.0, None), text


@pytest.mark.parametrize(
    "text",
    ["", "   \n", "I cannot decide.", "\\boxed{A or B}", "\\boxed{}", "A: x\nB: y\nC: z\nD: w\n\\boxed{A, B, C, D}"],
    ids=["empty", "whitespace", "no-answer", "hedge", "empty-box", "lists-every-option"],
)
def test_non_answers_score_zero_with_http_200(url, text):
    result = _verify(url, OUR_ROWS[0], text)
    assert result["reward"] == 0.0 and result["extracted_answer"] is None


def test_prompt_echo_scores_zero(url):
    row = OUR_ROWS[0]
    assert _verify(url, row, row["responses_create_params"]["input"][0]["content"])["reward"] == 0.0


def test_reasoning_items_are_not_graded(url):
    row = OUR_ROWS[0]
    response = make_response("\\boxed{A}", reasoning=f"maybe \\boxed{{{row['expected_answer']}}}")
    result = httpx.post(f"{url}/verify", json={**row, "response": response}).json()
    assert result["reward"] == 0.0 and result["extracted_answer"] == "A"


def test_server_grading_mode_overrides_rows():
    row = {**OUR_ROWS[0], "grading_mode": "strict_single_letter_boxed"}
    server = MCQAServer({"name": "mcqa", "domain": "knowledge", "grading_mode": "lenient_answer_colon"})
    with serve(server.create_app()) as base:
        assert _verify(base, row, f"Answer: {row['expected_answer']}")["reward"] == 1.0


@pytest.mark.parametrize(
    "change",
    [{"expected_answer": None}, {"options": "A,B"}, {"grading_mode": "vibes"}, {"template_metadata": 3}],
    ids=["no-gold", "options-not-list", "unknown-mode", "bad-template-metadata"],
)
def test_malformed_rows_are_422_naming_the_field(url, change):
    row = {**OUR_ROWS[0], **change}
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response("\\boxed{B}")})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][1] == next(iter(change))


def test_same_input_same_reward(url):
    rewards = {_verify(url, OUR_ROWS[2], "so \\boxed{B}")["reward"] for _ in range(5)}
    assert rewards == {1.0}
