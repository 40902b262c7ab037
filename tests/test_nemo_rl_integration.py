"""NeMo-RL's own use of Gym, replayed: its imports, its start-up (`spec/protocol.md` §6.2), its rows and its checks.

Two scripted upstreams stand in for two vLLM data-parallel ranks. Each answers the weather task in two turns (a
`get_weather` call, then an answer naming the forecast's condition) and tags its text `[A]` or `[B]`, so every
rollout shows which upstream served each of its turns. What NeMo-RL's post-processing asserts (§6.3.3) is checked
on every result.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import logging
import pkgutil
import re
import sys
import types
from collections import Counter
from pathlib import Path

import psutil
import pytest
from omegaconf import DictConfig

from gymfleet.errors import ConfigError, TransportError
from gymfleet.fleet.config import client_limits
from gymfleet.fleet.config_instances import repository_root
from gymfleet.http import ClientLimits
from gymfleet.testing import free_port, processes_gone, serve, wait_until
from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig
from resources_servers.example_weather.app import FORECASTS
from responses_api_models.scripted_model.app import ScriptedModel

ROOT = repository_root()
EXAMPLE = ROOT / "resources_servers/example_weather/data/example.jsonl"
AGENT = "example_weather_simple_agent"
CONFIG_PATHS = ["responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
                "resources_servers/example_weather/configs/example_weather.yaml"]
GENERATIONS, TEMPERATURE, TOP_P, MAX_NEW_TOKENS = 6, 0.7, 0.95, 512
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def scripted_app(tag: str, faults: list[dict] | None = None):
    """A scripted upstream: look the weather up, then report the condition; every text is tagged `[tag]`.
    `faults` are rules checked first."""
    answers = [{"match": rf'"condition":\s*"{condition}"', "match_in": "last_message",
                "text": f"The forecast says {condition}. [{tag}]"} for condition in {c for c, _ in FORECASTS.values()}]
    calls = [{"match": rf"(?i)\b{city}\b", "match_in": "transcript", "text": f"Let me look that up. [{tag}]",
              "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    model = ScriptedModel({"name": f"upstream_{tag}", "rules": [*(faults or []), *answers, *calls]})
    return Recorder(model.create_app())


class Recorder:
    """ASGI wrapper that keeps every request's path and body."""

    def __init__(self, app):
        self.app, self.requests = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks = []

        async def recording_receive():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.requests.append((scope["path"], b"".join(chunks)))
            return message

        await self.app(scope, recording_receive, send)

    def chats(self, containing: str = "") -> list[dict]:
        """Bodies of the `/v1/chat/completions` requests received (those whose text holds `containing`)."""
        return [json.loads(body) for path, body in self.requests
                if path == "/v1/chat/completions" and containing in body.decode()]


def nemo_rl_config(urls: list[str], tmp: Path, **extra) -> GlobalConfigDictParserConfig:
    """What NeMo-RL's Gym actor builds (§6.2), with the scripted upstreams as its vLLM ranks; `extra` keys set to
    None are left out."""
    d = {"config_paths": CONFIG_PATHS, "policy_base_url": [url + "/v1" for url in urls],
         "policy_api_key": "dummy_key", "policy_model_name": "scripted", "default_host": "127.0.0.1",
         "port_range_low": 5000, "port_range_high": 5999,
         HEAD_SERVER_KEY_NAME: {"host": "0.0.0.0", "port": free_port()},
         "global_aiohttp_connector_limit_per_host": 16384, "global_aiohttp_connector_limit": 65536,
         "num_gpu_nodes": 0, "uv_venv_dir": str(tmp), "skip_venv_if_present": True, **extra}
    d = {key: value for key, value in d.items() if value is not None}
    return GlobalConfigDictParserConfig(dotenv_path=tmp / "nemo_gym_env.yaml",
                                        initial_global_config_dict=DictConfig(d), skip_load_from_cli=True)


def prepare_rows() -> list[dict]:
    """Like NeMo-RL's `_prepare_nemo_gym_rows`: contiguous groups of repeated rows, sampling params stamped."""
    tasks = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    rows = []
    for task_index, task in enumerate(tasks):
        for _ in range(GENERATIONS):
            row = copy.deepcopy(task)
            params = row["responses_create_params"]
            params.update(temperature=TEMPERATURE, top_p=TOP_P,
                          max_output_tokens=min(params.get("max_output_tokens") or MAX_NEW_TOKENS, MAX_NEW_TOKENS))
            row.update(_rowidx=len(rows), _ng_task_index=task_index,
                       agent_ref={"type": "responses_api_agents", "name": AGENT})
            rows.append(row)
    return rows


