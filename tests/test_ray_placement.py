"""Ray placement across nodes (`gymfleet.fleet.ray_placement`) on a real 3-node Ray cluster on this machine.

One module-scoped `ray.cluster_utils.Cluster` (Ray's own multi-node test fixture: a head and two worker nodes, each
with its own CPUs and custom resources, every node on `127.0.0.1`: tests send nothing to this machine's other
addresses) runs one fleet: the scripted model behind `vllm_model`, example_weather as
two replicas, and its agent pinned to the node that alone has the `agent_node` resource. The tests check where
Ray put each replica, that the head server publishes real addresses, that rollouts spread over both replicas and
stick to one per rollout, that a replica killed mid-collection fails its rollouts typed and comes back, and that no
replica, head server or Ray service listens on or is called at an address outside loopback. The user's path, `ng_run`
attached to a 2-node loopback cluster by `+ray_head_node_address=127.0.0.1:<port>`, serves a rollout.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from gymfleet import http
from gymfleet.errors import ConfigError, TransportError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.ray_cluster import memory_bytes
from gymfleet.fleet.ray_fleet import RayFleet
from gymfleet.fleet.ray_placement import make_fleet, placement_of
from gymfleet.fleet.supervisor import Fleet
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper
from gymfleet.testing import fleet_headers, free_port, ng_status_all_live
from gymfleet.testing.loopback import loopback_cluster, off_loopback, off_loopback_hosts, on_loopback, tree_pids
from resources_servers.example_weather.app import FORECASTS

ROOT = Path(__file__).resolve().parents[1]
ROWS = [json.loads(line) for line in (ROOT / "resources_servers/example_weather/data/example.jsonl").read_text()
        .splitlines()]
AGENT = "example_weather_simple_agent"
ENV = "example_weather"
WAIT_S = 120
CANARY_KEY = "sk-canary-of-the-ray-placement-tests"
"""Bound on waits for things that take seconds (catches a hang; times nothing)."""


def scripted_rules(delay_s: float) -> list[dict]:
    """Look the city up, then answer with the forecast's condition; every model turn takes `delay_s`."""
    answers = [{"match": rf'"condition":\s*"{condition}"', "match_in": "last_message", "delay_s": delay_s,
                "text": f"The forecast says {condition}."} for condition in {c for c, _ in FORECASTS.values()}]
    calls = [{"match": rf"(?i)\b{city}\b", "match_in": "transcript", "delay_s": delay_s, "text": "Looking it up.",
              "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    return [*answers, *calls]


def fleet_config(address: str | None, **extra) -> dict:
    config = {
        "config_paths": ["responses_api_models/vllm_model/configs/vllm_model.yaml",
                         "resources_servers/example_weather/configs/example_weather.yaml"],
        "policy_base_url": "http://${scripted_llm.responses_api_models.scripted_model.host}:"
                           "${scripted_llm.responses_api_models.scripted_model.port}/v1",
        "policy_api_key": CANARY_KEY,
        "policy_model_name": "scripted",
        "scripted_llm": {"responses_api_models": {"scripted_model": {
            "entrypoint": "app.py", "model": "scripted", "rules": scripted_rules(0.3),
            "ray_resources": {"num_cpus": 0.5}}}},
        ENV: {"resources_servers": {ENV: {"num_replicas": 2, "ray_resources": {"num_cpus": 1}}}},
        AGENT: {"responses_api_agents": {"simple_agent": {
            "ray_resources": {"num_cpus": 0.5, "memory": "64MiB", "resources": {"agent_node": 1}}}}},
        "policy_model": {"responses_api_models": {"vllm_model": {"ray_resources": {"num_cpus": 0.5}}}},
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "restart_crashed_servers": 3,
        **extra,
    }
    if address:
        config["ray_head_node_address"] = address
    return config


def parse(initial: dict):
    return parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=initial,
                                                            skip_load_from_cli=True))


@pytest.fixture(scope="module")
def cluster():
    nodes = [{"num_cpus": 2}, {"num_cpus": 2, "resources": {"agent_node": 1}}, {"num_cpus": 2}]
    with loopback_cluster(*nodes) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def fleet(cluster):
    fleet = make_fleet(parse(fleet_config(cluster.address)))
    assert isinstance(fleet, RayFleet)
    fleet.start(timeout_s=WAIT_S)
    try:
        yield fleet
    finally:
        actor_pids = [replica.actor_pid for replica in fleet._all()]
        fleet.shutdown()
        assert_nothing_left(fleet, actor_pids)


