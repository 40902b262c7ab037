"""The fleet token (`gymfleet.auth`): every route of every server type refuses a request without it; gymfleet's own
clients send it with nothing to configure; the loopback-only opt-out refuses a fleet that listens elsewhere.

Routes are walked from each app's own route table (and, for a running fleet, from each server's `/openapi.json`),
so a route added later is covered without touching this file.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import httpx
import psutil
import pytest

from gymfleet import auth
from gymfleet.errors import ConfigError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config, repository_root
from gymfleet.fleet.head import create_head_app
from gymfleet.fleet.supervisor import Fleet
from gymfleet.testing import fleet_headers, free_port, running_fleet, serve

ROOT = repository_root()
QUICKSTART = str(ROOT / "configs/quickstart.yaml")
TOKEN = "the-fleet-token-of-this-test"


def _agent():
    from agents.simple_agent.app import SimpleAgent

    return SimpleAgent({"name": "agent", "resources_server": "env", "model_server": "policy"})


def _weather():
    from resources_servers.example_weather.app import ExampleWeatherServer

    return ExampleWeatherServer({"name": "example_weather", "domain": "agent"})


def _mcqa():
    from resources_servers.mcqa.app import MCQAServer

    return MCQAServer({"name": "mcqa", "domain": "knowledge"})


def _vllm():
    from responses_api_models.vllm_model.app import VLLMModel

    return VLLMModel({"name": "policy", "base_url": "http://127.0.0.1:9/v1"})


def _scripted():
    from responses_api_models.scripted_model.app import ScriptedModel

    return ScriptedModel({"name": "llm", "model": "m", "default": {"text": "ok"}})


def _sandbox():
    from sandbox.app import SandboxServer

    return SandboxServer({"name": "sandbox"})


SERVERS = {"agent": _agent, "example_weather": _weather, "mcqa": _mcqa, "vllm_model": _vllm,
           "scripted_model": _scripted, "sandbox": _sandbox}


def _requests(app) -> list[tuple[str, str]]:
    """(method, path) of every route of `app`, path parameters filled in."""
    found = []
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x", getattr(route, "path", ""))
        for method in sorted((getattr(route, "methods", None) or {"GET"}) - {"HEAD"}):
            found.append((method, path))
    return found


def _assert_every_route_refused(url: str, requests: list[tuple[str, str]]) -> None:
    assert len(requests) >= 3, requests
    with httpx.Client(base_url=url, timeout=30) as client:
        for method, path in requests:
            for headers in ({}, {auth.TOKEN_HEADER: "wrong"}, {"Authorization": "Bearer wrong"}):
                answer = client.request(method, path, headers=headers, json={"x": 1})
                if (method, path) == ("GET", "/"):
                    assert answer.status_code == 200 and answer.json() == {"status": "ok"}
                    assert not {"x-gymfleet-fleet", "x-gymfleet-instance"} & set(answer.headers), "GET / says more"
                    continue
                assert answer.status_code == 401, (method, path, headers, answer.text)
                assert answer.json()["error_type"] == "unauthorized"
                assert "token" in answer.json()["detail"] and "\n" not in answer.json()["detail"]


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_every_route_of_every_server_type_refuses_a_request_without_the_token(kind, monkeypatch):
    monkeypatch.setenv(auth.FLEET_TOKEN_ENV, TOKEN)
    app = SERVERS[kind]().create_app()
    with serve(app) as url:
        _assert_every_route_refused(url, _requests(app))
        with httpx.Client(base_url=url, timeout=30) as client:  # the token opens them (Bearer too, for OpenAI clients)
            assert client.get("/metrics", headers={auth.TOKEN_HEADER: TOKEN}).status_code == 200
            assert client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_every_route_of_the_head_server_refuses_a_request_without_the_token():
    config = parse_global_config(GlobalConfigDictParserConfig(
        initial_global_config_dict={"config_paths": [QUICKSTART], "head_server": {"port": free_port()}},
        skip_load_from_cli=True))
    app = create_head_app(config, token=TOKEN)
    with serve(app) as url:
        _assert_every_route_refused(url, _requests(app))
        answer = httpx.get(url + "/server_instances", headers={auth.TOKEN_HEADER: TOKEN})
        assert answer.status_code == 200


def test_a_bare_app_outside_a_fleet_checks_no_token(monkeypatch):
    monkeypatch.delenv(auth.FLEET_TOKEN_ENV, raising=False)
    with serve(_mcqa().create_app()) as url:
        assert httpx.get(url + "/metrics").status_code == 200


def test_a_running_fleet_refuses_outsiders_on_every_route_and_its_own_clients_need_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(auth.USER_TOKEN_ENV, raising=False)
    with running_fleet([QUICKSTART]) as fleet:
        head = f"http://127.0.0.1:{fleet.config.head_port}"
        token_file = auth.token_path("127.0.0.1", fleet.config.head_port)
        assert token_file.read_text() == fleet.token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        for name in fleet.config.instances:
            url = fleet.config.instance(name).url
            schema = httpx.get(url + "/openapi.json", headers=fleet_headers(fleet), timeout=30).json()
            routes = [(method.upper(), path) for path, methods in schema["paths"].items() for method in methods]
            _assert_every_route_refused(url, [*routes, ("GET", "/metrics"), ("GET", "/")])
        _assert_every_route_refused(head, [("GET", "/global_config_dict_yaml"), ("GET", "/server_instances"),
                                           ("GET", "/metrics"), ("GET", "/")])
        # The whole path a user takes (agent -> model -> scripted LLM, agent -> environment) authenticates itself.
        from gymfleet.cli.collect import main as collect_main

        monkeypatch.chdir(tmp_path)
        rows = ROOT / "resources_servers/mcqa/data/example.jsonl"
        with pytest.raises(SystemExit) as exited:
            collect_main(["+agent_name=mcqa_simple_agent", f"+input_jsonl_fpath={rows}", "+output_jsonl_fpath=o.jsonl",
                          f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}"])
        assert exited.value.code == 0
    assert not token_file.exists(), "shutdown removes the token file"


def _config(**extra):
    initial = {"config_paths": [QUICKSTART], "head_server": {"host": "127.0.0.1", "port": free_port()}, **extra}
    return parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=initial,
                                                            skip_load_from_cli=True))


@pytest.mark.parametrize("exposed", [
    {"head_server": {"host": "0.0.0.0", "port": free_port()}},
    {"mcqa": {"resources_servers": {"mcqa": {"host": "0.0.0.0"}}}},
], ids=["head on every interface", "a server on every interface"])
def test_the_opt_out_refuses_a_fleet_that_listens_beyond_loopback(exposed):
    with pytest.raises(ConfigError, match="disable_fleet_auth.*loopback"):
        Fleet(_config(disable_fleet_auth=True, **exposed))


def test_the_opt_out_on_loopback_serves_clients_that_send_no_token():
    with running_fleet([QUICKSTART], {"disable_fleet_auth": True}) as fleet:
        assert not auth.token_path("127.0.0.1", fleet.config.head_port).exists()
        assert httpx.get(fleet.config.instance("mcqa").url + "/metrics").status_code == 200
        head = f"http://127.0.0.1:{fleet.config.head_port}"
        assert httpx.get(head + "/server_instances").status_code == 200


@pytest.mark.parametrize("server_start", ["spawn", "zygote"])
def test_no_secret_or_token_is_in_any_server_process_environment(server_start):
    """`/proc/<pid>/environ` (a process's initial environment, for its whole life) of every process of the fleet,
    servers and their workers, holds neither the policy's API key nor the fleet token; the servers still serve, and
    each worker still requires the token (a worker that held none would check none)."""
    canary = "sk-canary-only-for-the-policy"
    overrides = {"policy_api_key": canary, "server_start": server_start,
                 "mcqa": {"resources_servers": {"mcqa": {"num_workers": 2}}}}
    with running_fleet([QUICKSTART], overrides) as fleet:
        token = fleet.credential.token.encode()
        processes = {}
        for name, child in fleet.children.items():
            server = psutil.Process(child.process.pid)
            processes.update({f"{name} (pid {p.pid})": p.pid for p in [server, *server.children(recursive=True)]})
        assert sum(name.startswith("mcqa") for name in processes) >= 3, "the server and its two workers"
        for name, pid in processes.items():
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert canary.encode() not in environ and token not in environ, name
            assert b"GYMFLEET_CREDENTIALS_FD" not in environ or server_start == "spawn", name
        policy = fleet.config.instance("policy_model").url
        answer = httpx.post(policy + "/v1/responses", json={"input": "hi"}, headers=fleet_headers(fleet), timeout=60)
        assert answer.status_code == 200, answer.text
        mcqa = fleet.config.instance("mcqa").url + "/metrics"  # each worker holds the token (else it checks none)
        assert {httpx.get(mcqa, timeout=30).status_code for _ in range(8)} == {401}
        assert httpx.get(mcqa, timeout=30, headers=fleet_headers(fleet)).status_code == 200