@contextlib.contextmanager
def running_fleet(urls: list[str], tmp: Path, **extra):
    """NeMo-RL's start-up over upstreams at `urls`; shut down on exit."""
    rh = RunHelper()
    rh.start(global_config_dict_parser_config=nemo_rl_config(urls, tmp, **extra))
    try:
        yield rh
    finally:
        rh.shutdown()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    upstreams = {"A": scripted_app("A"), "B": scripted_app("B")}
    with serve(upstreams["A"]) as url_a, serve(upstreams["B"]) as url_b:
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        with running_fleet([url_a, url_b], tmp_path_factory.mktemp("rl")) as rh:
            yield rh, upstreams, before


def head_of(rh: RunHelper) -> BaseServerConfig:
    return BaseServerConfig(host="127.0.0.1", port=rh.config.head_port)


def check_like_nemo_rl(result: dict) -> str:
    """NeMo-RL's post-processing checks on one result; returns the upstream tag that served the rollout."""
    assert isinstance(result["reward"], float)
    seen: list[int] = []
    trainable = 0
    for item in result["response"]["output"]:
        if not item.get("generation_token_ids"):
            continue
        trainable += 1
        assert len(item["generation_token_ids"]) == len(item["generation_log_probs"])
        assert item["prompt_token_ids"][: len(seen)] == seen, "prompt must extend every token seen so far"
        seen = item["prompt_token_ids"] + item["generation_token_ids"]
    assert trainable == 2, "two model calls, both trainable"
    texts = [part["text"] for item in result["response"]["output"] if item["type"] == "message"
             for part in item["content"]]
    tags = {tag for text in texts for tag in re.findall(r"\[([AB])\]", text)}
    assert len(tags) == 1, f"one rollout, one upstream; got {tags}"
    return tags.pop()


async def test_nemo_rl_rollouts_complete_with_training_data(fleet):
    rh, upstreams, _ = fleet
    rows = prepare_rows()
    done, served = {}, Counter()
    for future in RolloutCollectionHelper().run_examples(examples=rows, head_server_config=head_of(rh)):
        row, result = await future
        assert row is rows[row["_rowidx"]] and row["_rowidx"] not in done
        done[row["_rowidx"]] = result
        served[check_like_nemo_rl(result)] += 1
        assert result["reward"] == 1.0 and result["tool_calls_made"] == 1
        assert result["_ng_task_index"] == row["_ng_task_index"], "row fields echoed"
    assert sorted(done) == list(range(len(rows)))
    assert served["A"] > 0 and served["B"] > 0, f"both upstream ranks used: {served}"
    first_turns = {_token_key(trainable_items(result)[0]) for result in done.values()}
    for tag, app in upstreams.items():
        chats = app.chats()
        assert len(chats) == 2 * served[tag], "each rollout's two model calls went to its one upstream"
        assert all((c["temperature"], c["top_p"], c["logprobs"]) == (TEMPERATURE, TOP_P, True) for c in chats)
        assert all(c["max_tokens"] == MAX_NEW_TOKENS for c in chats)
        # What RL's vLLM splices the next prompt from: the previous turn's token fields on its assistant message.
        history = [m for c in chats for m in c["messages"] if m["role"] == "assistant"]
        assert len(history) == served[tag], "one assistant message in each rollout's second call"
        assert all(_token_key(message) in first_turns for message in history), "token fields forwarded upstream"
    rh.poll()


def trainable_items(result: dict) -> list[dict]:
    return [item for item in result["response"]["output"] if item.get("generation_token_ids")]


def _token_key(item: dict) -> tuple:
    return tuple(tuple(item[name]) for name in TOKEN_FIELDS)


def test_servers_are_placed_by_default_host_and_port_range(fleet):
    rh, _, _ = fleet
    assert rh.config.head_host == "0.0.0.0"
    for instance in rh.config.instances.values():
        assert instance.host == "127.0.0.1" and 5000 <= instance.port <= 5999, instance.name


async def test_a_rejected_row_raises_with_an_integer_status(fleet):
    rh, _, _ = fleet
    good = prepare_rows()[0]
    bad = {"responses_create_params": {"input": 5}, "agent_ref": good["agent_ref"], "_rowidx": 1}
    outcomes = []
    for future in RolloutCollectionHelper().run_examples(examples=[good, bad], head_server_config=head_of(rh)):
        try:
            outcomes.append((await future)[1]["reward"])
        except TransportError as exc:
            outcomes.append(exc.status)
            assert isinstance(exc.status, int) and b"input" in exc.response_content
    assert sorted(outcomes) == [1.0, 422]