def assert_nothing_left(fleet: RayFleet, actor_pids: list[int]) -> None:
    """No server process, no replica actor, no reserved resource outlives the fleet."""
    import ray

    deadline = time.monotonic() + WAIT_S
    parents = {f"--parent-pid {pid} " for pid in actor_pids}  # a replica's server names its actor's pid
    while True:
        servers = [p.pid for p in psutil.process_iter(["cmdline"])
                   if "gymfleet.fleet.launch" in (line := " ".join(p.info["cmdline"] or []) + " ")
                   and any(parent in line for parent in parents)]
        actors = [pid for pid in actor_pids if _running(pid)]
        reserved = {key: value for key, value in ray.cluster_resources().items()
                    if ray.available_resources().get(key) != value and not key.startswith("object_store")}
        if not servers and not actors and not reserved:
            return
        assert time.monotonic() < deadline, f"left: servers {servers}, actors {actors}, reserved {reserved}"
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def head(fleet: RayFleet) -> str:
    return f"http://127.0.0.1:{fleet.config.head_port}"


def instances(fleet: RayFleet) -> dict[str, dict]:
    return {row["process_name"]: row for row in httpx.get(head(fleet) + "/server_instances", timeout=10,
                                                          headers=fleet_headers(fleet)).json()}


def published(fleet: RayFleet) -> dict:
    return yaml.safe_load(httpx.get(head(fleet) + "/global_config_dict_yaml", timeout=10,
                                    headers=fleet_headers(fleet)).json())


def served(url: str, route: str = "/verify") -> int:
    """Requests to `route` a replica answered 200 (its own `/metrics`)."""
    text = httpx.get(url + "/metrics", timeout=10, headers=fleet_headers()).text
    pattern = r'gymfleet_requests_total\{[^}]*route="' + route + r'"[^}]*status="200"[^}]*\} ([0-9.e+]+)'
    return int(sum(float(value) for value in re.findall(pattern, text)))


def rows(n: int) -> list[dict]:
    return [{**ROWS[i % len(ROWS)], "agent_ref": {"type": "responses_api_agents", "name": AGENT}} for i in range(n)]


async def collect(fleet: RayFleet, examples: list[dict]) -> list[tuple[dict | None, BaseException | None]]:
    """Every row's `(result, None)` or `(None, error)`, each awaited with a bound that catches a hang."""
    helper = RolloutCollectionHelper(request_timeout_s=WAIT_S)
    outcomes = []
    for future in helper.run_examples(examples, {"host": "127.0.0.1", "port": fleet.config.head_port}):
        try:
            _, result = await asyncio.wait_for(future, WAIT_S)
            outcomes.append((result, None))
        except TransportError as exc:
            outcomes.append((None, exc))
    await http.close()
    return outcomes


# ---------------------------------------------------------------------------------------------- placement


def test_placement_honours_resources_and_spreads_replicas(fleet, cluster):
    import ray

    nodes = {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}
    table = fleet.replica_table()
    agent_node = table[AGENT][0]["node"]
    assert nodes[agent_node].get("agent_node") == 1, "the agent asked for agent_node: only that node has it"
    env_nodes = [replica["node"] for replica in table[ENV]]
    assert len(env_nodes) == 2 and len(set(env_nodes)) == 2, "two replicas on two nodes when the cluster has room"
    assert all(replica["status"] == "running" and replica["restarts"] == 0 for replica in table[ENV])


def test_head_publishes_real_addresses(fleet):
    rows_ = instances(fleet)
    config = published(fleet)
    replicas = rows_[ENV]["replicas"]
    assert len(replicas) == 2
    fields = config[ENV]["resources_servers"][ENV]
    assert fields["replicas"] == [{"host": r["host"], "port": r["port"]} for r in replicas]
    assert (fields["host"], fields["port"]) == (replicas[0]["host"], replicas[0]["port"]), "first replica for NeMo-Gym"
    for replica in replicas:
        url = f"http://{replica['host']}:{replica['port']}"
        assert httpx.get(url + "/", timeout=10).json() == {"status": "ok"}, f"replica {url} answers directly"
        assert replica["host"] == "127.0.0.1", "the address of its node, on loopback here (never 0.0.0.0)"
    model = config["policy_model"]["responses_api_models"]["vllm_model"]
    llm = config["scripted_llm"]["responses_api_models"]["scripted_model"]
    assert model["base_url"] == f"http://{llm['host']}:{llm['port']}/v1", "URLs naming a server follow it"
    agent_env = config[f"{AGENT}_environment_server"]["environment_servers"]["legacy_agent"]
    agent = config[AGENT]["responses_api_agents"]["simple_agent"]
    assert (agent_env["host"], agent_env["port"]) == (agent["host"], agent["port"])


