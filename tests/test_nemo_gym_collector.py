"""NeMo-Gym 0.7.0's rollout collector on gymfleet (`nemo_gym.rollout_collection`'s `run_from_config`) and the
`rollout_collection_driver` hook of `ng_collect_rollouts`, against a real fleet (the quickstart: scripted model +
mcqa + simple_agent)."""

import json
import textwrap
import urllib.request
from pathlib import Path

import aiohttp
import pytest

import nemo_gym.rollout_collection as collection
from gymfleet import http
from gymfleet.cli.collect import main as collect_main
from gymfleet.errors import ConfigError
from gymfleet.fleet.config_instances import repository_root
from gymfleet.rollouts.nemo_gym_driver import load_driver
from gymfleet.rollouts.nemo_gym_rows import preprocess_raw_rows
from gymfleet.testing import fleet_headers, running_fleet

QUICKSTART, AGENT = repository_root() / "configs/quickstart.yaml", "mcqa_simple_agent"
EXAMPLE = QUICKSTART.parents[1] / "resources_servers/mcqa/data/example.jsonl"
EXPECTED_REWARD = dict(enumerate((1.0, 0.0, 1.0, 0.0, 1.0)))
"""The quickstart's scripted model answers tasks 0, 2 and 4 of the example right, 1 and 3 wrong."""


@pytest.fixture(scope="module")
def fleet():
    """One quickstart fleet for the module's tests."""
    with running_fleet([str(QUICKSTART)]) as running:
        yield running


@pytest.fixture
async def on_fleet(fleet, monkeypatch, tmp_path):
    """The collector reaches the test fleet's head server (as `ng_collect_rollouts +head_server=...` does)."""
    head = {"host": "127.0.0.1", "port": fleet.config.head_port}
    real = collection.setup_server_client_utils
    monkeypatch.setattr(collection, "setup_server_client_utils", lambda config=None: real(config or head))
    monkeypatch.chdir(tmp_path)
    yield fleet
    await http.close()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def runs_of(fleet) -> float:
    """How many POST requests the agent has handled, from its `/metrics`."""
    request = urllib.request.Request(fleet.config.instance(AGENT).url + "/metrics", headers=fleet_headers(fleet))
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gymfleet_requests_total{") and 'method="POST"' in line and "/run" in line)


def config(tmp_path: Path, **fields) -> collection.RolloutCollectionConfig:
    fields = {"agent_name": AGENT, "disable_health_check": True, **fields}
    return collection.RolloutCollectionConfig(input_jsonl_fpath=str(fields.pop("input", EXAMPLE)),
                                              output_jsonl_fpath=str(tmp_path / "out/rollouts.jsonl"), **fields)


async def test_run_from_config_writes_the_files_and_rows_0_7_0_writes_and_a_resume_sends_nothing(on_fleet, tmp_path):
    results = await collection.RolloutCollectionHelper().run_from_config(config(tmp_path, num_repeats=2,
                                                                                num_samples_in_parallel=3))

    out = tmp_path / "out"
    rows = lines(out / "rollouts.jsonl")
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(t, k) for t in range(5)
                                                                                   for k in range(2)]
    assert all(r["agent_ref"] == {"name": AGENT} and r["reward"] == EXPECTED_REWARD[r["_ng_task_index"]]
               for r in rows)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in results] == [(t, k) for t in range(5)
                                                                                for k in range(2)]
    materialized = lines(out / "rollouts_materialized_inputs.jsonl")
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in materialized] == [(t, k) for t in range(5)
                                                                                     for k in range(2)]
    assert "response" not in materialized[0] and materialized[0]["agent_ref"] == {"name": AGENT}
    assert (out / "rollouts_failures.jsonl").read_text() == ""
    [metrics] = json.loads((out / "rollouts_aggregate_metrics.json").read_text())
    assert metrics["agent_ref"] == {"name": AGENT} and metrics["key_metrics"]["mean/reward"] == pytest.approx(0.6)
    assert "mean/mask_sample" not in metrics["agent_metrics"]
    merged = await collection.RolloutAggregationHelper().run_from_config(collection.RolloutAggregationConfig(
        input_glob=str(out / "rollouts*.jsonl"), output_jsonl_fpath=str(tmp_path / "merged/all.jsonl"),
        disable_health_check=True))  # the glob matches the sidecars too: they are not shards
    assert json.loads(merged.read_text()) == [metrics]
    assert sorted(map(json.dumps, lines(tmp_path / "merged/all.jsonl"))) == sorted(map(json.dumps, rows))

    sent = runs_of(on_fleet)
    again = await collection.RolloutCollectionHelper().run_from_config(config(tmp_path, num_repeats=2,
                                                                              resume_from_cache=True))
    assert runs_of(on_fleet) == sent  # every rollout was done: nothing is sent again
    assert lines(out / "rollouts.jsonl") == rows and len(again) == 10


