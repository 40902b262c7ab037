"""A NeMo-Gym folder that raises after one of its `ServerClient` calls failed answers a typed infrastructure failure,
never a reward and never an untyped 500 (`gymfleet.serving.nemo_gym_upstream`).

The class, not one folder: every way a folder reads a failed answer carelessly (validating an error body as a
`NeMoGymResponse`, indexing it, converting it, raising its own error after catching the transport error) times every
way the call failed (a 4xx, a 5xx, no answer), on `/verify` (NeMo-Gym's failure row) and on a tool route (a typed
502). The judge is `scripted_model` (a real server) with fault rules. The controls: a folder bug with no failed call
stays an untyped 500, a folder that handles the failed answer keeps its reward, and one request's failed call does
not type the next request's bug.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from gymfleet.serving.nemo_gym_client import HTTPStatusError
from gymfleet.serving.nemo_gym_server import host_class_for
from gymfleet.testing import free_port, serve
from gymfleet.testing.fleets import server_block
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import get_response_json, raise_for_status
from responses_api_models.scripted_model.app import ScriptedModel

SCRIPT = {"name": "judge", "rules": [{"match": "S400", "status": 400}, {"match": "S500", "status": 500}],
          "default": {"text": "7"}}
CARELESS = {  # how a folder reads an answer without checking its status (each raises on an error body)
    "validate": lambda data: NeMoGymResponse.model_validate(data).output_text,
    "index": lambda data: data["output"][0]["content"][0]["text"],
    "convert": lambda data: str(float(data.get("error", {}).get("message", "x"))),
}
FAILURES = {"S400": 400, "S500": 500, "gone": None}


class _Config(BaseResourcesServerConfig):
    pass


class _Request(BaseVerifyRequest):
    question: str
    how: str = "validate"
    server: str = "judge"


class _ToolBody(BaseModel):
    question: str
    how: str = "validate"
    server: str = "judge"


class _CarelessServer(SimpleResourcesServer):
    """A folder that asks a server and reads its answer the careless way `how` names."""

    config: _Config

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/ask")(self.ask)
        return app

    async def _ask(self, question: str, how: str, server: str) -> str:
        if how == "bug":
            raise ValueError("a bug of the folder's own")
        try:
            answer = await self.server_client.post(server_name=server, url_path="/v1/responses",
                                                   json={"input": question})
        except Exception as exc:  # noqa: BLE001 - a folder that hides the transport error behind its own
            raise RuntimeError("no verdict") from exc
        data = await get_response_json(answer)
        if how == "handled":
            return "handled" if not answer.ok else data["output"][0]["content"][0]["text"]
        return CARELESS[how](data)

    async def ask(self, body: _ToolBody) -> dict:
        return {"verdict": await self._ask(body.question, body.how, body.server)}

    async def verify(self, body: _Request) -> BaseVerifyResponse:
        verdict = await self._ask(body.question, body.how, body.server)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if verdict in ("7", "handled") else 0.5)


@pytest.fixture(scope="module")
def folder_url():
    with serve(ScriptedModel(SCRIPT).create_app()) as judge:
        fleet = {"judge": server_block("responses_api_models", "impl", judge),
                 "helper": server_block("resources_servers", "impl", judge),
                 "gone": server_block("responses_api_models", "impl", f"http://127.0.0.1:{free_port()}")}
        host = host_class_for(_CarelessServer)({"host": "127.0.0.1", "port": 0, "entrypoint": "app.py",
                                                "name": "careless"}, fleet)
        with serve(host.create_app()) as url:
            yield url


def _row(question: str, how: str, server: str = "judge") -> dict:
    output = [{"id": "m", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "x", "annotations": []}]}]
    return {"responses_create_params": {"input": question}, "question": question, "how": how, "server": server,
            "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output}}


def _target(failure: str) -> tuple[str, str]:
    """(question, server) that make the call fail as `failure` names."""
    return ("fine", "gone") if failure == "gone" else (failure, "judge")


@pytest.mark.parametrize(("how", "failure"), list(itertools.product(CARELESS, FAILURES)))
def test_an_exception_after_a_failed_judge_call_is_a_typed_failure(folder_url, how, failure):
    question, server = _target(failure)
    row = httpx.post(f"{folder_url}/verify", json=_row(question, how, server), timeout=60)
    assert row.status_code == 200, row.text
    row = row.json()
    assert (row["_ng_failure_class"], row["failure_kind"], row["mask_sample"], row["reward"]) == (
        "judge_failed", "judge_failed", True, 0.0)
    status = FAILURES[failure]
    assert f"{server} /v1/responses failed ({f'HTTP {status}' if status else 'no answer'}" in row["failure_reason"]
    assert row["_ng_failure_judge_error"] == row["failure_reason"] and row["question"] == question
    tool = httpx.post(f"{folder_url}/ask", json={"question": question, "how": how, "server": server}, timeout=60)
    assert tool.status_code == 502 and tool.json()["error_type"] == "judge_failed", tool.text


def test_a_failed_call_to_a_server_that_is_no_model_is_a_transport_failure(folder_url):
    row = httpx.post(f"{folder_url}/verify", json=_row("S500", "index", "helper"), timeout=60).json()
    assert (row["_ng_failure_class"], row["reward"]) == ("transport_failed", 0.0)
    assert "helper /v1/responses failed (HTTP 500" in row["failure_reason"]


def test_what_no_failed_call_explains_stays_the_folders_own(folder_url):
    assert httpx.post(f"{folder_url}/verify", json=_row("fine", "validate"), timeout=60).json()["reward"] == 1.0
    handled = httpx.post(f"{folder_url}/verify", json=_row("S500", "handled"), timeout=60).json()
    assert handled["reward"] == 1.0 and "_ng_failure_class" not in handled, "a handled error answer keeps its reward"
    failed = httpx.post(f"{folder_url}/verify", json=_row("S500", "index"), timeout=60)
    assert failed.json()["_ng_failure_class"] == "judge_failed"
    for path, body in (("/verify", _row("fine", "bug")), ("/ask", {"question": "fine", "how": "bug"})):
        bug = httpx.post(f"{folder_url}{path}", json=body, timeout=60)
        assert bug.status_code == 500 and bug.json()["error_type"] == "server_error", bug.text
        assert "a bug of the folder's own" in bug.json()["detail"], "the previous request's failed call is not kept"


class _Stream:
    async def read(self) -> bytes:
        return b'{"error": "slow down"}'


class _ForeignResponse:
    """A non-2xx response that is not `ServerClient`'s (an aiohttp one, or a folder test's stand-in)."""

    ok = False
    status = 429
    content = _Stream()
    request_info = SimpleNamespace(url="http://judge/v1/responses")

    async def read(self) -> bytes:
        return b"the body read() gives, which raise_for_status does not read"


class _ForeignRaising(_ForeignResponse):
    def raise_for_status(self) -> None:
        raise aiohttp.ClientResponseError(request_info=self.request_info, history=(), status=429, message="Too Many")


async def test_raise_for_status_treats_a_foreign_response_as_nemo_gym_does():
    """longmemeval's test hands `raise_for_status` a stand-in: NeMo-Gym reads `content.read()` and raises the
    object's own `ClientResponseError` with `response_content`; one that raises none gets `HTTPStatusError`."""
    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await raise_for_status(_ForeignRaising())
    assert type(caught.value) is aiohttp.ClientResponseError
    assert caught.value.response_content == b'{"error": "slow down"}'
    with pytest.raises(HTTPStatusError) as caught:
        await raise_for_status(_ForeignResponse())
    assert (caught.value.status, caught.value.url) == (429, "http://judge/v1/responses")
    assert caught.value.response_content == b'{"error": "slow down"}'


def test_poll_for_status_says_whether_a_server_answers_at_all(folder_url):
    """xstest waits for its judge with `poll_for_status` in `setup_webserver`: any answer is "success"."""
    from nemo_gym.server_utils import ServerClient

    fleet = {"up": server_block("responses_api_models", "impl", folder_url),
             "down": server_block("responses_api_models", "impl", f"http://127.0.0.1:{free_port()}"),
             "head_server": {"host": "127.0.0.1", "port": urlsplit(folder_url).port}}
    client = ServerClient(global_config_dict=fleet)
    assert [client.poll_for_status(name, timeout_seconds=5) for name in ("up", "down", "head_server", "nobody")] == [
        "success", "connection_error", "success", "unknown_error"]
    assert client._build_server_base_url(fleet["head_server"]) == folder_url