def test_poll_restarts_a_dead_server_and_shutdown_leaves_no_processes(fleet):
    """A dead server is restarted (ARCHITECTURE 5b): `poll()`, NeMo-RL's health check, raises only for one that
    cannot be brought back (tests/test_fleet_restarts.py)."""
    rh, _, before = fleet
    rh.poll()
    everything = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    zygotes = [p for p in everything if "--control-fd" in _cmdline(p)]
    helpers = [p for p in everything if "--helper-of" in _cmdline(p)]  # one, importing beside it, with 2+ CPUs
    started = [p for p in everything if p not in zygotes + helpers]
    assert len(started) == 3, "policy_model, example_weather and the agent run as processes"
    assert len(zygotes) == 1, "forked from one pre-imported parent (gymfleet.fleet.zygote)"
    assert len(helpers) <= 1
    zygotes += helpers
    [victim] = [p for p in started if "example_weather" in p.cmdline()]
    victim.kill()
    victim.wait(5)
    rh.poll()

    def restarted() -> list[psutil.Process]:
        rh.poll()
        return [p for p in psutil.Process().children(recursive=True)
                if p.pid != victim.pid and "example_weather" in _cmdline(p)]

    started += wait_until(restarted, "example_weather was restarted", interval_s=0.1)
    started += zygotes  # shutdown stops the zygote too
    rh.shutdown()
    rh.shutdown()  # idempotent
    wait_until(lambda: processes_gone(started), "the fleet's processes exited after its shutdown")