def test_replicas_keep_no_secret_or_token_in_their_environment(fleet):
    """Each replica's server (and its actor) got the policy's key and the fleet token as call arguments and an
    inherited memory file: `/proc/<pid>/environ` holds neither, yet the replica requires the token."""
    replicas = list(fleet._all())
    assert replicas
    for replica in replicas:
        for pid in (replica.pid, replica.actor_pid):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert fleet.token.encode() not in environ, f"{replica.label} (pid {pid})"
            assert CANARY_KEY.encode() not in environ, f"{replica.label} (pid {pid})"
        assert httpx.get(replica.url + "/metrics", timeout=10).status_code == 401, replica.label


def test_nothing_listens_on_or_is_called_at_a_non_loopback_address(fleet, cluster):
    """The cluster's nodes are on 127.0.0.1: the published addresses (replica table, config), every node Ray knows,
    and every TCP socket of this test's processes (Ray's GCS, raylets, workers and agents, the replica actors and
    their servers, the head server in this process) are on loopback, listening and connected alike."""
    import ray

    assert not off_loopback_hosts(instances(fleet)), instances(fleet)
    assert not off_loopback_hosts(published(fleet))
    assert all(on_loopback(node["NodeManagerAddress"]) for node in ray.nodes()), ray.nodes()
    assert on_loopback(cluster.address.rsplit(":", 1)[0]) and on_loopback(fleet.config.head_host)
    asyncio.run(collect(fleet, rows(4)))  # connections in use, not only listeners
    pids = tree_pids()
    servers = {replica.pid for replica in fleet._all()}
    assert servers <= pids, "the replicas' servers are descendants of this test (so their sockets are checked)"
    assert not off_loopback(pids)


def test_ng_status_lists_every_replica(fleet):
    # a model server says "waiting for upstream" until its probe of it answers: asked again until all are live
    report = json.loads(ng_status_all_live(fleet.config.head_port, "+json=true").stdout)
    by_name = {item["process_name"]: item for item in report["instances"]}
    assert [replica["live"] for replica in by_name[ENV]["replicas"]] == [True, True]
    port = f"+head_server.port={fleet.config.head_port}"
    table = subprocess.run([sys.executable, "-m", "gymfleet.cli.status", port], capture_output=True, text=True,
                           timeout=60, cwd=ROOT).stdout
    assert f"{ENV}#0" in table and f"{ENV}#1" in table and "NODE" in table.splitlines()[0]


# ---------------------------------------------------------------------------------------------- rollouts


def test_rollouts_spread_over_replicas_and_stick_to_one(fleet):
    urls = [f"http://{r['host']}:{r['port']}" for r in instances(fleet)[ENV]["replicas"]]
    before = [served(url) for url in urls]
    outcomes = asyncio.run(collect(fleet, rows(24)))
    errors = [error for _, error in outcomes if error is not None]
    assert not errors, errors[:3]
    rewards = [result["reward"] for result, _ in outcomes]
    assert rewards == [1.0] * 24, [r["reason"] for r, _ in outcomes if r["reward"] != 1.0][:3]  # session found
    per_replica = [served(url) - was for url, was in zip(urls, before, strict=True)]
    assert sum(per_replica) == 24 and min(per_replica) > 0, f"per replica: {per_replica}"


