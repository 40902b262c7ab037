"""The one secret rule (`gymfleet.masking`), table-tested over every spelling of a secret key, every place a config
can hold one (top level, a server block, a header map, a list, under another secret) and every kind of value (string,
number, list, nested map), plus URL credentials anywhere, `/metrics` labels and upstream error text."""

from __future__ import annotations

import itertools
import json

import pytest

from gymfleet.fleet.launch import merge_secrets, split_secrets
from gymfleet.masking import MASK, is_secret_key, mask_secrets, mask_text, redact
from gymfleet.metrics import target_of

CANARY = "sk-canary-7f3a9c"
SPELLINGS = ["api_key", "apikey", "api-key", "API_KEY", "Api-Key", "x-api-key", "X-API-KEY", "policy_api_key",
             "openai_api_key", "genrm_api_key", "api_keys", "Authorization", "authorization", "token", "hf_token",
             "HF_TOKEN", "access_token", "auth_token", "secret", "client_secret", "secret_key", "password",
             "db_password", "passwd", "credentials", "Cookie", "private_key", "aws_access_key"]
NOT_SECRETS = ["max_tokens", "max_new_tokens", "tokenizer", "base_url", "model", "port", "temperature", "name",
               "top_p", "num_workers"]
VALUES = {"string": CANARY, "bearer": f"Bearer {CANARY}", "number": 73105, "list": [CANARY, CANARY],
          "nested": {"primary": CANARY, "backup": [CANARY]}}


def _placements(key: str, value):
    yield "top level", {key: value}
    yield "server block", {"policy": {"responses_api_models": {"vllm_model": {key: value, "port": 1}}}}
    yield "header map", {"policy": {"responses_api_models": {"openai_model": {"default_headers": {key: value}}}}}
    yield "list of maps", {"judges": [{"name": "a", key: value}]}


CASES = [pytest.param(key, kind, where, config, id=f"{key}-{kind}-{where}")
         for key, kind in itertools.product(SPELLINGS, VALUES) for where, config in _placements(key, VALUES[kind])]


@pytest.mark.parametrize("key, kind, where, config", CASES)
def test_every_secret_spelling_placement_and_value_kind_is_masked_and_restorable(key, kind, where, config):
    assert is_secret_key(key)
    masked = mask_secrets(config)
    text = json.dumps(masked)
    assert CANARY not in text and "73105" not in text, text
    assert MASK in text
    hidden, secrets = split_secrets(config)
    assert hidden == masked
    assert merge_secrets(json.loads(json.dumps(hidden)), secrets) == json.loads(json.dumps(config)), "restorable"


@pytest.mark.parametrize("key", NOT_SECRETS)
def test_keys_that_only_look_alike_are_kept(key):
    assert not is_secret_key(key)
    assert mask_secrets({key: 512}) == {key: 512}


def test_switches_under_a_secret_looking_key_stay():
    config = {"return_token_id_information": True, "api_key": None, "token": ""}
    assert mask_secrets(config) == config


URLS = ["https://user:{c}@api.example/v1", "http://{c}@10.0.0.1:8000/v1", "postgres://admin:{c}@db:5432/x",
        "HTTPS://u:{c}@Host.example"]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("where", ["value", "inside text", "in a list"])
def test_url_credentials_are_masked_wherever_the_url_is(url, where):
    url = url.format(c=CANARY)
    node = {"value": {"base_url": url}, "inside text": {"note": f"see {url} for more"},
            "in a list": {"base_urls": [url, "http://plain:8000"]}}[where]
    text = json.dumps(mask_secrets(node))
    assert CANARY not in text and "@" in text and MASK in text
    assert "http://plain:8000" in text or where != "in a list"


@pytest.mark.parametrize("url", URLS)
def test_metrics_labels_drop_url_credentials(url):
    label = target_of(url.format(c=CANARY) + "/chat/completions")
    assert CANARY not in label and MASK in label


def test_redact_removes_the_keys_a_server_holds_and_url_credentials():
    echo = f'{{"error": "Incorrect API key provided: {CANARY}", "url": "https://u:{CANARY}x@h/v1"}}'
    assert CANARY not in redact(echo, (CANARY,))
    assert mask_text("no url here @ all") == "no url here @ all"


@pytest.mark.parametrize("status", [400, 401, 500])
def test_an_upstream_that_echoes_the_key_never_makes_it_public(status, caplog):
    import httpx
    from fastapi import FastAPI
    from starlette.responses import JSONResponse

    from gymfleet.testing import serve
    from responses_api_models.vllm_model.app import VLLMModel

    upstream = FastAPI()

    @upstream.post("/v1/chat/completions")
    async def refuse():
        return JSONResponse({"error": {"message": f"Incorrect API key provided: {CANARY}"}}, status_code=status)

    with serve(upstream) as llm:
        model = VLLMModel({"name": "policy", "base_url": llm + "/v1", "api_key": CANARY, "upstream_max_attempts": 1,
                           "default_headers": {"x-api-key": CANARY}})
        with serve(model.create_app()) as url, caplog.at_level("DEBUG"):
            answer = httpx.post(url + "/v1/responses", json={"input": "hi"}, timeout=30)
            metrics = httpx.get(url + "/metrics").text
    assert answer.status_code >= 400
    assert CANARY not in answer.text and CANARY not in metrics and CANARY not in caplog.text, answer.text
