"""code_gen over a real sandbox with hostile program output and malformed rows (gymfleet issue 10, item 2).

Whatever a program prints or returns grades to a reward (a wrong answer, with the reason), never an HTTP 500; a row
the grader cannot use is a 422 naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response
from resources_servers.code_gen.checker import MAX_JSON_DEPTH
from resources_servers.code_gen.tests.conftest import fenced, verify

ROWS = [json.loads(line) for line in
        (Path(__file__).resolve().parents[1] / "data/example.jsonl").read_text().splitlines()]
STDIN_ROW, CALL_ROW = ROWS[0], ROWS[3]  # the first reads stdin; the fourth calls Solution().maxSubarraySum


def _with_tests(row: dict, unit_tests) -> dict:
    return {**row, "verifier_metadata": {**row["verifier_metadata"], "unit_tests": unit_tests}}


def _post(url: str, row: dict) -> httpx.Response:
    body = {**row, "response": make_response(fenced("print(5)"))}
    return httpx.post(f"{url}/verify", json=body, timeout=120)


@pytest.mark.parametrize("printed", ["sNaN", "sNaN 1", "-sNaN5", "NaN", "Infinity", "1e999999999", "1e-999999999"])
def test_special_decimals_printed_are_a_wrong_answer(code_gen_url, printed):
    row = _with_tests(STDIN_ROW, {"inputs": [""], "outputs": ["5"], "fn_name": None})
    result = verify(code_gen_url, row, fenced(f"print({printed!r})"))
    assert (result["reward"], result["verdict"], result["failed_test"]) == (0.0, "wrong_answer", 0), result
    assert result["metadata"]["got"].strip() == printed and result["metadata"]["reason"], result["metadata"]


def test_a_signaling_nan_can_still_match_itself_as_text(code_gen_url):
    row = _with_tests(STDIN_ROW, {"inputs": [""], "outputs": ["sNaN 2"], "fn_name": None})
    assert verify(code_gen_url, row, fenced("print('sNaN', 2)"))["reward"] == 1.0


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000])
def test_a_deeply_nested_call_result_is_a_wrong_answer(code_gen_url, depth):
    code = (f"class Solution:\n    def maxSubarraySum(self, nums):\n        value = 6\n"
            f"        for _ in range({depth}):\n            value = [value]\n        return value")
    result = verify(code_gen_url, CALL_ROW, fenced(code))
    assert (result["reward"], result["verdict"], result["failed_test"]) == (0.0, "wrong_answer", 0), result
    assert result["result"] == [-2] and "deeper" in result["metadata"]["reason"], result["metadata"]


@pytest.mark.parametrize(("returned", "passes"), [
    ("'6'", False), ("6.0", True), ("6.000001", True), ("(6,)", False), ("[6]", False), ("None", False),
], ids=["string", "float", "float-close", "tuple", "list", "none"])
def test_call_results_compare_as_typed_json(code_gen_url, returned, passes):
    code = f"class Solution:\n    def maxSubarraySum(self, nums):\n        return {returned}"
    result = verify(code_gen_url, CALL_ROW, fenced(code))  # the first test expects 6
    if passes:
        assert result["result"][0] is True, result
    else:
        assert (result["reward"], result["verdict"], result["result"]) == (0.0, "wrong_answer", [-2]), result


def test_tuples_are_returned_as_lists(code_gen_url):
    row = _with_tests(CALL_ROW, {"inputs": ["[1, 2]"], "outputs": ["[2, 1]"], "fn_name": "maxSubarraySum"})
    code = "class Solution:\n    def maxSubarraySum(self, nums):\n        return tuple(reversed(nums))"
    assert verify(code_gen_url, row, fenced(code))["reward"] == 1.0


@pytest.mark.parametrize(("unit_tests", "words"), [
    ("[" * 100_000 + "]" * 100_000, "nests deeper"),
    ('{"inputs": ["1"], "outputs": ["1"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests deeper"),
    ("[" * 100_000, "nests deeper"),
    ('{"inputs": ["\\udc80"], "outputs": ["1"]}', "surrogate"),
    ('{"inputs": ["1"], "outputs": ["\\ud800"]}', "surrogate"),
], ids=["deep-list", "deep-extra-field", "deep-unclosed", "surrogate-input", "surrogate-output"])
def test_an_unusable_unit_tests_string_is_a_422_naming_the_field(code_gen_url, unit_tests, words):
    answer = _post(code_gen_url, _with_tests(STDIN_ROW, unit_tests))
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]
    assert any("unit_tests" in error["loc"] and words in error["msg"] for error in errors), errors


@pytest.mark.parametrize(("unit_tests", "words"), [
    ({"inputs": ["[1]"], "outputs": ["[" * 200 + "]" * 200], "fn_name": "maxSubarraySum"}, "nests deeper"),
    ({"inputs": [["1", ["2", ["3"]]]], "outputs": ["1"]}, "list of lines"),
], ids=["deep-expected-value", "nested-lines"])
def test_unit_tests_the_grader_cannot_use_are_a_422(code_gen_url, unit_tests, words):
    answer = _post(code_gen_url, _with_tests(STDIN_ROW, unit_tests))
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]
    assert any("unit_tests" in error["loc"] and words in error["msg"] for error in errors), errors
