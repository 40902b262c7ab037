"""Schema-driven HTTP fuzz of every route of every server type (issue 16, item 4).

One real server per distinct app shape, each on its own port under uvicorn: a plain resources server (mcqa), a tool
environment with a catch-all tool route (workplace_assistant), a cohort environment (genrm_compare with
`num_rollouts_per_prompt: 1`), the scripted upstream model, `vllm_model` in front of it, `simple_agent` wired to
them, the head server and the sandbox service. For each route its `/openapi.json` documents, hypothesis draws bodies
from the documented request schema (valid ones, ones with a field dropped or retyped, arbitrary JSON) and hostile
ones (nesting 100k deep, multi-megabyte strings, NaN, integers too long to read, invalid UTF-8, wrong top-level
types). Every answer must come within the client timeout (no hang), never be a 500, and any other 5xx must be a
typed upstream failure (502/503/504 with an `error_type`); each server must still answer `GET /` afterwards. A
separate test runs mcqa in its own process and bounds its RSS growth over a few hundred hostile requests.

Derandomized with a fixed budget so CI is reproducible; `GYMFLEET_FUZZ_EXAMPLES` raises it (and
`bench/fuzz_soak.py` runs the same generators for minutes). The sandbox's routes declare no request types in
OpenAPI, so their bodies come from the pydantic models in `sandbox/models.py` (`SCHEMA_HINTS`).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from gymfleet.testing import free_port, serve, spawn_server

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("GYMFLEET_FUZZ_EXAMPLES", "25"))
CLIENT_TIMEOUT_S = 60.0
"""Every request's deadline: an answer slower than this is a hang and fails the test."""
TYPED_UPSTREAM = {502, 503, 504}
MAX_DEPTH = 4

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # see tests/test_fuzz_scoring.py
    # gymfleet.http hands aiohttp bodies over 1 MiB as bytes, which aiohttp warns about (a warning in production;
    # under this suite's `filterwarnings = error` the agent's forward of a 4 MB row would become a 500).
    pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning"),
]


# ---------------------------------------------------------------------------------------------- schema → strategy

short_text = st.text(max_size=16)
json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | short_text
any_json = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(short_text, inner,
                                                                                              max_size=3),
                        max_leaves=12)


def from_schema(schema: Any, components: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    """Values valid (mostly) under the JSON Schema `schema`; `$ref`s resolve in `components`. Small and shallow."""
    if not isinstance(schema, dict) or not schema:
        return any_json
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if depth >= MAX_DEPTH:
            return st.just({})
        return st.deferred(lambda: from_schema(components.get(name, {}), components, depth + 1))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(option, components, depth + 1) for option in schema[key]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], components, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": one}, components, depth) for one in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        low = math.ceil(low) if low is not None else (math.floor(schema["exclusiveMinimum"]) + 1
                                                      if "exclusiveMinimum" in schema else None)
        return st.integers(min_value=low, max_value=high)
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(min_value=low, max_value=schema.get("maximum"), allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema)
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=max(schema.get("minLength", 0), 24))
    if kind == "array" or "items" in schema:
        if depth >= MAX_DEPTH:
            return st.just([])
        low = schema.get("minItems", 0)
        return st.lists(from_schema(schema.get("items", {}), components, depth + 1), min_size=low,
                        max_size=max(low, 2))
    if kind == "object" or "properties" in schema:
        if depth >= MAX_DEPTH:
            return st.just({})
        properties = schema.get("properties", {})
        required = [key for key in schema.get("required", []) if key in properties]
        optional = {key: from_schema(value, components, depth + 1) for key, value in properties.items()
                    if key not in required}
        return st.fixed_dictionaries({key: from_schema(properties[key], components, depth + 1) for key in required},
                                     optional=optional)
    return any_json


@st.composite
def broken(draw, valid: st.SearchStrategy) -> Any:
    """A valid body with one required field dropped or one value replaced by a value of another type."""
    body = draw(valid)
    if not isinstance(body, dict) or not body:
        return draw(any_json)
    key = draw(st.sampled_from(sorted(body)))
    if draw(st.booleans()):
        return {k: v for k, v in body.items() if k != key}
    return {**body, key: draw(any_json.filter(lambda value: type(value) is not type(body[key])))}


