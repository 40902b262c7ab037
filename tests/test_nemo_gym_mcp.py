"""`nemo_gym.mcp_auto_exposure`: a NeMo-Gym folder's tool routes over MCP (`expose_tools_over_mcp`), served as `ng_run`
serves it (the folder's gymfleet host) on a real port and driven by the `mcp` SDK's own client; tokens tie each call
to the rollout's session, and every forged or missing one is refused."""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from itsdangerous import URLSafeSerializer
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel, Field
from starlette.middleware.base import BaseHTTPMiddleware

from gymfleet.errors import ConfigError
from gymfleet.serving.nemo_gym_server import host_class_for
from gymfleet.testing import serve
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ResourcesSeedSessionRequest,
    SimpleResourcesServer,
)
from nemo_gym.mcp_auto_exposure import NEMO_GYM_MCP_SESSION_TOKEN_HEADER, maybe_auto_expose
from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient


class NotesSeed(BaseSeedSessionRequest):
    allowed: list[str] | None = None


class Note(BaseModel):
    text: str = Field(min_length=1)


class NotesVerifyResponse(BaseVerifyResponse):
    notes: list[str]
    tools_seen: list[str]


class NotesServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig
    state: dict[str, list[str]] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/add_note")(self.add_note)
        app.post("/fail")(self.fail)
        return app

    def mcp_allowed_tools_for_session(self, seed_body: dict[str, Any]) -> list[str] | None:
        return seed_body.get("allowed")

    async def seed_session(self, request: Request, body: ResourcesSeedSessionRequest | NotesSeed) -> Any:
        if isinstance(body, ResourcesSeedSessionRequest):  # an Environment Server's seed
            return await super().seed_session(body)
        self.state[request.session[SESSION_ID_KEY]] = []
        return {}

    async def add_note(self, request: Request, body: Note) -> dict:
        """Keep a note in this rollout's session."""
        self.state.setdefault(request.session[SESSION_ID_KEY], []).append(body.text)
        return {"kept": len(self.state[request.session[SESSION_ID_KEY]])}

    def fail(self, body: Note) -> dict:
        raise HTTPException(status_code=409, detail=f"cannot {body.text}")

    async def verify(self, request: Request, body: BaseVerifyRequest) -> NotesVerifyResponse:
        notes = self.state.get(request.session[SESSION_ID_KEY], [])
        tools = [item.name for item in body.response.output if item.type == "function_call"]
        return NotesVerifyResponse(**body.model_dump(), reward=float(bool(notes) and tools == ["add_note"]),
                                   notes=notes, tools_seen=tools)


def _config(name: str = "notes", **fields: Any) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": name, "expose_tools_over_mcp": True,
            **fields}


@pytest.fixture(scope="module")
def served():
    host = host_class_for(NotesServer)(_config(), {})
    with serve(host.create_app()) as url:
        yield url, host.folder