def test_killed_replica_fails_its_rollouts_typed_and_comes_back(fleet):
    victim = instances(fleet)[ENV]["replicas"][1]
    url = f"http://{victim['host']}:{victim['port']}"

    async def scenario():
        task = asyncio.ensure_future(collect(fleet, rows(40)))
        # Kill once rollouts hold sessions on the victim: seeded, not verified yet (each model turn takes 0.3 s).
        while await asyncio.to_thread(served, url, "/seed_session") - await asyncio.to_thread(served, url) < 2:
            assert not task.done(), "the collection ended before any rollout was in flight on the victim"
            await asyncio.sleep(0.02)
        os.kill(victim["pid"], signal.SIGKILL)
        return await task

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == 40, "none lost"
    failures = [error for _, error in outcomes if error is not None]
    results = [result for result, _ in outcomes if result is not None]
    assert failures, "rollouts in flight on the killed replica fail"
    for error in failures:
        assert json.loads(error.response_content)["error_type"] == "connection_error", error
    assert all(result["reward"] == 1.0 for result in results), "no silent zero from a lost session"

    deadline = time.monotonic() + WAIT_S
    while (row := instances(fleet)[ENV])["replicas"][1]["status"] != "running" or row["restarts"] != 1:
        assert time.monotonic() < deadline, f"replica never came back: {row}"
        time.sleep(0.2)
    assert row["replicas"][1]["pid"] != victim["pid"]
    assert re.search(rf'gymfleet_server_restarts_total\{{instance="{ENV}"\}} 1', httpx.get(head(fleet) + "/metrics",
                                                                                           headers=fleet_headers(fleet))
                     .text)
    later = asyncio.run(collect(fleet, rows(12)))
    assert [result["reward"] for result, _ in later if result] == [1.0] * 12, later


def test_a_killed_actor_is_replaced_on_its_node_and_port(fleet):
    import ray

    before = fleet.replica_table()["scripted_llm"][0]
    ray.kill(fleet.replicas["scripted_llm"][0].actor, no_restart=True)  # its server dies with it (parent watchdog)
    deadline = time.monotonic() + WAIT_S
    while (row := instances(fleet)["scripted_llm"])["replicas"][0]["restarts"] != 1 or row["status"] != "running":
        assert time.monotonic() < deadline, f"the replica never came back: {row}"
        time.sleep(0.2)
    after = row["replicas"][0]
    assert (after["node"], after["host"], after["port"]) == (before["node"], before["host"], before["port"]), (
        "same node and port: policy_model's base_url, which names it, stays valid")
    assert after["pid"] != before["pid"] and not _running(before["pid"]), "the old server died with its actor"
    later = asyncio.run(collect(fleet, rows(6)))
    assert [result["reward"] for result, _ in later if result] == [1.0] * 6, later


# ---------------------------------------------------------------------------------------------- config


def test_memory_sizes_and_bad_resources_are_named(cluster):
    assert memory_bytes("2GiB", "x") == 2 * 2**30 and memory_bytes("4GB", "x") == 4 * 10**9
    with pytest.raises(ConfigError, match=r"ray_resources\.memory: expected bytes or a size"):
        RayFleet(parse(fleet_config(cluster.address, **{ENV: {"resources_servers": {ENV: {
            "ray_resources": {"memory": "lots"}}}}}))).validate()
    with pytest.raises(ConfigError, match=r"ray_resources\.num_gpu"):
        RayFleet(parse(fleet_config(cluster.address, **{ENV: {"resources_servers": {ENV: {
            "ray_resources": {"num_gpu": 1}}}}}))).validate()


def test_placement_ray_without_a_cluster_is_a_config_error(monkeypatch):
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=r"no Ray cluster answers at ray_head_node_address") as info:
        make_fleet(parse(fleet_config(dead, placement="ray"))).start(timeout_s=30)
    assert info.value.path == "ray_head_node_address"
    monkeypatch.setitem(sys.modules, "ray", None)  # the package missing
    with pytest.raises(ConfigError, match=r"placement: ray needs the ray package"):
        make_fleet(parse(fleet_config(None, placement="ray")))


def test_unknown_placement_and_replicas_without_ray_are_named():
    with pytest.raises(ConfigError, match=r"placement: unknown value 'rya'.*Did you mean 'ray'"):
        parse(fleet_config(None, placement="rya"))
    with pytest.raises(ConfigError, match=r"example_weather\.resources_servers\.example_weather\.num_replicas: 2 "
                                          r"replicas need Ray placement"):
        make_fleet(parse(fleet_config(None)))


