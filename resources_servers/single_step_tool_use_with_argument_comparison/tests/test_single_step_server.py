"""single_step_tool_use_with_argument_comparison over real HTTP: NeMo-Gym's rows, our table, the four configs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.single_step_tool_use_with_argument_comparison.app import SingleStepServer

HERE = Path(__file__).resolve().parents[1]
OUR_ROWS = [json.loads(line) for line in (HERE / "data/example.jsonl").read_text().splitlines()]
NEMO_GYM = nemo_gym_examples("single_step_tool_use_with_argument_comparison")
NEMO_ROWS = [json.loads(line) for name in ("example.jsonl", "parallel_example.jsonl")
             for line in (NEMO_GYM / name).read_text().splitlines() if line.strip()]
REFUND, THANKS, SEARCH, BATCH = OUR_ROWS[1], OUR_ROWS[2], OUR_ROWS[3], OUR_ROWS[4]
CONFIG_THRESHOLDS = {
    "single_step_tool_use_with_argument_comparison.yaml": 0.1,
    "search_pivot_single_step_tool_use_with_argument_comparison.yaml": 0.3,
    "toolcall_schema_single_step_tool_use_with_argument_comparison.yaml": 0.1,
    "swe_pivot_single_step_tool_use_with_argument_comparison.yaml": 0.0,
}


def _server(threshold: float = 0.1, **fields) -> SingleStepServer:
    config = {"name": "single_step", "domain": "agent",
              "tool_call_comparator_config": {"word_count_similarity_threshold": threshold}, **fields}
    return SingleStepServer(config)


@pytest.fixture(scope="module")
def url():
    with serve(_server().create_app()) as base:
        yield base


def _verify(url: str, row: dict, response: dict) -> dict:
    answer = httpx.post(f"{url}/verify", json={**row, "response": response}, timeout=30)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert all(result[key] == value for key, value in row.items()), "row echoed"
    return result


def _gold(row: dict) -> dict:
    """What a model taking exactly the expected action would return."""
    action = row["expected_action"]
    if action["type"] == "message":
        return make_response(action["content"] or "Sure.")
    calls = action["calls"] if action["type"] == "function_call_batch" else [action]
    return make_response(tool_calls=[(call["name"], call["arguments"]) for call in calls])


def _calls(*calls: tuple[str, dict | str], text: str | None = None) -> dict:
    return make_response(text, tool_calls=list(calls))


@pytest.mark.parametrize("row", OUR_ROWS + NEMO_ROWS, ids=lambda row: row["expected_action"]["type"])
def test_gold_action_scores_one(url, row):
    result = _verify(url, row, _gold(row))
    assert (result["reward"], result["reason"]) == (1.0, None)
    assert result["category"] in ("expected_tool_call", "expected_chat_message_found")


@pytest.mark.parametrize("row", OUR_ROWS + NEMO_ROWS, ids=lambda row: row["expected_action"]["type"])
def test_the_other_kind_of_action_scores_zero(url, row):
    if row["expected_action"]["type"] == "message":
        result = _verify(url, row, _calls(("lookup_order", {"order_id": "X"})))
        assert (result["reward"], result["category"]) == (0.0, "unexpected_tool_call")
    else:
        result = _verify(url, row, make_response("Let me check that for you."))
        assert (result["reward"], result["category"]) == (0.0, "no_tool_call")


def test_nemo_gym_parallel_row_in_any_order_and_with_one_missing(url):
    row = next(row for row in NEMO_ROWS if len(row["expected_action"].get("calls", [])) == 3)
    calls = [(call["name"], call["arguments"]) for call in row["expected_action"]["calls"]]
    assert _verify(url, row, _calls(*reversed(calls)))["reward"] == 1.0
    missing = _verify(url, row, _calls(*calls[:2]))
    assert (missing["reward"], missing["category"]) == (0.0, "tool_call_mismatch")
    assert "expected 'Cairo'" in missing["reason"]


@pytest.mark.parametrize(
    ("response", "reward", "category", "reason_part"),
    [
        (_calls(("issue_refund", {"order_id": "ORD-2210", "amount": 12.5, "reason": "torn cover on arrival"})),
         1.0, "expected_tool_call", None),
        (_calls(("issue_refund", {"reason": "the cover was torn", "amount": 12.50, "order_id": "ORD-2210"})),
         1.0, "expected_tool_call", None),
        (_calls(("issue_refund", {"order_id": "ORD-2210", "amount": 38.0, "reason": "torn cover"})),
         0.0, "tool_call_mismatch", "arguments.amount"),  # refunds the whole order
        (_calls(("issue_refund", {"order_id": "ORD-2210", "amount": "12.50", "reason": "torn cover"})),
         0.0, "tool_call_mismatch", "expected a number, got str"),
        (_calls(("issue_refund", {"order_id": "ORD-2210", "amount": 12.5})),
         0.0, "tool_call_mismatch", "keys differ"),  # partial arguments
        (_calls(("issue_refund", '{"order_id": "ORD-2210", "amount": 12.5, "reason": "torn')),
         0.0, "tool_call_mismatch", "not valid JSON"),  # malformed (truncated) arguments
        (_calls(("issue_refund", "")), 0.0, "tool_call_mismatch", "not valid JSON"),
        (_calls(("transfer_to_human", {"summary": "customer wants a refund for a torn cover"})),
         0.0, "tool_call_mismatch", "no call to 'issue_refund'"),
        (_calls(("lookup_order", {"order_id": "ORD-2210"}),
                ("issue_refund", {"order_id": "ORD-2210", "amount": 12.5, "reason": "torn cover"})),
         1.0, "expected_tool_call", None),  # an extra call is free (NeMo-Gym main)
        (make_response("I'll refund $12.50 for order ORD-2210."), 0.0, "no_tool_call", "got a message"),
        (make_response(""), 0.0, "no_tool_call", "got a message"),
        (make_response(reasoning="issue_refund(order_id='ORD-2210', amount=12.5)"), 0.0, "no_action_found", None),
        (make_response(), 0.0, "no_action_found", None),
    ],
    ids=["right", "right-reordered-keys", "wrong-amount", "amount-as-string", "partial-args", "truncated-json",
         "empty-args", "wrong-tool", "extra-call", "message", "empty-message", "reasoning-only", "no-output"],
)
def test_refund_row_table(url, response, reward, category, reason_part):
    result = _verify(url, REFUND, response)
    assert (result["reward"], result["category"]) == (reward, category), result["reason"]
    if reason_part:
        assert reason_part in result["reason"]


@pytest.mark.parametrize(
    ("text", "reward", "category"),
    [("Glad I could help!", 1.0, "expected_chat_message_found"), ("", 0.0, "empty_message"),
     ("  \n", 0.0, "empty_message")],
)
def test_message_row(url, text, reward, category):
    result = _verify(url, THANKS, make_response(text))
    assert (result["reward"], result["category"]) == (reward, category)


QUERIES = {
    "Eiffel Tower opening year": {0.0: 1.0, 0.1: 1.0, 0.3: 1.0},  # 4 / 9 = 0.44
    "when did eiffel tower open": {0.0: 1.0, 0.1: 1.0, 0.3: 0.0},  # 2 / 10 = 0.2
    "paris landmarks history list": {0.0: 1.0, 0.1: 0.0, 0.3: 0.0},  # 0 / 9
    "eiffel": {0.0: 0.0, 0.1: 0.0, 0.3: 0.0},  # one word: exact equality only
}


@pytest.mark.parametrize("config_file", sorted(CONFIG_THRESHOLDS))
def test_shipped_configs_thresholds_grade_search_queries(config_file):
    config = yaml.safe_load((HERE / "configs" / config_file).read_text())
    fields = next(block["resources_servers"]["single_step_tool_use_with_argument_comparison"]
                  for block in config.values() if "resources_servers" in block)
    threshold = fields["tool_call_comparator_config"]["word_count_similarity_threshold"]
    assert threshold == CONFIG_THRESHOLDS[config_file]
    with serve(SingleStepServer({"name": "x", **fields}).create_app()) as base:
        for query, rewards in QUERIES.items():
            result = _verify(base, SEARCH, _calls(("web_search", {"query": query, "max_results": 5})))
            assert result["reward"] == rewards[threshold], (query, threshold, result["reason"])


def test_batch_row(url):
    weather, time = ("get_weather", {"city": "Lisbon"}), ("get_time", {"city": "Seoul"})
    assert _verify(url, BATCH, _calls(time, weather))["reward"] == 1.0
    assert _verify(url, BATCH, _calls(weather))["reward"] == 0.0
    assert _verify(url, BATCH, _calls(weather, weather, ("get_time", {"city": "Lisbon"})))["reward"] == 0.0


def test_spraying_argument_variants_is_free_by_default_and_refused_with_max_extra_calls(url):
    spray = [("get_weather", {"city": city}) for city in ("Lisbon", "Porto", "Madrid", "Seoul", "Busan")]
    spray += [("get_time", {"city": city}) for city in ("Lisbon", "Porto", "Madrid", "Seoul", "Busan")]
    assert _verify(url, BATCH, _calls(*spray))["reward"] == 1.0  # NeMo-Gym main: extra calls are free
    with serve(_server(max_extra_calls=1).create_app()) as strict:
        result = _verify(strict, BATCH, _calls(*spray))
        assert (result["reward"], result["category"]) == (0.0, "too_many_calls")
        one_extra = [("get_weather", {"city": "Lisbon"}), ("get_time", {"city": "Seoul"}), ("get_time", {"city": "X"})]
        assert _verify(strict, BATCH, _calls(*one_extra))["reward"] == 1.0


def test_calling_every_tool_with_prompt_echo_scores_zero(url):
    prompt = REFUND["responses_create_params"]["input"][1]["content"]
    calls = [(tool["name"], {key: prompt for key in tool["parameters"]["properties"]})
             for tool in REFUND["responses_create_params"]["tools"]]
    result = _verify(url, REFUND, _calls(*calls))
    assert result["reward"] == 0.0 and result["reason"].startswith("issue_refund: arguments.order_id")


def test_huge_arguments_score_zero(url):
    huge = {"order_id": "ORD-2210", "amount": 12.5, "reason": "torn cover " * 100_000}
    result = _verify(url, REFUND, _calls(("issue_refund", huge)))
    assert result["reward"] == 0.0 and "word overlap 0.000" in result["reason"]  # 2 shared of 200,006 words


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (None, "expected_action"),
        ({"type": "tool"}, "expected_action.type must be"),
        ({"type": "function_call", "name": "f", "arguments": "{city: Paris}"}, "expected_action.arguments"),
        ({"type": "function_call", "name": "f", "arguments": {"city": "Paris"}}, "as JSON text"),
        ({"type": "function_call", "arguments": "{}"}, "expected_action.name"),
        ({"type": "function_call_batch", "calls": []}, "expected_action.calls must be a non-empty list"),
        ({"type": "function_call_batch", "calls": [{"type": "function_call", "name": "f", "arguments": "["}]},
         "expected_action.calls[0].arguments"),
        ({"type": "message"}, "expected_action.content"),
    ],
    ids=["missing", "unknown-type", "args-not-json", "args-not-text", "no-name", "empty-batch", "bad-batch-call",
         "message-no-content"],
)
def test_malformed_rows_are_422_naming_the_field(url, action, message):
    row = {key: value for key, value in REFUND.items() if key != "expected_action"}
    if action is not None:
        row["expected_action"] = action
    answer = httpx.post(f"{url}/verify", json={**row, "response": _gold(REFUND)})
    assert answer.status_code == 422
    detail = answer.json()["detail"][0]
    assert detail["loc"][1] == "expected_action" and message in (detail["msg"] + str(detail["loc"]))


def test_threshold_out_of_range_is_a_config_error():
    with pytest.raises(ValueError, match="word_count_similarity_threshold"):
        _server(threshold=1.5)
    with pytest.raises(ValueError, match="parallel_tool_call_rewarding"):
        SingleStepServer({"name": "x", "tool_call_comparator_config": {"parallel_tool_call_rewarding": True}})