async def test_failed_runs_go_to_the_sidecar_and_only_a_resume_retries_them_up_to_the_attempt_limit(on_fleet,
                                                                                                    tmp_path):
    bad = tmp_path / "bad.jsonl"  # the second row names an agent that answers 404 for /run
    good = json.loads(EXAMPLE.read_text().splitlines()[0])
    bad.write_text(json.dumps(good) + "\n" + json.dumps({**good, "agent_ref": {"name": "mcqa"}}) + "\n")
    settings = {"input": bad, "agent_map": {"_default": AGENT, "mcqa": "mcqa"}, "agent_name": None}
    with pytest.raises(aiohttp.ClientResponseError):  # without route_failures_to_sidecar a failed /run ends the run
        await collection.RolloutCollectionHelper().run_from_config(config(tmp_path, **settings))

    await collection.RolloutCollectionHelper().run_from_config(config(tmp_path, route_failures_to_sidecar=True,
                                                                      **settings))
    out = tmp_path / "out"
    [failure] = lines(out / "rollouts_failures.jsonl")
    assert failure["_ng_failure_class"] == "agent_run_error" and failure["_ng_failure_http_status"] == 404
    assert "reward" not in failure and "response" not in failure and failure["_ng_task_index"] == 1
    assert [r["_ng_task_index"] for r in lines(out / "rollouts.jsonl")] == [0]

    for attempt in (1, 2):  # NEMO_GYM_MAX_ROLLOUT_ATTEMPTS: 3 in all
        sent = runs_of(on_fleet)
        await collection.RolloutCollectionHelper().run_from_config(
            config(tmp_path, route_failures_to_sidecar=True, resume_from_cache=True, **settings))
        assert runs_of(on_fleet) == sent  # the retry went to the failing server, not the agent that succeeded
        assert [r.get("_ng_attempt_index") for r in lines(out / "rollouts_failures.jsonl")][-1] == attempt
    await collection.RolloutCollectionHelper().run_from_config(
        config(tmp_path, route_failures_to_sidecar=True, resume_from_cache=True, **settings))
    assert len(lines(out / "rollouts_failures.jsonl")) == 3  # at the limit: not sent again


async def test_a_terminal_failure_is_retried_only_with_retry_terminal_timeouts(on_fleet, tmp_path):
    await collection.RolloutCollectionHelper().run_from_config(config(tmp_path, limit=1))
    out = tmp_path / "out"
    done = lines(out / "rollouts.jsonl")
    (out / "rollouts.jsonl").write_text("")  # the rollout timed out instead, stamped terminal by its agent
    (out / "rollouts_failures.jsonl").write_text(json.dumps({
        **done[0], "_ng_failure_class": "timeout_exceeded", "_ng_failure_terminal": True}) + "\n")
    sent = runs_of(on_fleet)
    await collection.RolloutCollectionHelper().run_from_config(config(tmp_path, limit=1, resume_from_cache=True,
                                                                      disable_aggregation=True))
    assert runs_of(on_fleet) == sent and lines(out / "rollouts.jsonl") == []

    await collection.RolloutCollectionHelper().run_from_config(
        config(tmp_path, limit=1, resume_from_cache=True, retry_terminal_timeouts=True))
    assert runs_of(on_fleet) == sent + 1
    [retried] = lines(out / "rollouts.jsonl")
    assert retried["_ng_attempt_index"] == 1 and retried["reward"] == EXPECTED_REWARD[0]


