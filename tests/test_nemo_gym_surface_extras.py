"""The rest of the `nemo_gym` surface against real servers: rollout correlation (ids, the `/ng-rollout/<id>` prefix
in a folder's own app and through `ServerClient`), a folder that builds its own FastAPI app (NeMo-Gym's Gymnasium
base) served inside gymfleet's, `NeMoGymAsyncOpenAI`'s spent-key trip, `sandbox.agent_tools`, `failure_kinds`.
(The sync `Sandbox`: `tests/test_nemo_gym_sandbox.py`.)"""

from __future__ import annotations

import itertools
import random
from typing import Any

import aiohttp
import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gymfleet.serving.nemo_gym_server import host_class_for
from gymfleet.testing import serve
from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer
from nemo_gym.failure_kinds import AGENT_RUN_ERROR, FAILURE_KINDS, is_namespaced, validate_failure_kind
from nemo_gym.global_config import ATTEMPT_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI, PermanentEndpointError
from nemo_gym.rollout_correlation import (
    RolloutContextMiddleware,
    current_rollout_id,
    maybe_rollout_id_from_run_body,
    rollout_context,
)
from nemo_gym.sandbox.agent_tools import restricted_network_policy
from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient, rollout_path_prefix


def test_rollout_ids_are_task_rollout_and_attempt_and_an_explicit_one_wins_or_is_refused():
    rng = random.Random(23)
    for task, rollout, attempt in itertools.product(range(3), range(3), [None, 0, 1, 4]):
        row = {TASK_INDEX_KEY_NAME: task, ROLLOUT_INDEX_KEY_NAME: rollout}
        if attempt is not None:
            row[ATTEMPT_INDEX_KEY_NAME] = attempt
        suffix = f"-a{attempt}" if attempt else ""
        assert maybe_rollout_id_from_run_body(row) == f"{task}-{rollout}{suffix}"
        explicit = "".join(rng.choice("abc0._-") for _ in range(5))
        assert maybe_rollout_id_from_run_body({**row, "_ng_rollout_id": "x" + explicit}) == f"x{explicit}{suffix}"
    assert maybe_rollout_id_from_run_body({TASK_INDEX_KEY_NAME: 1}) is None
    assert maybe_rollout_id_from_run_body(None) is None
    for bad in [".hidden", "a/b", "", "a b", 7, "../x"]:
        with pytest.raises(ValueError, match="_ng_rollout_id"):
            maybe_rollout_id_from_run_body({"_ng_rollout_id": bad})
    with rollout_context("outer"):
        with rollout_context("inner"):
            assert current_rollout_id() == "inner"
        assert current_rollout_id() == "outer"
    assert current_rollout_id() is None
    assert rollout_path_prefix(None) == "" and rollout_path_prefix("3-1", token_capture=True) == \
        "/ng-rollout/3-1/training-token-capture"


def _seen_app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(RolloutContextMiddleware)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return {"path": request.url.path, "rollout": current_rollout_id()}

    return app


async def test_the_rollout_prefix_is_served_by_the_middleware_and_dropped_by_server_client():
    with serve(_seen_app()) as url:
        assert httpx.post(f"{url}/ng-rollout/4-2/v1/responses", timeout=10).json() == \
            {"path": "/v1/responses", "rollout": "4-2"}
        assert httpx.post(f"{url}/v1/responses", timeout=10).json()["rollout"] is None
        assert httpx.post(f"{url}/ng-rollout/.bad/v1/responses", timeout=10).status_code == 404
        host, port = url.removeprefix("http://").split(":")
        client = ServerClient(global_config_dict={"policy": {"responses_api_models": {"m": {"host": host,
                                                                                         "port": int(port)}}}})
        for path in ["/ng-rollout/4-2/v1/responses", "/ng-rollout/4-2/training-token-capture/v1/responses"]:
            answer = await client.post(server_name="policy", url_path=path, json={})
            assert (await answer.json()) == {"path": "/v1/responses", "rollout": None}


class _StepConfig(BaseResourcesServerConfig):
    pass


