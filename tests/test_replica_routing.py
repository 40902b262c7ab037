"""How clients use an instance placed as several replicas (`gymfleet.http.ServerClient`,
`gymfleet.grading.sandbox_client`), without Ray: real servers on ephemeral ports stand where Ray would have put the
replicas.

A rollout's calls stick to one replica (its session lives there), rollouts spread over the replicas, a replica that
refuses connections is avoided by new rollouts, the addresses are refreshed from the head server after a failure,
and a sandbox session stays on the replica that created it.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from gymfleet import http
from gymfleet.errors import TransportError
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.fleet.head import create_head_app
from gymfleet.grading.sandbox_client import SandboxClient
from gymfleet.testing import free_port, make_response, serve, wait_until_async
from resources_servers.example_weather.app import ExampleWeatherServer
from sandbox.app import SandboxServer

ENV = "example_weather"


def address(url: str) -> dict:
    host, port = url.removeprefix("http://").split(":")
    return {"host": host, "port": int(port)}


def env_config(urls: list[str], head: str | None = None) -> dict:
    fields = {"entrypoint": "app.py", "domain": "agent", **address(urls[0]), "replicas": [address(u) for u in urls]}
    config = {ENV: {"resources_servers": {ENV: fields}}}
    if head:
        config["head_server"] = address(head)
    return config


def served(url: str, route: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10).text
    pattern = r'gymfleet_requests_total\{[^}]*route="' + route + r'"[^}]*status="200"[^}]*\} ([0-9.e+]+)'
    return int(sum(float(value) for value in re.findall(pattern, text)))


async def rollout(client: http.ServerClient) -> dict:
    """seed_session -> get_weather -> verify, carrying the session cookie, as an agent does."""
    seeded = (await client.post(ENV, "/seed_session", json={}, timeout_s=30)).raise_for_status()
    cookies = seeded.cookies
    looked = (await client.post(ENV, "/get_weather", json={"city": "Paris"}, cookies=cookies, timeout_s=30))
    cookies = {**cookies, **looked.raise_for_status().cookies}
    row = {"responses_create_params": {"input": "Weather in Paris?"}, "expected_city": "Paris",
           "response": make_response("It is sunny.")}
    return (await client.post(ENV, "/verify", json=row, cookies=cookies, timeout_s=30)).raise_for_status().json()


async def rollouts(client: http.ServerClient, n: int) -> list[dict | TransportError]:
    """`n` rollouts at once, each its own task (as `run_examples` starts them)."""
    results = await asyncio.gather(*(rollout(client) for _ in range(n)), return_exceptions=True)
    await http.close()
    return results


@pytest.fixture(scope="module")
def replicas():
    with serve(ExampleWeatherServer({"name": ENV}).create_app()) as a, \
            serve(ExampleWeatherServer({"name": ENV}).create_app()) as b:
        yield [a, b]


def test_each_rollout_sticks_to_one_replica_and_rollouts_spread(replicas):
    before = [served(url, "/verify") for url in replicas]
    results = asyncio.run(rollouts(http.ServerClient(env_config(replicas)), 20))
    assert [r["tool_calls_made"] for r in results] == [1] * 20, "every verify found its session's tool call"
    assert [r["reward"] for r in results] == [1.0] * 20
    per_replica = [served(url, "/verify") - was for url, was in zip(replicas, before, strict=True)]
    assert sum(per_replica) == 20 and min(per_replica) > 0, per_replica


def test_one_task_running_rollouts_in_turn_spreads_them_with_rollout_scope(replicas):
    async def in_turn() -> list[dict]:
        client = http.ServerClient(env_config(replicas))
        results = []
        for _ in range(6):
            with http.rollout_scope():
                results.append(await rollout(client))
        await http.close()
        return results

    before = [served(url, "/seed_session") for url in replicas]
    assert [r["reward"] for r in asyncio.run(in_turn())] == [1.0] * 6
    assert all(served(url, "/seed_session") > was for url, was in zip(replicas, before, strict=True))


async def rollouts_in_turn(client: http.ServerClient, count: int) -> list[dict | TransportError]:
    """`count` rollouts one after another, each its own rollout scope: the answers, or the `TransportError`s."""
    outcomes: list[dict | TransportError] = []
    for _ in range(count):
        with http.rollout_scope():
            try:
                outcomes.append(await rollout(client))
            except TransportError as exc:
                outcomes.append(exc)
    return outcomes


def test_a_replica_that_refuses_is_avoided_by_new_rollouts(replicas):
    dead = f"http://127.0.0.1:{free_port()}"

    async def in_turn() -> list[dict | TransportError]:
        client = http.ServerClient(env_config([dead, replicas[0]]))
        outcomes = await rollouts_in_turn(client, 8)
        await http.close()
        return outcomes

    outcomes = asyncio.run(in_turn())
    failures = [o for o in outcomes if isinstance(o, TransportError)]
    assert len(failures) <= 1 and all(f.failure_class == "connection_error" for f in failures), failures
    assert [o["reward"] for o in outcomes if isinstance(o, dict)] == [1.0] * (8 - len(failures))


def test_addresses_are_refreshed_from_the_head_server_after_a_failure(replicas):
    dead = f"http://127.0.0.1:{free_port()}"
    head_port = free_port()
    config = GlobalConfig.from_data({**env_config(replicas), "head_server": {"host": "127.0.0.1", "port": head_port}})
    live = {ENV: [{**address(url), "node": "n", "status": "running", "restarts": 0, "pid": None} for url in replicas]}
    with serve(create_head_app(config, replicas=lambda: live)) as head:

        async def in_turn() -> list[dict | TransportError]:
            client = http.ServerClient(env_config([dead, dead.replace("127.0.0.1", "localhost")], head))
            outcomes = await rollouts_in_turn(client, 1)  # fails, and starts the refresh in the background
            # the state the rollouts after it need (not a number of rollouts or pauses: the refresh is an HTTP call,
            # which a loaded machine may answer late)
            await wait_until_async(lambda: client.urls_of(ENV) == replicas,
                                   "the head server's addresses replaced the dead ones")
            outcomes += await rollouts_in_turn(client, 6)
            await http.close()
            return outcomes

        before = [served(url, "/verify") for url in replicas]
        outcomes = asyncio.run(in_turn())
    assert isinstance(outcomes[0], TransportError) and outcomes[0].failure_class == "connection_error"
    assert all(isinstance(o, dict) and o["reward"] == 1.0 for o in outcomes[1:]), outcomes
    assert all(served(url, "/verify") > was for url, was in zip(replicas, before, strict=True))


def test_a_sandbox_session_stays_on_its_replica_while_runs_spread():
    with serve(SandboxServer({"name": "sandbox"}).create_app()) as a, \
            serve(SandboxServer({"name": "sandbox"}).create_app()) as b:
        config = {"sandbox": {"sandbox_servers": {"sandbox": {**address(a), "replicas": [address(a), address(b)]}}}}

        async def scenario() -> list[str]:
            client = SandboxClient("sandbox", config=config)
            outputs = []
            async with await client.session(timeout_s=5, memory_mb=256) as session:
                await session.exec("count = 0")
                for _ in range(4):
                    outputs.append((await session.exec("count += 1\nprint(count)")).stdout.strip())
            runs = await asyncio.gather(*(client.run("print(1)", timeout_s=5, memory_mb=256) for _ in range(6)))
            assert all(run.ok for run in runs)
            await http.close()
            return outputs

        assert asyncio.run(scenario()) == ["1", "2", "3", "4"], "the session's state lived on one replica"
        assert served(a, "/run") > 0 and served(b, "/run") > 0, "runs spread over both sandboxes"