def hostile_bodies() -> list[tuple[str, bytes]]:
    """Bodies no schema describes: (name, raw bytes), sent as application/json."""
    deep = 100_000
    return [
        ("deep-list", b"[" * deep + b"]" * deep),
        ("deep-object", b'{"a":' * deep + b"1" + b"}" * deep),
        ("deep-unclosed", b"[" * deep),
        ("huge-string", json.dumps({"responses_create_params": {"input": "x" * 2_000_000}}).encode()),
        ("huge-key", json.dumps({"k" * 100_000: 1}).encode()),
        ("many-keys", json.dumps({f"k{i}": i for i in range(20_000)}).encode()),
        ("long-int", b'{"responses_create_params": {"input": [], "max_output_tokens": ' + b"9" * 50_000 + b"}}"),
        ("nan", b'{"responses_create_params": {"input": [], "temperature": NaN}, "x": Infinity}'),
        ("big-float", b'{"responses_create_params": {"input": [], "temperature": 1e999}}'),
        ("invalid-utf8", b'{"responses_create_params": {"input": "\xff\xfe\xfa"}}'),
        ("lone-surrogate", b'{"responses_create_params": {"input": "\\ud800"}}'),
        ("duplicate-keys", b'{"responses_create_params": {"input": []}, "responses_create_params": 1}'),
        ("nul", b'{"responses_create_params": {"input": "a\\u0000b"}}'),
        ("empty", b""),
        ("not-json", b"{'single': quotes}"),
        ("top-list", b"[]"),
        ("top-null", b"null"),
        ("top-string", b'"responses_create_params"'),
        ("top-number", b"1e400"),
        ("bom", b"\xef\xbb\xbf{}"),
    ]


def _schema_of(doc: dict, path: str, method: str) -> Any:
    operation = doc["paths"][path][method]
    content = (operation.get("requestBody") or {}).get("content", {}).get("application/json", {})
    return content.get("schema")


def _sandbox_hints() -> dict[tuple[str, str], Any]:
    from sandbox import models

    def schema(model: Any) -> Any:
        return model.model_json_schema(ref_template="#/components/schemas/{model}")

    return {("/run", "post"): schema(models.RunRequest), ("/run_batch", "post"): schema(models.BatchRequest),
            ("/sessions", "post"): schema(models.SessionRequest),
            ("/sessions/{session_id}/exec", "post"): schema(models.ExecRequest)}


def _cap_sandbox(body: Any) -> Any:
    """Keep fuzzed sandbox programs cheap: a short CPU budget and a small memory share."""
    if isinstance(body, dict):
        body = {**body, "timeout_s": 2, "memory_mb": 256}
        for case in body.get("cases", []) if isinstance(body.get("cases"), list) else []:
            if isinstance(case, dict):
                case.pop("timeout_s", None)
    return body


def route_bodies(doc: dict, path: str, method: str, hint: Any = None) -> st.SearchStrategy:
    """Bodies for one route: drawn from its schema, broken copies of those, arbitrary JSON."""
    schema = hint if hint is not None else _schema_of(doc, path, method)
    components = {**doc.get("components", {}).get("schemas", {}), **(hint or {}).get("$defs", {})}
    valid = from_schema(schema, components)
    return st.one_of(valid, valid, broken(valid), any_json)


def path_values(path: str) -> st.SearchStrategy:
    """The path with each `{param}` filled from a few known names and arbitrary URL-safe text."""
    names = re.findall(r"{(\w+)}", path)
    if not names:
        return st.just(path)
    filler = st.sampled_from(["get_emails", "verify", "seed_session", "x", "..", "%2e%2e", "a" * 300]) | st.text(
        alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="_-."), min_size=1,
        max_size=20)
    def fill(values: tuple[str, ...]) -> str:
        parts = iter(values)
        return re.sub(r"{\w+}", lambda _match: next(parts), path)

    return st.tuples(*[filler] * len(names)).map(fill)


# ---------------------------------------------------------------------------------------------- the servers


def _block(kind: str, impl: str, url: str) -> dict:
    return {kind: {impl: {"host": "127.0.0.1", "port": int(url.rsplit(":", 1)[1])}}}