class _StepServer(SimpleResourcesServer):
    """A Gymnasium-style folder: builds its own app with `/reset` and `/step`, state per session."""

    config: _StepConfig
    counts: dict[str, int] = {}

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.add_middleware(RolloutContextMiddleware)
        app.post("/reset")(self.reset)
        app.post("/step")(self.step)
        return app

    async def reset(self, request: Request) -> dict[str, Any]:
        self.counts[request.session[SESSION_ID_KEY]] = 0
        return {"observation": "go", "rollout": current_rollout_id()}

    async def step(self, request: Request) -> dict[str, Any]:
        session = request.session[SESSION_ID_KEY]
        self.counts[session] += 1
        return {"reward": 1.0, "terminated": self.counts[session] == 2}

    async def verify(self, body):
        raise NotImplementedError


def _episode(url: str) -> list[dict]:
    with httpx.Client(base_url=url, timeout=10) as client:
        reset = client.post("/ng-rollout/7-0/reset", json={}).json()
        return [reset, client.post("/step", json={}).json(), client.post("/step", json={}).json()]


def test_a_folder_that_builds_its_own_app_keeps_sessions_in_its_tests_and_under_gymfleets_app():
    server = _StepServer(config=_StepConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="steps"),
                         server_client=ServerClient())
    with serve(server.setup_webserver()) as url:  # as the folder's own tests serve it
        assert [answer.get("terminated") for answer in _episode(url)] == [None, False, True]
    host = host_class_for(_StepServer)(None, {}, folder=server)
    plain_send = httpx.HTTPTransport.handle_request
    with serve(host.create_app()) as url:  # as ng_run serves it
        assert httpx.HTTPTransport.handle_request is not plain_send, "its own clients send the fleet token"
        reset, first, second = _episode(url)
        assert reset == {"observation": "go", "rollout": "7-0"} and (first["terminated"], second["terminated"]) == \
            (False, True), "one cookie jar, one session, across the routes the folder's app declared"
        liveness = httpx.get(f"{url}/", timeout=10)
        assert liveness.status_code == 200 and "gymfleet_requests_total" in httpx.get(f"{url}/metrics").text
        assert httpx.get(f"{url}/reward_provenance", timeout=10).json()["instance"] == "steps"
    assert httpx.HTTPTransport.handle_request is plain_send, "the server stopped: nothing left on this process's httpx"


def _openai_app() -> FastAPI:
    app = FastAPI()
    calls = app.state.calls = []

    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await request.json()
        calls.append(request.headers.get("authorization"))
        if body.get("model") == "revoked":
            return JSONResponse({"error": {"code": "invalid_api_key", "message": "no"}}, status_code=401)
        if body.get("model") == "denied":
            return JSONResponse({"error": {"code": "forbidden_region"}}, status_code=403)
        return {"id": "r", "echo": body}

    return app


async def test_async_openai_client_posts_with_its_key_and_a_revoked_key_stops_further_calls():
    app = _openai_app()
    with serve(app) as url:
        client = NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="k1")
        assert (await client.create_response(model="m", input="hi"))["echo"] == {"model": "m", "input": "hi"}
        with pytest.raises(aiohttp.ClientResponseError) as denied:  # a one-off denial: the next call still goes
            await client.create_response(model="denied")
        assert denied.value.status == 403 and not isinstance(denied.value, PermanentEndpointError)
        with pytest.raises(PermanentEndpointError, match="401"):
            await client.create_response(model="revoked")
        before = len(app.state.calls)
        with pytest.raises(PermanentEndpointError):
            await client.create_response(model="m")
        assert len(app.state.calls) == before, "a tripped client sends nothing"
        assert set(app.state.calls) == {"Bearer k1"}


def test_sandbox_network_policy_fails_closed_and_failure_kinds_are_nemo_gyms():
    policy = restricted_network_policy("opensandbox", ["http://10.0.0.5:8000/v1", "http://judge.internal:1/x"])
    assert policy == {"defaultAction": "deny", "egress": [{"action": "allow", "target": "10.0.0.5"},
                                                           {"action": "allow", "target": "judge.internal"}]}
    for provider, urls in [("gymfleet", ["http://10.0.0.5:1"]), ("opensandbox", ["http://127.0.0.1:1"]),
                           ("opensandbox", ["http://localhost:1"]), ("opensandbox", ["http://0.0.0.0:1"])]:
        with pytest.raises(ValueError):
            restricted_network_policy(provider, urls)
    assert AGENT_RUN_ERROR in FAILURE_KINDS and len(FAILURE_KINDS) == 22
    assert is_namespaced("swebench:image_missing") and not is_namespaced("judge_failed\n")
    assert validate_failure_kind("sandbox_failed") == "sandbox_failed" and validate_failure_kind(None) is None


