"""instruction_following as a real server: rewards, malformed rows, NeMo-Gym rows, adversarial responses."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.instruction_following.app import InstructionFollowingServer
from resources_servers.instruction_following.tests.test_instruction_following_checkers import KWARGS_BY_ID

ROOT = Path(__file__).resolve().parents[3]
OUR_ROWS = [json.loads(line) for line in (ROOT / "resources_servers/instruction_following/data/example.jsonl")
            .read_text().splitlines()]
NEMO_ROWS = [json.loads(line) for line in
             (nemo_gym_examples("instruction_following") / "example.jsonl").read_text().splitlines()]
# A response that follows every instruction of the matching row of data/example.jsonl.
FOLLOWING = [
    "<<Welcome to the Street>>\nHi [neighbour name], we would love to have you over for a barbecue this Saturday "
    "at [time] in our back garden. Bring your appetite; we will handle the grill. Hope to see you there!",
    "the sky looks blue because air molecules scatter short blue wavelengths of sunlight much more strongly than "
    "long red ones. this effect is called rayleigh scattering and it sends blue light toward our eyes.",
    "Here are three tips:\n* Water only when the top of the soil feels dry.\n* Give each plant the right amount of "
    "light for its species.\n* Wipe dust off the leaves every few weeks.\nIs there anything else I can help with?",
    '"Rain drums on the tin roofs of the harbour sheds while fishing boats rock at their moorings.\n\nIn the cafe '
    'by the quay, locals sip hot chocolate and watch the grey sea blur into the sky."',
    "Give advice to someone preparing for their first marathon. Build your weekly mileage slowly. Practise your "
    "race-day breakfast during long runs. Rest well in the final two weeks.\n\nP.S. Enjoy the crowd at the finish.",
]


@pytest.fixture(scope="module")
def url():
    server = InstructionFollowingServer({"name": "instruction_following", "domain": "instruction_following"})
    with serve(server.create_app()) as base:
        yield base


def _post(url: str, row: dict, response: dict | str) -> httpx.Response:
    response = make_response(response) if isinstance(response, str) else response
    return httpx.post(f"{url}/verify", json={**row, "response": response}, timeout=120)


def _verify(url: str, row: dict, response: dict | str) -> dict:
    answer = _post(url, row, response)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _row(ids: list[str], kwargs: list, grading_mode: str = "binary") -> dict:
    return {"id": 7, "responses_create_params": {"input": "Write something."},
            "verifier_metadata": {"instruction_id_list": ids, "kwargs": kwargs, "prompt": "Write something.",
                                  "grading_mode": grading_mode}}


@pytest.mark.parametrize(("row", "text"), list(zip(OUR_ROWS, FOLLOWING, strict=True)),
                         ids=[f"row-{row['id']}" for row in OUR_ROWS])
def test_all_followed_scores_one(url, row, text):
    result = _verify(url, row, text)
    assert result["reward"] == 1.0
    assert result["follow_all_instructions"] is True
    assert result["follow_instruction_list"] == [True] * len(row["verifier_metadata"]["instruction_id_list"])
    assert result["verifier_metadata"] == row["verifier_metadata"] and result["id"] == row["id"]


def test_some_followed_scores_the_share_in_fraction_mode(url):
    row = OUR_ROWS[4]  # repeat the request, at least 4 sentences, P.S. (fraction)
    result = _verify(url, row, FOLLOWING[4].split("\n\nP.S.")[0])
    assert result["follow_instruction_list"] == [True, True, False]
    assert result["reward"] == pytest.approx(2 / 3) and result["follow_all_instructions"] is False


def test_some_followed_scores_zero_in_binary_mode(url):
    row = OUR_ROWS[0]  # title, 2 placeholders, under 120 words (binary)
    result = _verify(url, row, FOLLOWING[0].replace("<<Welcome to the Street>>\n", ""))
    assert (result["reward"], result["follow_instruction_list"]) == (0.0, [False, True, True])


@pytest.mark.parametrize("text", ["", "   \n"], ids=["empty", "whitespace"])
def test_empty_response_scores_zero_with_http_200(url, text):
    result = _verify(url, OUR_ROWS[0], text)
    assert result["reward"] == 0.0 and result["follow_instruction_list"] == [False, False, True]


def test_no_output_items_grades_the_empty_string(url):
    result = _verify(url, OUR_ROWS[0], {**make_response("ignored"), "output": []})
    assert result["follow_instruction_list"] == [False, False, True]


def test_only_the_first_part_of_the_last_output_item_is_graded(url):
    row = OUR_ROWS[2]
    earlier = make_response(FOLLOWING[2])["output"]
    last = make_response("No bullets here.")["output"]
    result = _verify(url, row, {**make_response(""), "output": earlier + last})
    assert result["reward"] == 0.0
    reasoning_first = make_response(FOLLOWING[2], reasoning="* a\n* b")
    assert _verify(url, row, reasoning_first)["reward"] == 1.0
    tool_call_last = make_response(FOLLOWING[2], tool_calls=[("get_weather", {"city": "Oslo"})])
    assert _verify(url, row, tool_call_last)["follow_instruction_list"] == [False, False, False]


def test_a_refusal_part_follows_nothing(url):
    response = make_response("x")
    response["output"][0]["content"] = [{"type": "refusal", "refusal": "I can't help with that."}]
    result = _verify(url, _row(["punctuation:no_comma"], [None]), response)
    assert (result["reward"], result["follow_instruction_list"]) == (0.0, [False])


def test_unknown_instruction_id_is_422_naming_it(url):
    answer = _post(url, _row(["punctuation:no_comma", "keywords:existance"], [None, {"keywords": ["a"]}]), "a")
    assert answer.status_code == 422
    message = answer.json()["detail"][0]["msg"]
    assert "'keywords:existance'" in message and "Did you mean 'keywords:existence'?" in message


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "kwarg"),
    [
        ("length_constraints:number_words", {"relation": "less than"}, "num_words"),
        ("length_constraints:number_words", {"num_words": 50, "relation": None}, "relation"),
        ("keywords:existence", None, "keywords"),
        ("copy:copying_multiple", {"prompt_to_repeat": "Hi", "N": 0}, "N"),
        ("keywords:letter_frequency", {"letter": "ab", "let_frequency": 2, "let_relation": "at least"}, "letter"),
        ("detectable_content:number_placeholders", {"num_placeholders": -1}, "num_placeholders"),
        ("combination:repeat_prompt", {}, "prompt_to_repeat"),
    ],
    ids=["absent", "null", "no-kwargs-object", "zero-is-random", "not-one-letter", "negative", "copy-source"],
)
def test_missing_kwarg_is_422_naming_instruction_and_kwarg(url, instruction_id, kwargs, kwarg):
    answer = _post(url, _row([instruction_id], [kwargs]), "Some answer.")
    assert answer.status_code == 422
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", "verifier_metadata"]
    assert f"{instruction_id!r}" in detail["msg"] and f"kwarg {kwarg!r}" in detail["msg"]


@pytest.mark.parametrize(
    ("instruction_id", "kwargs"),
    [
        ("paragraphs:paragraphs", {"num_paragraphs": 2}),
        ("length_constraints:number_words", {"num_words": 5, "relation": "at most"}),
        ("language:response_language", {"language": "zh"}),
        ("length_constraints:number_words", {"num_words": "5", "relation": "at least"}),
        ("keywords:existence", {"keywords": ["("]}),
    ],
    ids=["unexpected-key", "unknown-relation", "language-outside-table", "number-as-string", "invalid-regex"],
)
def test_kwargs_the_reference_always_rejects_score_not_followed(url, instruction_id, kwargs):
    result = _verify(url, _row([instruction_id, "punctuation:no_comma"], [kwargs, None], "fraction"), "a *** b")
    assert result["follow_instruction_list"] == [False, True] and result["reward"] == 0.5


def test_malformed_rows_are_422(url):
    row = _row(["punctuation:no_comma"], [None])
    for change in ({"grading_mode": "vibes"}, {"instruction_id_list": None}, {"prompt": None}):
        metadata = {key: value for key, value in {**row["verifier_metadata"], **change}.items() if value is not None}
        assert _post(url, {**row, "verifier_metadata": metadata}, "ok").status_code == 422, change
    assert _post(url, {key: value for key, value in row.items() if key != "id"}, "ok").status_code == 422


def test_legacy_top_level_fields_are_accepted_and_metadata_wins(url):
    row = {"id": 3, "responses_create_params": {"input": "Hi"}, "instruction_id_list": ["punctuation:no_comma"],
           "kwargs": [None], "prompt": "Hi", "grading_mode": "binary"}
    assert _verify(url, row, "a, b")["reward"] == 0.0
    overridden = {**row, "verifier_metadata": {"instruction_id_list": ["punctuation:punctuation_dot"]}}
    result = _verify(url, overridden, "a, b")
    assert result["reward"] == 1.0 and "verifier_metadata" in result and "instruction_id_list" in result


def test_length_mismatch_grades_the_shorter_list(url):
    result = _verify(url, _row(["punctuation:no_comma", "punctuation:punctuation_dot"], [None]), "a. b")
    assert (result["reward"], result["follow_instruction_list"]) == (1.0, [True])
    empty = _verify(url, _row([], [], "fraction"), "anything")
    assert (empty["reward"], empty["follow_all_instructions"]) == (0.0, True)


@pytest.mark.parametrize("row", NEMO_ROWS, ids=[f"nemo-{row['id']}" for row in NEMO_ROWS])
def test_nemo_gym_rows_validate_and_verify(url, row):
    prompt = row["responses_create_params"]["input"][0]["content"]
    for text in ("", prompt, "I'm not sure how to answer that."):
        result = _verify(url, row, text)
        assert len(result["follow_instruction_list"]) == len(row["instruction_id_list"])
        assert result["reward"] in (0.0, 1.0) and result["id"] == row["id"]


@pytest.mark.parametrize("index", [0, 2, 3], ids=["title-placeholders", "bullets-keywords-end", "paragraphs-quote"])
def test_echoing_the_prompt_does_not_follow(url, index):
    row = OUR_ROWS[index]
    assert _verify(url, row, row["responses_create_params"]["input"][0]["content"])["reward"] == 0.0


def test_every_instruction_on_a_megabyte_echo(url):
    # How long each checker may take on a megabyte is pinned in test_instruction_following_linear.py.
    row = _row(list(KWARGS_BY_ID), list(KWARGS_BY_ID.values()), "fraction")
    prompt = OUR_ROWS[4]["responses_create_params"]["input"][0]["content"] + "\n\n"
    result = _verify(url, row, (prompt * (1_000_000 // len(prompt) + 1))[:1_000_000])
    assert len(result["follow_instruction_list"]) == 54 and 0.0 <= result["reward"] < 1.0


def test_same_input_same_reward(url):
    row = _row(["language:response_language", "change_case:english_lowercase"], [{"language": "en"}, None])
    assert len({_verify(url, row, "ok then")["reward"] for _ in range(5)}) == 1
