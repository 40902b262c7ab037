"""NeMo-RL's own use of Gym, replayed: its imports, its start-up (`spec/protocol.md` §6.2), its rows and its checks.

Two scripted upstreams stand in for two vLLM data-parallel ranks. Each answers the weather task in two turns (a
`get_weather` call, then an answer naming the forecast's condition) and tags its text `[A]` or `[B]`, so every
rollout shows which upstream served each of its turns. What NeMo-RL's post-processing asserts (§6.3.3) is checked
on every result.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import re
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from omegaconf import DictConfig

from gymfleet.config import client_limits, repository_root
from gymfleet.errors import ConfigError, TransportError
from gymfleet.http import ClientLimits
from gymfleet.testing import free_port, serve
from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
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


def scripted_app(tag: str):
    """A scripted upstream: look the weather up, then report the condition; every text is tagged `[tag]`."""
    answers = [{"match": rf'"condition":\s*"{condition}"', "on": "last_message",
                "text": f"The forecast says {condition}. [{tag}]"} for condition in {c for c, _ in FORECASTS.values()}]
    calls = [{"match": rf"(?i)\b{city}\b", "on": "transcript", "text": f"Let me look that up. [{tag}]",
              "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    model = ScriptedModel({"name": f"upstream_{tag}", "rules": answers + calls})
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


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    upstreams = {"A": scripted_app("A"), "B": scripted_app("B")}
    with serve(upstreams["A"]) as url_a, serve(upstreams["B"]) as url_b:
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        rh = RunHelper()
        rh.start(global_config_dict_parser_config=nemo_rl_config([url_a, url_b], tmp_path_factory.mktemp("rl")))
        try:
            yield rh, upstreams, before
        finally:
            rh.shutdown()


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
    for tag, app in upstreams.items():
        chats = [json.loads(body) for path, body in app.requests if path == "/v1/chat/completions"]
        assert len(chats) == 2 * served[tag], "each rollout's two model calls went to its one upstream"
        assert all((c["temperature"], c["top_p"], c["logprobs"]) == (TEMPERATURE, TOP_P, True) for c in chats)
        assert all(c["max_tokens"] == MAX_NEW_TOKENS for c in chats)
    rh.poll()


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


def test_poll_reports_a_dead_server_and_shutdown_leaves_no_processes(fleet):
    rh, _, before = fleet
    rh.poll()
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert len(started) == 3, "policy_model, example_weather and the agent run as processes"
    [victim] = [p for p in started if "example_weather" in p.cmdline()]
    victim.kill()
    victim.wait(5)
    with pytest.raises(RuntimeError, match="'example_weather' exited unexpectedly"):
        rh.poll()
    rh.shutdown()
    rh.shutdown()  # idempotent
    time.sleep(0.2)
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


# ---------------------------------------------------------------------------------------------- config semantics


def test_dry_run_validates_everything_and_starts_nothing(tmp_path):
    (tmp_path / "nemo_gym_env.yaml").write_text("policy_model_name: from-env-yaml\npolicy_api_key: env-key\n")
    rh = RunHelper()
    before = psutil.Process().children(recursive=True)
    rh.start(global_config_dict_parser_config=nemo_rl_config(["http://10.0.0.1:1", "http://10.0.0.2:1"], tmp_path,
                                                             dry_run=True, policy_api_key=None))
    assert psutil.Process().children(recursive=True) == before
    model = rh.config.data["policy_model"]["responses_api_models"]["vllm_model"]
    assert model["base_url"] == ["http://10.0.0.1:1/v1", "http://10.0.0.2:1/v1"], "a list flows through ${...}"
    assert model["model"] == "scripted", "initial_global_config_dict wins over env.yaml"
    assert model["api_key"] == "env-key", "env.yaml is read for what the initial dict leaves out"
    rh.poll()
    rh.shutdown()


def test_dry_run_still_fails_on_a_bad_server_config(tmp_path):
    typo = {"example_weather": {"resources_servers": {"example_weather": {"domian": "agent"}}}}
    with pytest.raises(ConfigError, match=r"example_weather\.resources_servers\.example_weather\.domian"):
        RunHelper().start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True, **typo))


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed: ray.init would attach")
def test_ray_address_without_ray_is_logged_and_ignored(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="gymfleet.run_helper"):
        RunHelper().start(nemo_rl_config(["http://127.0.0.1:1"], tmp_path, dry_run=True,
                                         ray_head_node_address="10.0.0.1:6379"))
    assert "Ray is not installed" in caplog.text


def test_aiohttp_limits_come_from_the_config_split_between_workers():
    limits = {"global_aiohttp_connector_limit": 65536, "global_aiohttp_connector_limit_per_host": 16384}
    assert client_limits(limits) == ClientLimits(limit=65536, limit_per_host=16384)
    assert client_limits(limits, workers=16) == ClientLimits(limit=4096, limit_per_host=1024)
    assert client_limits({}) == ClientLimits()


@pytest.mark.parametrize("module", ["cli", "rollout_collection", "server_utils", "config_types", "global_config"])
def test_nemo_gym_modules_only_re_export_gymfleet(module):
    exported = importlib.import_module(f"nemo_gym.{module}")
    sources = [importlib.import_module(f"gymfleet.{name}")
               for name in ("config", "collect", "rollout_helper", "run_helper", "server", "errors")]
    for name in exported.__all__:
        assert any(getattr(source, name, None) is getattr(exported, name) for source in sources), name