def _cmdline(process: psutil.Process) -> list[str]:
    """Its command line, or [] for a process that is gone (or a zombie) by now."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


# ---------------------------------------------------------------------------------------------- upstream faults

FAULT_RULES = [
    {"match": "(?i)burst", "status": 429, "retry_after_s": 3600},  # a 429 burst that outlasts the retry bound
    {"match": "(?i)crash", "turn": 1, "status": 500},  # the second model call of the rollout, after a tool call
    {"match": "(?i)hang", "delay_s": 60, "text": "Too late."},
]
ATTEMPTS = 3
FAULT_TOLERANT = {"policy_model": {"responses_api_models": {"vllm_model": {
    "timeout_s": 5, "upstream_max_attempts": ATTEMPTS, "upstream_backoff_s": 0.01, "upstream_max_backoff_s": 0.05}}}}
"""Nested per-instance overrides, as NeMo-RL recipes write them: a short deadline and a small retry bound."""


def fault_rows(marker: str, count: int = 4) -> list[dict]:
    """One group of `count` repeated rows whose user message carries `marker` (and asks about Paris)."""
    rows = [row for row in prepare_rows() if row["expected_city"] == "Paris"][:count]
    for index, row in enumerate(rows):
        row["responses_create_params"]["input"][-1]["content"] = f"{marker}: what's the weather in Paris today?"
        row["_rowidx"] = index
    return rows


async def collect_failures(rows: list[dict], head: BaseServerConfig) -> list[TransportError]:
    """Run `rows` as NeMo-RL does; every one must fail with a `TransportError`."""
    failures = []
    for future in RolloutCollectionHelper().run_examples(examples=rows, head_server_config=head):
        with pytest.raises(TransportError) as info:
            await future
        failures.append(info.value)
    return failures


def error_of(failure: TransportError) -> dict:
    assert failure.status == 502 and isinstance(failure.status, int)
    return json.loads(failure.response_content)


@pytest.fixture(scope="module")
def faulty_fleet(tmp_path_factory):
    upstream = scripted_app("F", faults=FAULT_RULES)
    with serve(upstream) as url, running_fleet([url], tmp_path_factory.mktemp("faults"), **FAULT_TOLERANT) as rh:
        yield rh, upstream


@pytest.mark.parametrize(
    ("marker", "error_type", "status_named", "calls_per_rollout"),
    [("burst", "upstream_error", "answered 429", ATTEMPTS),
     ("crash", "upstream_error", "answered 500", 1 + ATTEMPTS),
     ("hang", "timeout", "within 5s", 1)],
    ids=["429_burst", "500", "hung"],
)
async def test_upstream_faults_end_in_typed_failures(faulty_fleet, marker, error_type, status_named,
                                                     calls_per_rollout):
    rh, upstream = faulty_fleet
    rows = fault_rows(marker)
    failures = await collect_failures(rows, head_of(rh))
    assert len(failures) == len(rows)
    for failure in failures:
        error = error_of(failure)
        assert error["error_type"] == error_type, error
        assert status_named in error["detail"], error["detail"]
    # Bounded: the model server's retries only (a hung call is not sent again); the agent adds none on top.
    assert len(upstream.chats(marker)) == calls_per_rollout * len(rows)
    # The fleet is unharmed: a rollout without a fault still completes.
    [(_, result)] = [await future for future in RolloutCollectionHelper().run_examples(
        examples=prepare_rows()[:1], head_server_config=head_of(rh))]
    assert result["reward"] == 1.0
    rh.poll()


async def test_dead_upstream_ends_in_typed_failures(tmp_path):
    with contextlib.ExitStack() as fleet_running:
        with serve(scripted_app("D")) as url:
            rh = fleet_running.enter_context(running_fleet([url], tmp_path, **FAULT_TOLERANT))
        # The upstream has stopped (a vLLM rank died mid-training); the fleet runs on.
        rows = fault_rows("dead")
        failures = await collect_failures(rows, head_of(rh))
        assert len(failures) == len(rows)
        for failure in failures:
            error = error_of(failure)
            assert error["error_type"] == "connection_error", error
            assert "cannot reach" in error["detail"] and url in error["detail"], error["detail"]
        rh.poll()


# ---------------------------------------------------------------------------------------------- config semantics


def test_dry_run_validates_everything_and_starts_nothing(tmp_path):
    (tmp_path / "nemo_gym_env.yaml").write_text("policy_model_name: from-env-yaml\npolicy_api_key: env-key\n")
    rh = RunHelper()
    before = psutil.Process().children(recursive=True)
    rh.start(global_config_dict_parser_config=nemo_rl_config(["http://10.0.0.1:1", "http://10.0.0.2:1"], tmp_path,
                                                             dry_run=True, policy_api_key=None))
    # nothing new (an earlier test's process may still be exiting, or be reaped, meanwhile: not this test's business)
    assert not set(psutil.Process().children(recursive=True)) - set(before), "a dry run starts no process"
    model = rh.config.data["policy_model"]["responses_api_models"]["vllm_model"]
    assert model["base_url"] == ["http://10.0.0.1:1/v1", "http://10.0.0.2:1/v1"], "a list flows through ${...}"
    assert model["model"] == "scripted", "initial_global_config_dict wins over env.yaml"
    assert model["api_key"] == "env-key", "env.yaml is read for what the initial dict leaves out"
    rh.poll()
    rh.shutdown()


def test_get_global_config_dict_is_the_started_config(tmp_path):
    rh = RunHelper()
    rh.start(nemo_rl_config(["http://10.0.0.1:1", "http://10.0.0.2:1"], tmp_path, dry_run=True))
    resolved = get_global_config_dict()
    assert isinstance(resolved, DictConfig)
    assert resolved.policy_model.responses_api_models.vllm_model.base_url == ["http://10.0.0.1:1/v1",
                                                                              "http://10.0.0.2:1/v1"]
    kinds = ("responses_api_agents", "responses_api_models", "resources_servers")
    spawned = {name for name, entry in resolved.items()
               if isinstance(entry, DictConfig) and any(kind in entry for kind in kinds)}
    assert spawned == set(rh.config.instances) == {"policy_model", "example_weather", AGENT}


def test_dry_run_still_fails_on_a_bad_server_config(tmp_path):
    typo = {"example_weather": {"resources_servers": {"example_weather": {"domian": "agent"}}}}
    with pytest.raises(ConfigError, match=r"example_weather\.resources_servers\.example_weather\.domian"):
        RunHelper().start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True, **typo))


def test_ray_address_without_ray_is_logged_and_served_locally(tmp_path, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the package were not installed
    rh = RunHelper()
    with caplog.at_level(logging.WARNING):
        rh.start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True, ray_head_node_address="10.0.0.1:6379"))
    assert "Ray is not installed" in caplog.text
    assert sum("Ray is not installed" in record.getMessage() for record in caplog.records) == 1, "one warning"


class RayStandIn(types.ModuleType):
    """Stands in for the `ray` package: records what RunHelper asks of it (the real one is tested against a real
    cluster in tests/test_ray_placement.py)."""

    def __init__(self, fail: Exception | None = None):
        super().__init__("ray")
        self.calls: list[tuple[tuple, dict]] = []
        self.fail = fail

    def init(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.fail is not None:
            raise self.fail

    def is_initialized(self) -> bool:
        return False


@contextlib.contextmanager
def listening() -> str:
    """A `127.0.0.1:<port>` something listens at (where a Ray head would)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("with_address", [True, False], ids=["attach", "no_address"])