def _row(tool: str = "add_note") -> dict:
    call = {"type": "function_call", "id": "fc", "call_id": "c1", "name": tool, "arguments": "{}"}
    return {"responses_create_params": {"input": "take a note"},
            "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [call]}}


def _seed(url: str, body: dict | None = None) -> tuple[httpx.Cookies, dict]:
    answer = httpx.post(f"{url}/seed_session", json=body or {}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.cookies, answer.json()["mcp"]


async def _mcp(url: str, headers: dict[str, str], calls: list[tuple[str, dict]]) -> tuple[list, list]:
    async with httpx.AsyncClient(headers=headers, timeout=10) as client, \
            streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, _), \
            ClientSession(read, write) as session:
        await session.initialize()
        listed = (await session.list_tools()).tools
        return listed, [await session.call_tool(name, arguments) for name, arguments in calls]


async def test_tool_calls_over_mcp_land_in_the_session_verify_scores(served):
    url, _ = served
    cookies, metadata = _seed(url)
    assert metadata["server_name"] == "notes" and metadata["url_path"] == "/mcp"
    listed, results = await _mcp(url, metadata["headers"], [("add_note", {"text": "milk"}),
                                                             ("add_note", {"text": "eggs"})])
    tools = {tool.name: tool for tool in listed}
    assert set(tools) == {"add_note", "fail"}, "reserved routes are never tools"
    assert tools["add_note"].description == "Keep a note in this rollout's session."
    assert tools["add_note"].inputSchema["required"] == ["text"]
    assert [result.structuredContent for result in results] == [{"kept": 1}, {"kept": 2}]
    assert json.loads(results[0].content[0].text) == {"kept": 1}
    scored = httpx.post(f"{url}/verify", json=_row(), cookies=cookies, timeout=10).json()
    assert (scored["reward"], scored["notes"]) == (1.0, ["milk", "eggs"])
    other_cookies, _ = _seed(url)
    assert httpx.post(f"{url}/verify", json=_row(), cookies=other_cookies, timeout=10).json()["notes"] == []


def _forged_tokens(honest: str) -> dict[str, dict[str, str]]:
    """Every way to call without this fleet's token for the session: none, junk, edited, or signed with a key
    someone outside the fleet knows (NeMo-Gym's: the server's public cookie name) or for another server."""
    public = URLSafeSerializer("NotesServer___notes", salt="nemo-gym-mcp-session-token")
    other = URLSafeSerializer("NotesServer___other", salt="nemo-gym-mcp-session-token")
    payload, _, signature = honest.rpartition(".")
    return {
        "missing": {},
        "empty": {NEMO_GYM_MCP_SESSION_TOKEN_HEADER: ""},
        "junk": {NEMO_GYM_MCP_SESSION_TOKEN_HEADER: "not-a-token"},
        "bad signature": {NEMO_GYM_MCP_SESSION_TOKEN_HEADER: f"{payload}.{signature[::-1]}"},
        "edited payload": {NEMO_GYM_MCP_SESSION_TOKEN_HEADER: f"{payload[:-2]}AA.{signature}"},
        "signed with the public cookie name": {
            NEMO_GYM_MCP_SESSION_TOKEN_HEADER: public.dumps({"sid": "victim", "tools": None})},
        "signed for another server": {
            NEMO_GYM_MCP_SESSION_TOKEN_HEADER: other.dumps({"sid": "victim", "tools": None})},
    }


async def test_every_missing_or_forged_token_is_refused_and_changes_nothing(served):
    url, folder = served
    cookies, metadata = _seed(url)
    honest = metadata["headers"][NEMO_GYM_MCP_SESSION_TOKEN_HEADER]
    before = {key: list(value) for key, value in folder.state.items()}
    for kind, headers in _forged_tokens(honest).items():
        _, results = await _mcp(url, headers, [("add_note", {"text": "forged"})])
        assert results[0].isError, kind
        assert "Session-Token" in results[0].content[0].text, (kind, results[0].content[0].text)
    assert {key: value for key, value in folder.state.items() if key in before} == before
    assert not any("forged" in notes for notes in folder.state.values())


async def test_a_session_token_narrowed_by_the_folder_lists_and_calls_only_its_tools(served):
    url, _ = served
    _, metadata = _seed(url, {"allowed": ["fail"]})
    listed, results = await _mcp(url, metadata["headers"], [("add_note", {"text": "x"}), ("fail", {"text": "x"})])
    assert [tool.name for tool in listed] == ["fail"]
    assert results[0].isError and "not allowed" in results[0].content[0].text
    assert results[1].isError and results[1].content[0].text == "HTTP 409 from POST /fail: cannot x"


async def test_bad_arguments_and_unknown_tools_are_error_results_with_the_routes_text(served):
    url, _ = served
    _, metadata = _seed(url)
    _, results = await _mcp(url, metadata["headers"], [("add_note", {"text": ""}), ("add_notes", {})])
    assert results[0].isError and results[0].content[0].text.startswith("HTTP 422 from POST /add_note:")
    assert "string_too_short" in results[0].content[0].text
    assert results[1].isError and "Unknown tool: 'add_notes'" in results[1].content[0].text


def test_verify_scores_namespaced_calls_by_their_bare_name_and_echoes_what_the_model_emitted(served):
    url, _ = served
    cookies, metadata = _seed(url)
    with httpx.Client(headers=metadata["headers"] | {"Accept": "application/json, text/event-stream"},
                      timeout=10) as client:
        called = client.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                 "params": {"name": "add_note", "arguments": {"text": "a"}}}).json()
    assert called["result"]["structuredContent"] == {"kept": 1}
    for emitted in ("mcp__notes__add_note", "add_note"):
        scored = httpx.post(f"{url}/verify", json=_row(emitted), cookies=cookies, timeout=10).json()
        assert (scored["reward"], scored["tools_seen"]) == (1.0, ["add_note"]), emitted
        assert scored["response"]["output"][0]["name"] == emitted
    other = httpx.post(f"{url}/verify", json=_row("mcp__other__add_note"), cookies=cookies, timeout=10).json()
    assert other["reward"] == 0.0, "only this server's namespace is stripped"


def test_an_environment_servers_seed_gets_the_token_as_resources_tools(served):
    url, _ = served
    seed = {"resources_session_id": "s1", "episode_id": {"rollout_id": "r1"},
            "task_id": {"taskset": "t", "task_id": "0"}, "task_data": {"allowed": ["add_note"]}}
    answer = httpx.post(f"{url}/seed_session", json=seed, timeout=10).json()
    assert answer["resources_session_id"] == "s1" and "mcp" not in answer
    assert answer["resources_tools"]["server_name"] == "notes"
    listed = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=10,
                        headers=answer["resources_tools"]["headers"] | {
                            "Accept": "application/json, text/event-stream"}).json()["result"]["tools"]
    assert [tool["name"] for tool in listed] == ["add_note"], "the allow-list came from the seed's task_data"


class _Stamp(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        return await call_next(request)


def test_exposure_that_would_skip_a_folders_middleware_or_lacks_the_extra_is_refused_in_one_line(monkeypatch):
    folder = NotesServer(config=BaseResourcesServerConfig(**_config()), server_client=ServerClient())
    app = folder.setup_webserver()
    app.add_middleware(_Stamp)
    with pytest.raises(ConfigError, match=r"middleware of its own \['test_nemo_gym_mcp\._Stamp'\]"):
        maybe_auto_expose(folder, app)
    off = NotesServer(config=BaseResourcesServerConfig(**_config(expose_tools_over_mcp=False)),
                      server_client=ServerClient())
    assert maybe_auto_expose(off, off.setup_webserver()) is None
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigError, match=r"needs the mcp package: pip install 'gymfleet\[mcp\]'"):
        maybe_auto_expose(folder, folder.setup_webserver())