def test_rows_are_routed_repeated_and_seeded_as_0_7_0_prepares_them():
    raw = [(0, b'{"q": 1}', {"q": 1, "agent_ref": {"name": "a"}}), (1, b'{"q": 2}', {"q": 2, "task_source": "s"}),
           (2, b'{"q": 1}', {"q": 1, "agent_ref": {"name": "a"}})]
    config = collection.RolloutCollectionConfig(
        input_jsonl_fpath="-", output_jsonl_fpath="o.jsonl", agent_map={"s": "b"}, fan_out={"a": ["a", "c"]},
        num_repeats={"c": 2, "_default": 1}, num_repeats_add_seed=True, responses_create_params={"temperature": 0.5})
    rows = preprocess_raw_rows([(i, line, dict(row)) for i, line, row in raw], config)
    assert [(r["agent_ref"]["name"], r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [
        ("a", 0, 0), ("c", 0, 1), ("c", 0, 2), ("b", 1, 0), ("a", 0, 3), ("c", 0, 4), ("c", 0, 5)]
    assert all(r["responses_create_params"]["temperature"] == 0.5 for r in rows)
    seeds = [json.loads(r["responses_create_params"]["metadata"]["extra_body"])["seed"] for r in rows]
    assert seeds == [r["_ng_rollout_index"] for r in rows]

    with pytest.raises(ConfigError, match="task_source"):  # a source no agent_map entry routes
        preprocess_raw_rows([(0, b"{}", {"task_source": "t"})], collection.RolloutCollectionConfig(
            input_jsonl_fpath="-", output_jsonl_fpath="o.jsonl"))
    with pytest.raises(ConfigError, match="no _default"):
        preprocess_raw_rows([(0, b"{}", {"agent_ref": {"name": "z"}})], collection.RolloutCollectionConfig(
            input_jsonl_fpath="-", output_jsonl_fpath="o.jsonl", num_repeats={"a": 2}))


DRIVER = textwrap.dedent('''
    import json
    from pathlib import Path

    from nemo_gym.rollout_collection import RolloutCollectionHelper


    async def run(config, global_config):
        Path("driver_saw.json").write_text(json.dumps({
            "type": type(config).__name__, "custom": global_config.get("my_setting"),
            "fleet_has_agent": "mcqa_simple_agent" in global_config, "repeats": config.num_repeats}))
        await RolloutCollectionHelper().run_from_config(config.model_copy(update={"num_repeats": 2}))


    async def broken(config, global_config):
        raise RuntimeError("the driver gave up")
''')


def collect(fleet, *args: str) -> int:
    argv = [f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}", f"+input_jsonl_fpath={EXAMPLE}",
            "+output_jsonl_fpath=out/rollouts.jsonl", f"+agent_name={AGENT}", *args]
    with pytest.raises(SystemExit) as exited:
        collect_main(argv)
    return exited.value.code


def test_ng_collect_rollouts_hands_the_collection_to_the_configured_driver(fleet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "collect7_driver.py").write_text(DRIVER)

    assert collect(fleet, "+rollout_collection_driver=collect7_driver:run", "+my_setting=7",
                   "+disable_health_check=true") == 0

    saw = json.loads((tmp_path / "driver_saw.json").read_text())
    assert saw == {"type": "RolloutCollectionConfig", "custom": 7, "fleet_has_agent": True, "repeats": 1}
    rows = lines(tmp_path / "out/rollouts.jsonl")
    assert len(rows) == 10 and {r["reward"] for r in rows if r["_ng_task_index"] == 1} == {0.0}
    assert collect(fleet, "+rollout_collection_driver=collect7_driver:broken") == 1


@pytest.mark.parametrize(("path", "says"), [
    ("collect7_driver", "must be 'module.path:function'"),
    ("collect7_driver:", "must be 'module.path:function'"),
    (":run", "must be 'module.path:function'"),
    ("a:b:c", "must be 'module.path:function'"),
    ("no_such_module_collect7:run", "does not import"),
    ("collect7_driver:rnu", "has no function 'rnu'. Did you mean 'run'?"),
    ("collect7_driver:json", "has no function 'json'"),
])
def test_a_driver_that_cannot_be_loaded_is_one_error_naming_the_key_and_the_fix(tmp_path, monkeypatch, path, says):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "collect7_driver.py").write_text(DRIVER)
    with pytest.raises(ConfigError, match="rollout_collection_driver") as refused:
        load_driver(path)
    assert says in str(refused.value) and "module.path:function" in refused.value.hint


def test_a_bad_driver_stops_ng_collect_rollouts_before_anything_is_sent(fleet, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sent = runs_of(fleet)
    assert collect(fleet, "+rollout_collection_driver=no_such_module_collect7:run") == 2
    err = capsys.readouterr().err
    assert "rollout_collection_driver" in err and "does not import" in err
    assert runs_of(fleet) == sent and not (tmp_path / "out").exists()