def test_ray_head_node_address_attaches_and_never_starts_a_cluster(tmp_path, monkeypatch, with_address):
    ray = RayStandIn()
    monkeypatch.setitem(sys.modules, "ray", ray)
    with listening() as address:
        address = address if with_address else None
        RunHelper().start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True,
                                         ray_head_node_address=address))
    if address is None:
        assert ray.calls == [], "no address: Ray is left alone (never a cluster of our own)"
    else:
        pinned = {"_node_ip_address": "127.0.0.1"}  # attach as a node on the cluster's loopback address
        assert ray.calls == [((), {"address": address, **pinned, "ignore_reinit_error": True})], "tolerate a live one"


@pytest.mark.parametrize(("address", "node_ip"), [
    ("10.0.0.1:6379", None), ("head.cluster:6379", None), ("[fd00::5]:6379", None), ("ray://10.0.0.1:10001", None),
    ("127.0.0.1:6379", "127.0.0.1"), ("127.0.0.2:6379", "127.0.0.2"), ("localhost:6379", "127.0.0.1"),
    ("ray://127.0.0.1:10001", None)])
def test_a_real_cluster_is_attached_as_before_and_a_loopback_one_on_loopback(monkeypatch, address, node_ip):
    """The cluster's address chooses: any non-loopback one (a real multi-node cluster) is `ray.init(address)` as it
    always was; a loopback one also names the node address to attach as (`_node_ip_address`)."""
    from gymfleet.fleet.ray_cluster import connect_ray

    ray = RayStandIn()
    connect_ray(ray, address)
    pinned = {"_node_ip_address": node_ip} if node_ip else {}
    assert ray.calls == [((), {"address": address, **pinned, "ignore_reinit_error": True})]


def test_ray_address_that_cannot_be_attached_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", RayStandIn(fail=ConnectionError("could not find any running Ray")))
    with listening() as address, pytest.raises(ConfigError, match=rf"ray_head_node_address='{address}'.*could not find"
                                               ) as info:
        RunHelper().start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True,
                                         ray_head_node_address=address))
    assert info.value.path == "ray_head_node_address"
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=rf"no Ray cluster answers at ray_head_node_address='{dead}'") as info:
        RunHelper().start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True, ray_head_node_address=dead))
    assert info.value.path == "ray_head_node_address"


def test_aiohttp_limits_come_from_the_config_split_between_workers():
    limits = {"global_aiohttp_connector_limit": 65536, "global_aiohttp_connector_limit_per_host": 16384}
    assert client_limits(limits) == ClientLimits(limit=65536, limit_per_host=16384)
    assert client_limits(limits, workers=16) == ClientLimits(limit=4096, limit_per_host=1024)
    assert client_limits({}) == ClientLimits()


NEMO_GYM_MODULES = [
    "cli", "rollout_collection", "server_utils", "config_types", "global_config",  # what NeMo-RL imports
    "base_resources_server", "openai_utils", "judge", "reward_profile", "prompt",  # what environment folders import
    "episode_types", "verifier_fixture", "mcp_auto_exposure", "task_materialization", "rollout_observability",
    "sandbox.access", "base_environment_server", "path_utils", "deliverables",
]
GYMFLEET_SOURCES = (
    "fleet.config", "fleet.config_instances", "rollouts.collect_inputs", "rollouts.rollout_helper", "fleet.run_helper",
    "rollouts.nemo_gym_collect", "rollouts.nemo_gym_aggregate", "rollouts.nemo_gym_sidecars",
    "serving.server", "errors", "testing.verifier_fixture",
    # every serving.nemo_gym_* module: NeMo-Gym's surface, written in gymfleet
    *sorted(f"serving.{m.name}" for m in pkgutil.iter_modules([str(Path(repository_root()) / "gymfleet" / "serving")])
            if m.name.startswith("nemo_gym_")),
)


@pytest.mark.parametrize("module", NEMO_GYM_MODULES)
def test_nemo_gym_modules_only_re_export_gymfleet(module):
    exported = importlib.import_module(f"nemo_gym.{module}")
    sources = [importlib.import_module(f"gymfleet.{name}") for name in GYMFLEET_SOURCES]
    for name in exported.__all__:
        assert any(getattr(source, name, None) is getattr(exported, name) for source in sources), name