def test_a_config_without_ray_keys_is_placed_as_before():
    """Ray installed, no Ray key: the same local `Fleet` as before (the fleet tests start it)."""
    assert importlib.util.find_spec("ray") is not None
    config = parse(fleet_config(None, **{ENV: {"resources_servers": {ENV: {"num_replicas": 1}}}}))
    assert placement_of(config) == "local"
    assert type(make_fleet(config)) is Fleet
    assert type(make_fleet(parse(fleet_config(None, placement="local", **{ENV: {"resources_servers": {ENV: {
        "num_replicas": 1}}}})))) is Fleet


def test_no_room_on_the_cluster_falls_back_to_this_machine_only_when_ray_was_implied(cluster, monkeypatch, caplog):
    """NeMo-RL's address implies Ray placement; a cluster with no room for a server must not stop a training job
    that ran under NeMo-Gym (which never placed servers on Ray): one warning, and the fleet runs here. Under an
    explicit `placement: ray` the same is a `NoRoomError` naming the instance's `ray_resources`."""
    from gymfleet.fleet import ray_placement, ray_startup

    monkeypatch.setattr(ray_startup, "PLACEMENT_TIMEOUT_S", 2.0)
    nowhere = {ENV: {"resources_servers": {ENV: {"num_replicas": 1,
                                                 "ray_resources": {"num_cpus": 1, "resources": {"nowhere": 1}}}}}}
    with pytest.raises(ray_placement.NoRoomError, match=r"example_weather\.ray_resources: the Ray cluster has no"):
        ray_placement.start_fleet(parse(fleet_config(cluster.address, placement="ray", **nowhere)), timeout_s=WAIT_S)

    fleet = ray_placement.start_fleet(parse(fleet_config(cluster.address, **nowhere)), timeout_s=WAIT_S)
    try:
        assert type(fleet) is Fleet, "ran on this machine"
        assert "every server runs on this machine instead" in caplog.text
        url = f"http://127.0.0.1:{fleet.config.head_port}/server_instances"
        assert {entry["process_name"] for entry in httpx.get(url, timeout=10,
                                                             headers=fleet_headers(fleet)).json()} >= {ENV, AGENT}
    finally:
        fleet.shutdown()


# ---------------------------------------------------------------------------------------------- the user's path


def test_ng_run_attaches_to_a_two_node_loopback_cluster_and_serves_a_rollout():
    """The issue's path: a 2-node `Cluster` whose nodes are on 127.0.0.1, then `ng_run` on the quickstart config
    with `+ray_head_node_address=<its 127.0.0.1 address>`: the fleet comes up on that cluster (Ray would otherwise
    look for it at this machine's interface address) and serves a rollout, all on loopback."""
    with loopback_cluster({"num_cpus": 2}, {"num_cpus": 2}, connect=False) as own:
        assert own.address.startswith("127.0.0.1:"), own.address
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "gymfleet.cli.run", "+config_paths=[configs/quickstart.yaml]",
             f"+ray_head_node_address={own.address}", f"+head_server.port={port}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            for line in process.stdout:
                lines.append(line)
                if "servers ready" in line:
                    break
            text = "".join(lines)
            assert "replicas of 4 servers ready on the Ray cluster" in text, text
            row = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])
            row["agent_ref"] = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}

            async def one():
                helper = RolloutCollectionHelper(request_timeout_s=WAIT_S)
                [future] = helper.run_examples([row], {"host": "127.0.0.1", "port": port})
                _, result = await asyncio.wait_for(future, WAIT_S)
                await http.close()
                return result

            result = asyncio.run(one())
            assert result["reward"] == 1.0, result
            token = fleet_headers(port)  # the token file ng_run wrote for its head address
            assert httpx.get(f"http://127.0.0.1:{port}/server_instances", timeout=10).status_code == 401
            table = httpx.get(f"http://127.0.0.1:{port}/server_instances", timeout=10, headers=token).json()
            assert len(table) == 4 and not off_loopback_hosts(table), table
            config = yaml.safe_load(httpx.get(f"http://127.0.0.1:{port}/global_config_dict_yaml", timeout=10,
                                              headers=token).json())
            assert not off_loopback_hosts(config)
            assert not off_loopback(tree_pids()), "ng_run, its replicas and both clusters stay on loopback"
        finally:
            process.send_signal(signal.SIGINT)  # ng_run stops its replicas on the cluster
            try:
                process.wait(WAIT_S)
            finally:
                process.kill()
                process.stdout.close()