def build_app(name: str, urls: dict[str, str]) -> Any:
    """The ASGI app of server `name`; `urls` holds the base URLs of those started before it (`SERVER_NAMES` order)."""
    from agents.simple_agent.app import SimpleAgent
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
    from gymfleet.fleet.head import create_head_app
    from resources_servers.genrm_compare.app import GenRMCompareServer
    from resources_servers.mcqa.app import MCQAServer
    from resources_servers.workplace_assistant.app import WorkplaceAssistantServer
    from responses_api_models.scripted_model.app import ScriptedModel
    from responses_api_models.vllm_model.app import VLLMModel
    from sandbox.app import SandboxServer

    fleet = {}
    if "vllm_model" in urls:
        fleet["policy"] = _block("responses_api_models", "vllm_model", urls["vllm_model"])
    if "mcqa" in urls:
        fleet["mcqa"] = _block("resources_servers", "mcqa", urls["mcqa"])
    if name == "scripted_model":
        return ScriptedModel({"name": "llm", "model": "m", "default": {"text": "\\boxed{B}"}}).create_app()
    if name == "vllm_model":
        return VLLMModel({"name": "policy", "base_url": urls["scripted_model"] + "/v1", "model": "m"}).create_app()
    if name == "mcqa":
        return MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()
    if name == "workplace_assistant":
        return WorkplaceAssistantServer({"name": "workplace_assistant", "domain": "agent"}).create_app()
    if name == "genrm_compare":
        return GenRMCompareServer({"name": "genrm", "domain": "rlhf", "genrm_model_server": "policy",
                                   "num_rollouts_per_prompt": 1}, fleet).create_app()
    if name == "simple_agent":
        return SimpleAgent({"name": "agent", "resources_server": "mcqa", "model_server": "policy", "max_steps": 2,
                            "model_timeout_s": 20, "verify_timeout_s": 20}, fleet).create_app()
    if name == "head":
        config = parse_global_config(GlobalConfigDictParserConfig(
            initial_global_config_dict={"config_paths": [str(ROOT / "configs/quickstart.yaml")],
                                        "head_server": {"host": "127.0.0.1", "port": free_port()}},
            skip_load_from_cli=True))
        return create_head_app(config)
    if name == "sandbox":
        return SandboxServer({"name": "sandbox"}).create_app()
    raise ValueError(f"unknown server {name!r}")


def start_servers(stack: ExitStack, sandbox_url: str | None) -> dict[str, str]:
    """One server per app shape, in this process, wired to each other; name → base URL."""
    urls: dict[str, str] = {}
    for name in SERVER_NAMES:
        if name == "sandbox" and sandbox_url is not None:
            urls[name] = sandbox_url  # the session's shared sandbox (conftest.py)
        else:
            urls[name] = stack.enter_context(serve(build_app(name, urls)))
    return urls


SERVER_NAMES = ["scripted_model", "vllm_model", "mcqa", "workplace_assistant", "genrm_compare", "simple_agent",
                "head", "sandbox"]
"""Start order: each server is wired to those before it."""


@pytest.fixture(scope="module")
def urls(sandbox_url):
    with ExitStack() as stack:
        yield start_servers(stack, sandbox_url)


@pytest.fixture(scope="module")
def client():
    # Idle connections are dropped after 1 s, well before any server's keep-alive timeout (uvicorn's 5 s default is
    # httpx's default expiry too: a connection reused at that instant was reset by the server closing it).
    with httpx.Client(timeout=CLIENT_TIMEOUT_S, limits=httpx.Limits(keepalive_expiry=1.0)) as http_client:
        yield http_client


def routes(doc: dict) -> list[tuple[str, str]]:
    return [(path, method) for path, methods in sorted(doc["paths"].items()) for method in sorted(methods)
            if method in ("get", "post", "put", "delete", "patch")]


def check_answer(answer: httpx.Response, what: str) -> None:
    """No 500; another 5xx only as a typed upstream failure."""
    assert answer.status_code != 500, f"{what}: 500 {answer.text[:500]}"
    if answer.status_code >= 500:
        assert answer.status_code in TYPED_UPSTREAM, f"{what}: {answer.status_code} {answer.text[:300]}"
        assert "error_type" in answer.json(), f"{what}: untyped {answer.status_code} {answer.text[:300]}"