def test_global_config_parser_resolves_relative_config_paths_in_the_tree_of_the_folder_under_test(
        tmp_path, monkeypatch):
    """A verifier fixture parses its tree's `benchmarks/<env>/config.yaml`, which lists
    `resources_servers/<env>/configs/<env>.yaml` relative to NeMo-Gym's PARENT_DIR: in a folder of another tree
    that is the folder's tree (even where gymfleet has a built-in environment of that name), not gymfleet's."""
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig

    tree = tmp_path / "tree"
    for relative, text in {
        "resources_servers/mcqa/configs/mcqa.yaml":
            "tree_mcqa:\n  resources_servers:\n    mcqa:\n      entrypoint: app.py\n      domain: knowledge\n"
            "      origin: the tree\n",
        "benchmarks/mcqa/config.yaml": "config_paths:\n  - resources_servers/mcqa/configs/mcqa.yaml\n",
    }.items():
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        (tree / relative).write_text(text)
    (tree / "resources_servers/mcqa/app.py").write_text("")
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    monkeypatch.setenv("GYMFLEET_FOLDER_TREE", str(tree))  # what enter_tree sets in a folder's process
    monkeypatch.chdir(tmp_path)
    parsed = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
        initial_global_config_dict={"config_paths": [str(tree / "benchmarks/mcqa/config.yaml")]},
        skip_load_from_cli=True, skip_load_from_dotenv=True))
    assert parsed.tree_mcqa.resources_servers.mcqa.origin == "the tree"


def test_a_folders_own_httpx_and_openai_clients_send_the_fleet_token_to_the_fleets_servers_only(monkeypatch):
    """gdpval calls its judge with `openai.AsyncOpenAI(base_url=get_server_url(judge) + "/v1", api_key="sk-dummy")`:
    gymfleet's servers refuse a call without the fleet's token, so a folder's own httpx-based clients get it for
    the fleet's granted addresses, never for another URL and never over a token header the call sets itself."""
    import openai

    from gymfleet import auth
    from gymfleet.serving.nemo_gym_own_clients import (
        send_fleet_token_from_own_clients,
        stop_sending_fleet_token_from_own_clients,
    )

    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def echo(request: Request) -> dict:
        return {"id": "r", "object": "response", "created_at": 0, "model": "m", "output": [],
                "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
                "token": request.headers.get(auth.TOKEN_HEADER)}

    monkeypatch.setattr(auth, "_origins", {})  # the grants below end with this test
    send_fleet_token_from_own_clients()
    send_fleet_token_from_own_clients()  # two folder servers in one process: one hook, counted
    try:
        _check_own_clients_send_the_token(app, openai)
        stop_sending_fleet_token_from_own_clients()
        _check_own_clients_send_the_token(app, openai)  # one server still serving: still sent
    finally:
        stop_sending_fleet_token_from_own_clients()  # the last one stopped: httpx is as it was
    with serve(app) as fleet_url:
        auth.grant(fleet_url, "fleet-secret")
        assert httpx.get(f"{fleet_url}/x").json()["token"] is None, "the hook is gone once the last server stops"


def _check_own_clients_send_the_token(app: FastAPI, openai: Any) -> None:
    import asyncio

    from gymfleet import auth

    with serve(app) as fleet_url, serve(app) as other_url:
        auth.grant(fleet_url, "fleet-secret")
        assert httpx.get(f"{fleet_url}/x").json()["token"] == "fleet-secret"
        assert httpx.get(f"{other_url}/x").json()["token"] is None, "never to an address the fleet did not grant"
        own = httpx.get(f"{fleet_url}/x", headers={auth.TOKEN_HEADER: "own"}).json()["token"]
        assert own == "own"

        async def judge() -> Any:
            async with openai.AsyncOpenAI(base_url=f"{fleet_url}/v1", api_key="sk-dummy", max_retries=0) as client:
                answer = await client.responses.with_raw_response.create(model="m", input="is it right?")
                return answer.http_response.json()

        assert asyncio.run(judge())["token"] == "fleet-secret"
