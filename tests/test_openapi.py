"""`/openapi.json` and `/docs` on real servers of every kind (issue 14): routes listed with their real request and
response types, valid OpenAPI 3.1, and real bodies valid against the schemas they are documented with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from gymfleet.testing import free_port, make_response, serve

ROOT = Path(__file__).resolve().parents[1]
MCQA_ROW = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])


def _servers() -> dict[str, Any]:
    from agents.simple_agent.app import SimpleAgent
    from resources_servers.example_weather.app import ExampleWeatherServer
    from resources_servers.mcqa.app import MCQAServer
    from resources_servers.workplace_assistant.app import WorkplaceAssistantServer
    from responses_api_models.scripted_model.app import ScriptedModel
    from responses_api_models.vllm_model.app import VLLMModel

    return {
        "mcqa": MCQAServer({"name": "mcqa", "domain": "knowledge"}),
        "example_weather": ExampleWeatherServer({"name": "example_weather", "domain": "agent"}),
        "workplace_assistant": WorkplaceAssistantServer({"name": "workplace_assistant", "domain": "agent"}),
        "vllm_model": VLLMModel({"name": "policy", "base_url": f"http://127.0.0.1:{free_port()}/v1"}),
        "scripted_model": ScriptedModel({"name": "llm", "model": "m", "default": {"text": "\\boxed{B}"}}),
        "simple_agent": SimpleAgent({"name": "agent", "resources_server": "mcqa", "model_server": "policy"}),
    }


@pytest.fixture(scope="module")
def urls():
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield {name: stack.enter_context(serve(server.create_app())) for name, server in _servers().items()}


@pytest.fixture(scope="module")
def docs(urls) -> dict[str, dict]:
    return {name: httpx.get(url + "/openapi.json", timeout=30).json() for name, url in urls.items()}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def body_schema(doc: dict, path: str, method: str = "post") -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def answer_schema(doc: dict, path: str, method: str = "post") -> dict:
    return doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]


def validator(doc: dict, schema: dict) -> Draft202012Validator:
    """A validator for `schema` whose `#/components/...` references resolve inside `doc`."""
    return Draft202012Validator({**schema, "components": doc["components"]})


def ref_name(schema: dict) -> str:
    return schema["$ref"].rsplit("/", 1)[1]


@pytest.mark.parametrize(
    "name", ["mcqa", "example_weather", "workplace_assistant", "vllm_model", "scripted_model", "simple_agent"]
)
def test_openapi_is_valid_and_every_reference_resolves(docs, name):
    doc = docs[name]
    validate(doc)
    schemas = doc["components"]["schemas"]
    missing = {ref for ref in _refs(doc) if ref.rsplit("/", 1)[1] not in schemas}
    assert not missing
    assert "/metrics" not in doc["paths"] and "/" not in doc["paths"]


def test_docs_page_serves_swagger_ui(urls):
    for name, url in urls.items():
        page = httpx.get(url + "/docs")
        assert page.status_code == 200, name
        assert "swagger-ui" in page.text and "/openapi.json" in page.text, name


def test_resources_server_documents_the_environments_own_classes(docs, urls):
    doc = docs["mcqa"]
    assert set(doc["paths"]) == {"/verify", "/seed_session", "/aggregate_metrics", "/reverify_mode"}
    request = body_schema(doc, "/verify")
    assert ref_name(request) == "MCQARequest"
    fields = doc["components"]["schemas"]["MCQARequest"]
    assert {"options", "expected_answer", "responses_create_params", "response"} <= set(fields["required"])
    assert {ref_name(s) for s in answer_schema(doc, "/verify")["anyOf"]} == {"MCQAResponse", "VerifyFailureRow"}
    assert "422" in doc["paths"]["/verify"]["post"]["responses"]
    assert answer_schema(doc, "/reverify_mode", "get")["enum"] == ["stateless", "unsupported", "unknown"]

    # A real row is valid against the documented request; the real answer against the documented response.
    row = {**MCQA_ROW, "response": make_response("\\boxed{B}")}
    assert not list(validator(doc, request).iter_errors(row))
    answer = httpx.post(urls["mcqa"] + "/verify", json=row).json()
    assert not list(validator(doc, answer_schema(doc, "/verify")).iter_errors(answer))
    # ... and a row missing what the environment needs is not.
    broken = {key: value for key, value in row.items() if key != "options"}
    assert list(validator(doc, request).iter_errors(broken))
    assert httpx.post(urls["mcqa"] + "/verify", json=broken).status_code == 422


def test_tools_are_documented_with_their_argument_models(docs):
    doc = docs["example_weather"]
    tool = doc["paths"]["/get_weather"]["post"]
    assert ref_name(body_schema(doc, "/get_weather")) == "GetWeatherRequest"
    assert "city" in doc["components"]["schemas"]["GetWeatherRequest"]["properties"]
    assert "ToolError" in {ref_name(s) for s in answer_schema(doc, "/get_weather")["anyOf"] if "$ref" in s}
    assert tool["summary"]
    # A catch-all tool route is listed by its template, with its path parameter.
    catch_all = docs["workplace_assistant"]["paths"]["/{tool}"]["post"]
    assert catch_all["parameters"] == [{"name": "tool", "in": "path", "required": True, "schema": {"type": "string"}}]


@pytest.mark.parametrize("name", ["vllm_model", "scripted_model"])
def test_model_servers_document_responses_and_chat_completions(docs, name):
    doc = docs[name]
    assert ref_name(body_schema(doc, "/v1/responses")) == "ResponseCreateParams"
    assert ref_name(answer_schema(doc, "/v1/responses")).startswith("Response")
    assert ref_name(answer_schema(doc, "/v1/chat/completions")) == "ChatCompletion"
    chat = validator(doc, body_schema(doc, "/v1/chat/completions"))
    assert not list(chat.iter_errors({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert list(chat.iter_errors({"model": "m"}))  # messages are required


def test_a_real_model_answer_matches_its_documented_schema(docs, urls):
    doc = docs["scripted_model"]
    answer = httpx.post(urls["scripted_model"] + "/v1/responses", json={"input": "hi", "model": "m"}).json()
    assert not list(validator(doc, answer_schema(doc, "/v1/responses")).iter_errors(answer))
    chat = httpx.post(urls["scripted_model"] + "/v1/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).json()
    assert not list(validator(doc, answer_schema(doc, "/v1/chat/completions")).iter_errors(chat))


def test_agent_documents_run(docs):
    doc = docs["simple_agent"]
    assert set(doc["paths"]) == {"/run", "/v1/responses", "/aggregate_metrics"}
    run = validator(doc, body_schema(doc, "/run"))
    assert not list(run.iter_errors(MCQA_ROW))
    assert list(run.iter_errors({"question": "no responses_create_params"}))
    assert ref_name(answer_schema(doc, "/run")) == "VerifyResponse"


def test_head_server_documents_its_routes():
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
    from gymfleet.fleet.head import create_head_app

    config = parse_global_config(GlobalConfigDictParserConfig(
        initial_global_config_dict={"config_paths": [str(ROOT / "configs/quickstart.yaml")],
                                    "head_server": {"host": "127.0.0.1", "port": free_port()}},
        skip_load_from_cli=True,
    ))
    with serve(create_head_app(config)) as url:
        doc = httpx.get(url + "/openapi.json").json()
        assert httpx.get(url + "/docs").status_code == 200
    validate(doc)
    assert {"/global_config_dict_yaml", "/server_instances"} <= set(doc["paths"])