def send(client: httpx.Client, url: str, method: str, path: str, body: Any = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    """One request; a timeout (a hang) fails the test, naming the request."""
    try:
        if raw is not None:
            return client.request(method.upper(), url + path, content=raw,
                                  headers={"content-type": "application/json", **(headers or {})})
        if method in ("get", "delete"):
            return client.request(method.upper(), url + path)
        return client.request(method.upper(), url + path, json=body)
    except httpx.TimeoutException:
        pytest.fail(f"{method.upper()} {path}: no answer within {CLIENT_TIMEOUT_S} s (hang)")


def fuzz_server(client: httpx.Client, name: str, url: str, examples: int, seed: int | None = None) -> dict[str, int]:
    """Run the schema-driven fuzz over every documented route of one server; returns request counts by status.

    Derandomized (the same requests every run) unless `seed` is given.
    """
    doc = client.get(url + "/openapi.json").json()
    hints = _sandbox_hints() if name == "sandbox" else {}
    counts: dict[str, int] = {}
    for path, method in routes(doc):
        bodies = route_bodies(doc, path, method, hints.get((path, method)))
        _fuzz_route(client, name, url, method, path_values(path), bodies, examples, seed, counts)
    assert client.get(url + "/").status_code in (200, 404), f"{name} stopped answering"
    return counts


def _fuzz_route(client: httpx.Client, name: str, url: str, method: str, paths: st.SearchStrategy,
                bodies: st.SearchStrategy, examples: int, seed: int | None, counts: dict[str, int]) -> None:
    @settings(FUZZ, max_examples=examples, derandomize=seed is None)
    @given(paths, bodies)
    def one(concrete: str, body: Any) -> None:
        if name == "sandbox":
            body = _cap_sandbox(body)
        answer = send(client, url, method, concrete, body)
        counts[str(answer.status_code)] = counts.get(str(answer.status_code), 0) + 1
        check_answer(answer, f"{name} {method.upper()} {concrete}")
        if name == "sandbox" and concrete == "/sessions" and answer.status_code == 200:
            # A session holds its memory share until deleted (or idle for 10 minutes): left open, a few of them
            # exhaust the admission budget and every later session, here or in other tests, waits in line.
            send(client, url, "delete", f"/sessions/{answer.json()['session_id']}")

    if seed is not None:
        one = hypothesis_seed(seed)(one)
    one()


def hostile_server(client: httpx.Client, name: str, url: str) -> dict[str, int]:
    """Every hostile body at every POST route of one server."""
    doc = client.get(url + "/openapi.json").json()
    counts: dict[str, int] = {}
    for path, method in routes(doc):  # a GET route gets the bodies too (ignored, or refused)
        concrete = re.sub(r"{\w+}", "x", path)
        for label, raw in hostile_bodies():
            answer = send(client, url, method, concrete, raw=raw)
            counts[str(answer.status_code)] = counts.get(str(answer.status_code), 0) + 1
            check_answer(answer, f"{name} {method.upper()} {concrete} [{label}]")
    assert client.get(url + "/").status_code in (200, 404), f"{name} stopped answering"
    return counts


# ---------------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("name", SERVER_NAMES)
def test_schema_fuzz_of_every_route(urls, client, name):
    counts = fuzz_server(client, name, urls[name], EXAMPLES if name != "sandbox" else max(3, EXAMPLES // 3))
    assert sum(counts.values()) > 0


@pytest.mark.parametrize("name", SERVER_NAMES)
def test_hostile_bodies_at_every_route(urls, client, name):
    counts = hostile_server(client, name, urls[name])
    assert sum(counts.values()) > 0


def test_the_schema_strategy_follows_the_schema():
    """The generator itself: drawn bodies validate against the documented schema (so 'valid' bodies are valid)."""
    from jsonschema import Draft202012Validator

    from resources_servers.mcqa.app import MCQAServer

    with serve(MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()) as url:
        doc = httpx.get(url + "/openapi.json", timeout=30).json()
    schema = _schema_of(doc, "/verify", "post")
    validator = Draft202012Validator({**schema, "components": doc["components"]})
    valid = from_schema(schema, doc["components"]["schemas"])
    seen = {"valid": 0, "broken": 0}

    @settings(FUZZ, max_examples=20)
    @given(valid, broken(valid))
    def check(body: Any, damaged: Any) -> None:
        assert not list(validator.iter_errors(body)), body
        seen["valid"] += 1
        if isinstance(damaged, dict) and not {"options", "expected_answer", "responses_create_params",
                                              "response"} <= set(damaged):
            assert list(validator.iter_errors(damaged)), damaged
            seen["broken"] += 1

    check()
    assert seen["valid"] == 20 and seen["broken"] > 0


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


MCQA_PROGRAM = (
    "import sys, uvicorn\n"
    "from resources_servers.mcqa.app import MCQAServer\n"
    "uvicorn.run(MCQAServer({'name': 'mcqa', 'domain': 'knowledge'}).create_app(), host='127.0.0.1',\n"
    "            port=int(sys.argv[1]), log_level='error')\n"
)
RSS_GROWTH_BOUND_KIB = 256 * 1024
"""Generous: a server that kept each hostile body (4 MB strings, 100k-deep lists) would grow by gigabytes."""


def test_server_process_memory_stays_bounded():
    """mcqa in its own process: RSS after 4 more rounds of every hostile body stays within a bound of RSS after one."""
    port = free_port()
    process, url = spawn_server([sys.executable, "-c", MCQA_PROGRAM, str(port)], port, cwd=str(ROOT))
    try:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http_client:
            hostile_server(http_client, "mcqa", url)  # warm-up: imports, caches, allocator arenas
            before = _rss_kib(process.pid)
            for _ in range(4):
                hostile_server(http_client, "mcqa", url)
            after = _rss_kib(process.pid)
        assert process.poll() is None, "the server died"
        assert after - before < RSS_GROWTH_BOUND_KIB, f"RSS grew from {before} KiB to {after} KiB"
    finally:
        process.terminate()
        process.wait(10)
