"""structured_outputs as a real server: gold 1.0, wrong 0.0, empty 0.0 with HTTP 200, malformed row 422.

NeMo-Gym's own rows (its 0.7.0 wheel's `resources_servers/structured_outputs/data/`: v4 tool-call rows, v3 multi-format
rows) and rows of our own in the format of its Nano 3 JSON rows (`tests/nano3_json_format.jsonl`; the wheel ships
none) must validate and grade; where a valid document can be built from the row's schema, it scores 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
import yaml

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.structured_outputs.app import StructuredOutputsServer
from resources_servers.structured_outputs.documents import strictify

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "resources_servers/structured_outputs/data/example.jsonl"
OUR_ROWS = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
NEMO_DIR = nemo_gym_examples("structured_outputs")
NEMO_FILES = [NEMO_DIR / "example.jsonl", NEMO_DIR / "structured_outputs_v3_example.jsonl",
              NEMO_DIR / "structured_outputs_v4_example.jsonl", Path(__file__).parent / "nano3_json_format.jsonl"]
NEMO_ROWS = [
    pytest.param(json.loads(line), id=f"{path.stem}-{index}")
    for path in NEMO_FILES
    for index, line in enumerate(path.read_text().splitlines())
]

# What a model that follows each of our rows would answer: text for text rows, (tool, arguments) for tool rows.
GOLD = {
    "gymfleet-structured_outputs-example-0": json.dumps({
        "name": "Grandma Ilse's lentil soup", "servings": 4, "prep_minutes": 25, "vegetarian": True,
        "ingredients": [{"item": "red lentils", "quantity": "250 g"}, {"item": "onion", "quantity": "1"},
                        {"item": "carrots", "quantity": "2"}, {"item": "vegetable stock", "quantity": "1 l"}],
    }),
    "gymfleet-structured_outputs-example-1": (
        "station: Alder Ridge\nelevation_m: 412.5\nreadings:\n  - {hour: 6, temperature_c: 3.5, wind: calm}\n"
        "  - {hour: 12, temperature_c: 11, wind: gusty}\n  - {hour: 18, temperature_c: 8.25, wind: null}\n"
    ),
    "gymfleet-structured_outputs-example-2": (
        "<book><title>Rivers of the Northern Plain</title><year>2019</year><available>true</available>"
        "<authors><author>Mara Okafor</author><author>Tomas Lindqvist</author></authors></book>"
    ),
    "gymfleet-structured_outputs-example-3": (
        "sku,quantity,unit_price,discontinued\nBLT-204,14,3.10,false\nNUT-550,0,0.45,true\nWSH-118,230,0.05,false\n"
    ),
    "gymfleet-structured_outputs-example-4": ("record_invoice", {"invoice": {
        "invoice_number": "2024-0173", "issued": "2024-03-03", "currency": "EUR", "total": 2040.0,
        "lines": [{"description": "Website redesign", "amount": 1800.0},
                  {"description": "Hosting, one year", "amount": 240.0}],
    }}),
}  # fmt: skip


WRONG = {
    "yaml": "station: Alder Ridge\nelevation_m: high\nreadings: []\n",
    "csv": "sku,quantity\nBLT-204,fourteen\n",
    "xml": "<book><title>Rivers</title></book>",
}


@pytest.fixture(scope="module")
def url():
    server = StructuredOutputsServer({"name": "structured_outputs", "domain": "instruction_following"})
    with serve(server.create_app()) as base:
        yield base


def _answer(text=None, calls=()):
    return make_response(text, tool_calls=list(calls))


def _verify(url: str, row: dict, response: dict) -> dict:
    answer = httpx.post(f"{url}/verify", json={**row, "response": response}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _gold_response(row: dict) -> dict:
    gold = GOLD[row["uuid"]]
    return _answer(calls=[gold]) if row["response_mode"] == "tool_call" else _answer(gold)


@pytest.mark.parametrize("row", OUR_ROWS, ids=lambda row: f"{row['schema_type']}-{row['response_mode']}")
def test_gold_scores_one(url, row):
    result = _verify(url, row, _gold_response(row))
    assert (result["reward"], result["error_type"], result["error_message"]) == (1.0, None, None)


@pytest.mark.parametrize("row", OUR_ROWS, ids=lambda row: f"{row['schema_type']}-{row['response_mode']}")
def test_wrong_scores_zero(url, row):
    if row["response_mode"] == "tool_call":
        name, arguments = GOLD[row["uuid"]]
        wrong = _answer(calls=[(name, {"invoice": {**arguments["invoice"], "currency": "SEK"}})])
    else:
        wrong = _answer(WRONG.get(row["schema_type"], "{}"))
    result = _verify(url, row, wrong)
    assert result["reward"] == 0.0 and result["error_type"] in ("validation_error", "parse_error")


@pytest.mark.parametrize(
    "response, error_type",
    [
        pytest.param(_answer(""), "empty_response", id="empty"),
        pytest.param(_answer(None), "empty_response", id="no-message"),
        pytest.param(_answer("I can't produce that format."), "parse_error", id="refusal"),
        pytest.param(_answer("x" * 1_000_000), "parse_error", id="huge-output"),
    ],
)
def test_non_answers_score_zero_with_http_200(url, response, error_type):
    result = _verify(url, OUR_ROWS[0], response)
    assert (result["reward"], result["error_type"]) == (0.0, error_type)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_score_zero(url, constant):
    row = OUR_ROWS[0]
    text = GOLD[row["uuid"]].replace('"prep_minutes": 25', f'"prep_minutes": {constant}')
    assert constant in text
    schema = {**json.loads(row["schema_str"])}
    schema["properties"] = {**schema["properties"], "prep_minutes": {"type": "number", "minimum": 0, "maximum": 600}}
    result = _verify(url, {**row, "schema_str": json.dumps(schema)}, _answer(text))
    assert (result["reward"], result["error_type"]) == (0.0, "parse_error")
    assert constant in result["error_message"]
    name, arguments = GOLD[OUR_ROWS[4]["uuid"]]
    call = (name, json.dumps(arguments).replace("2040.0", constant))
    result = _verify(url, OUR_ROWS[4], _answer(calls=[call]))
    assert (result["reward"], result["error_type"]) == (0.0, "parse_error")


def test_prompt_echo_scores_zero(url):
    row = OUR_ROWS[0]
    assert _verify(url, row, _answer(row["responses_create_params"]["input"][-1]["content"]))["reward"] == 0.0


def test_tool_row_answered_in_text_scores_zero(url):
    row = OUR_ROWS[4]
    result = _verify(url, row, _answer(json.dumps(GOLD[row["uuid"]][1]["invoice"])))
    assert (result["reward"], result["error_type"]) == (0.0, "missing_tool_call")


@pytest.mark.parametrize(
    "change",
    [{"schema_str": None}, {"schema_type": "jsonl"}, {"response_mode": "voice"}, {"schema_str": {"type": "object"}},
     {"tool_payload_key": 3}],
    ids=["no-schema", "unknown-schema-type", "unknown-response-mode", "schema-not-a-string", "payload-key-not-str"],
)
def test_malformed_rows_are_422_naming_the_field(url, change):
    answer = httpx.post(f"{url}/verify", json={**OUR_ROWS[0], **change, "response": _answer("{}")})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][1] == next(iter(change))


def test_same_input_same_reward(url):
    rewards = {_verify(url, row, _gold_response(row))["reward"] for row in OUR_ROWS for _ in range(2)}
    assert rewards == {1.0}


def test_aggregate_metrics_per_schema_type(url):
    results = [_verify(url, row, _gold_response(row)) for row in OUR_ROWS]
    results.append(_verify(url, OUR_ROWS[0], _answer("")))
    metrics = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": results}).json()["agent_metrics"]
    assert metrics["mean/reward_yaml"] == 1.0 and metrics["mean/reward_json"] == pytest.approx(2 / 3)
    assert metrics["mean/error_empty_response"] == pytest.approx(1 / 6)


# ---------------------------------------------------------------------------------------------- NeMo-Gym rows


def _instance(schema: dict, root: dict):
    """A small document meant to be valid under `schema` (a `pattern` or other constraints may defeat it)."""
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return _instance(target, root)
    if "const" in schema or "enum" in schema:
        return schema["const"] if "const" in schema else schema["enum"][0]
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return _instance(branches[0], root)
    if "pattern" in schema:
        return None
    kind = schema.get("type")
    kind = next(k for k in kind if k != "null") if isinstance(kind, list) else kind
    if kind == "object":
        return {key: _instance(value, root) for key, value in schema.get("properties", {}).items()}
    if kind == "array":
        return [_instance(schema.get("items", {}), root) for _ in range(schema.get("minItems", 0))]
    return {"string": "x" * schema.get("minLength", 1), "integer": schema.get("minimum", 1),
            "number": schema.get("minimum", 1.5), "boolean": True, "null": None}.get(kind)


def _nemo_gold(row: dict):
    """(response, reward expected) for a NeMo-Gym row: 1.0 when a valid document could be built and written."""
    schema = json.loads(row["schema_str"])
    strictify(schema)
    document = _instance(schema, schema)
    valid = jsonschema.Draft202012Validator(schema).is_valid(document)
    if row.get("response_mode") == "tool_call":
        key = row.get("tool_payload_key")
        return _answer(calls=[(row["tool_name"], {key: document} if key else document)]), float(valid)
    if row["schema_type"] in ("json", "yaml"):
        text = json.dumps(document) if row["schema_type"] == "json" else yaml.safe_dump(document)
        return _answer(text), float(valid)
    return _answer(json.dumps(document)), None  # toml / csv: no writer here; only "grades without error"


@pytest.mark.parametrize("row", NEMO_ROWS)
def test_nemo_gym_rows_grade(url, row):
    for response in (_answer(""), _answer("Sorry, I cannot help."), _answer(calls=[("unknown_tool", {})])):
        result = _verify(url, row, response)
        assert result["reward"] == 0.0 and result["error_type"]
        assert {key: result[key] for key in row} == row
    response, expected = _nemo_gold(row)
    result = _verify(url, row, response)
    if expected is not None:
        assert result["reward"] == expected, result["error_message"]


def test_nemo_gym_rows_mostly_get_a_gold_document():
    assert sum(_nemo_gold(row.values[0])[1] == 1.0 for row in NEMO_ROWS) >= 12


def test_nemo_gym_config_name_declares_the_same_instances():
    configs = ROOT / "resources_servers/structured_outputs/configs"
    ours = yaml.safe_load((configs / "structured_outputs.yaml").read_text())
    assert yaml.safe_load((configs / "structured_outputs_json.yaml").read_text()) == ours
