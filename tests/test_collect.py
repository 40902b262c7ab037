"""Rollout collection against a real fleet: scripted model + vllm_model proxy + mcqa + simple_agent (quickstart)."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gymfleet import http
from gymfleet.cli.collect import main as collect_main
from gymfleet.errors import DataError, TransportError
from gymfleet.fleet.config_instances import repository_root
from gymfleet.rollouts.collect import run_rollout
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig, load_rows
from gymfleet.rollouts.collect_outputs import read_results
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper
from gymfleet.testing import fleet_headers, free_port, running_fleet, wait_until

ROOT = repository_root()
EXAMPLE = ROOT / "resources_servers/mcqa/data/example.jsonl"
INVALID = Path(__file__).parent / "fixtures/data/mcqa_invalid_rows.jsonl"
AGENT = "mcqa_simple_agent"
# The scripted model answers tasks 0, 2 and 4 correctly and 1 and 3 wrongly (configs/quickstart.yaml).
EXPECTED_REWARD = {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}


@pytest.fixture(scope="module")
def fleet():
    with running_fleet([str(ROOT / "configs/quickstart.yaml")]) as running:
        yield running


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture
async def close_http():
    yield
    await http.close()


def head_of(fleet) -> str:
    return f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}"


def collect(*args: str, head: str | None = None, output: str = "results/out.jsonl") -> int:
    argv = [f"+agent_name={AGENT}", f"+output_jsonl_fpath={output}", head or f"+head_server={{port: {free_port()}}}",
            *args]
    if not any(arg.startswith("+input_jsonl_fpath=") for arg in args):
        argv.append(f"+input_jsonl_fpath={EXAMPLE}")
    with pytest.raises(SystemExit) as exited:
        collect_main(argv)
    return exited.value.code


def lines(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def keys(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted((row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows)


def posts_to(fleet, instance: str) -> float:
    """How many POST requests (`/run`, `/v1/responses`, ...) `instance` has handled, from its `/metrics`."""
    request = urllib.request.Request(fleet.config.instance(instance).url + "/metrics", headers=fleet_headers(fleet))
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gymfleet_requests_total{") and 'method="POST"' in line)


def start_collector(head_port: int, cwd: Path, *args: str) -> tuple[list[str], subprocess.Popen]:
    """`ng_collect_rollouts` in a child process (so the fleet can die under it); returns its command too."""
    command = [sys.executable, "-m", "gymfleet.cli.collect", f"+agent_name={AGENT}", f"+input_jsonl_fpath={EXAMPLE}",
               "+output_jsonl_fpath=out.jsonl", f"+head_server={{host: 127.0.0.1, port: {head_port}}}", *args]
    return command, subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_results(path: Path, count: int, collector: subprocess.Popen) -> None:
    """Until the running `collector` has written `count` results to `path` (fails if it ends first)."""

    def written() -> bool:
        assert collector.poll() is None, f"the collector exited ({collector.returncode}) before {count} results"
        return path.exists() and len(path.read_text().splitlines()) >= count

    wait_until(written, f"the collector wrote {count} results to {path}", interval_s=0.05)


def test_collects_every_rollout_with_rewards_indices_and_metrics(fleet, capsys):
    assert collect("+num_repeats=2", "+num_samples_in_parallel=3", head=head_of(fleet)) == 0

    results = lines("results/out.jsonl")
    assert keys(results) == [(task, rollout) for task in range(5) for rollout in range(2)]
    for result in results:
        assert result["reward"] == EXPECTED_REWARD[result["_ng_task_index"]]
        assert result["agent_ref"] == {"type": "responses_api_agents", "name": AGENT}
        assert result["response"]["output"], "the episode's output items are kept"
    materialized = lines("results/out_materialized_inputs.jsonl")
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in materialized] == keys(results)
    assert Path("results/out_failures.jsonl").read_text() == ""

    [entry] = json.loads(Path("results/out_aggregate_metrics.json").read_text())
    assert set(entry) == {"agent_ref", "agent_metrics", "key_metrics", "group_level_metrics"}
    assert entry["agent_ref"] == {"name": AGENT}
    assert entry["key_metrics"]["mean/reward"] == pytest.approx(0.6)
    assert entry["agent_metrics"]["mean/output_tokens"] > 0, "response.usage reaches the aggregation"
    assert len(entry["group_level_metrics"]) == 5
    out = capsys.readouterr().out
    assert "10 ok, 0 failed" in out and "mean reward 0.6000" in out and "mean/reward=0.6" in out


def test_limit_params_override_and_seed(fleet):
    args = ["+limit=2", "+num_repeats=3", "+num_repeats_add_seed=true", "+responses_create_params={temperature: 0.25}"]
    assert collect(*args, head=head_of(fleet)) == 0

    materialized = lines("results/out_materialized_inputs.jsonl")
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in materialized] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [json.loads(r["responses_create_params"]["metadata"]["extra_body"]) for r in materialized[:3]] == [
        {"seed": 0}, {"seed": 1}, {"seed": 2}]
    results = lines("results/out.jsonl")
    assert keys(results) == keys(materialized)
    assert all(r["responses_create_params"]["temperature"] == 0.25 for r in results)


def test_task_indices_follow_identical_lines_and_repeats_per_agent(tmp_path):
    first, second = EXAMPLE.read_text().splitlines()[:2]
    explicit = json.dumps({**json.loads(second), "_ng_task_index": 42})
    (tmp_path / "in.jsonl").write_text("\n".join([first, second, "", first, explicit]) + "\n")
    config = RolloutCollectionConfig(input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out.jsonl", agent_name=AGENT,
                                     num_repeats={AGENT: 2, "_default": 5})
    rows = load_rows(config)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (0, 0), (0, 1), (42, 0), (42, 1)]
    assert rows[0] is not rows[1] and rows[0]["responses_create_params"] is not rows[1]["responses_create_params"]


def test_bad_input_lines_fail_before_anything_is_dispatched(capsys):
    assert collect(f"+input_jsonl_fpath={INVALID}") == 2

    err = capsys.readouterr().err
    assert f"{INVALID}:2: not valid JSON" in err
    assert f"{INVALID}:3: expected a JSON object, got list" in err
    assert f"{INVALID}:4: responses_create_params: input" in err
    assert not Path("results").exists(), "nothing is written, not even the materialized inputs"


def test_rows_without_agent_ref_need_agent_name(tmp_path):
    config = RolloutCollectionConfig(input_jsonl_fpath=str(EXAMPLE), output_jsonl_fpath="out.jsonl", limit=1)
    with pytest.raises(DataError, match=r"example\.jsonl:1: no agent_ref, and no \+agent_name"):
        load_rows(config)


def test_config_errors_and_unreachable_head_exit_2(fleet, capsys):
    assert collect("+num_repeats=0") == 2
    assert "num_repeats" in capsys.readouterr().err
    assert collect() == 2
    assert "cannot reach the head server" in capsys.readouterr().err
    assert collect("+agent_name=mcqa_simple_agnet", head=head_of(fleet)) == 2
    assert "Did you mean 'mcqa_simple_agent'?" in capsys.readouterr().err
    assert not Path("results/out.jsonl").exists()


def test_resume_after_a_crash_finishes_every_rollout_exactly_once(fleet, caplog):
    assert collect("+num_repeats=2", head=head_of(fleet)) == 0
    output = Path("results/out.jsonl")
    kept = output.read_text().splitlines(keepends=True)[:4]
    output.write_text("".join(kept) + kept[0][: len(kept[0]) // 2])  # a crash in the middle of the fifth line

    assert collect("+num_repeats=2", "+resume_from_cache=true", head=head_of(fleet)) == 0

    results = lines(output)
    assert keys(results) == [(task, rollout) for task in range(5) for rollout in range(2)]
    assert results[:4] == [json.loads(line) for line in kept], "finished lines are appended to, not redone"
    assert "dropping a truncated last line" in caplog.text


def test_resume_retries_failures_until_max_attempts(fleet, capsys):
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    failure = {"_ng_failure_class": "http_5xx", "_ng_rollout_index": 0}
    Path("results").mkdir()
    Path("results/out_failures.jsonl").write_text("".join(
        json.dumps({**rows[task], **failure, "_ng_task_index": task}) + "\n" for task in (0, 0, 0, 1)))

    assert collect("+resume_from_cache=true", "+max_attempts=3", head=head_of(fleet)) == 1

    results = {r["_ng_task_index"]: r for r in lines("results/out.jsonl")}
    assert sorted(results) == [1, 2, 3, 4], "task 0 failed three times: not tried again"
    assert results[1]["_ng_attempt_index"] == 1 and "_ng_attempt_index" not in results[2]
    failures = lines("results/out_failures.jsonl")
    assert len(failures) == 4, "the failures file keeps every row"
    assert [(f["_ng_task_index"], f.get("_ng_superseded", False)) for f in failures] == [
        (0, False), (0, False), (0, False), (1, True)], "task 1 succeeded now: its failure row is marked superseded"
    assert "Not retried, failed max_attempts times (task, rollout): [(0, 0)]" in capsys.readouterr().out


def test_dead_servers_become_failure_rows_not_aborts_or_hangs():
    # restart_crashed_servers=0: the killed servers stay dead (by default the fleet would restart them). Nothing
    # comes back, so the agent and the collector ride over a restart for 1 s instead of 10 (`restart_ride_s`,
    # `connect_retry_s`): the failures are the same, sooner.
    short_ride = {AGENT: {"responses_api_agents": {"simple_agent": {"restart_ride_s": 1}}}}
    with running_fleet([str(ROOT / "configs/quickstart.yaml")], {"restart_crashed_servers": 0, **short_ride}) as fleet:
        fleet.children["mcqa"].process.kill()
        fleet.children["mcqa"].process.wait(10)
        assert collect("+limit=2", "+connect_retry_s=1", head=head_of(fleet), output="env_down.jsonl") == 1
        failures = lines("env_down_failures.jsonl")
        assert [f["_ng_failure_class"] for f in failures] == ["connection_error", "connection_error"]
        assert failures[0]["_ng_failure_status"] == 502 and "mcqa" in failures[0]["_ng_failure_detail"]
        [entry] = json.loads(Path("env_down_aggregate_metrics.json").read_text())
        metrics = entry["agent_metrics"]
        assert (metrics["infra_failure_count"], metrics["infra_failure_share"]) == (2, 1.0), "the broken env shows"

        fleet.children[AGENT].process.kill()
        fleet.children[AGENT].process.wait(10)
        assert collect("+num_repeats=2", "+connect_retry_s=1", head=head_of(fleet), output="agent_down.jsonl") == 1
    failures = lines("agent_down_failures.jsonl")
    assert keys(failures) == [(task, rollout) for task in range(5) for rollout in range(2)]
    assert {f["_ng_failure_class"] for f in failures} == {"connection_error"}
    assert all(f["_ng_failure_status"] is None and f["_ng_attempt_index"] == 0 for f in failures)
    assert Path("agent_down.jsonl").read_text() == ""
    assert json.loads(Path("agent_down_aggregate_metrics.json").read_text()) == []


async def test_run_examples_yields_the_rows_passed_in(fleet, close_http):
    rows = [{**json.loads(line), "agent_ref": {"type": "responses_api_agents", "name": AGENT}, "_rowidx": index}
            for index, line in enumerate(EXAMPLE.read_text().splitlines())]
    helper = RolloutCollectionHelper()
    head = SimpleNamespace(host="127.0.0.1", port=fleet.config.head_port)
    seen = []
    for future in helper.run_examples(rows, head_server_config=head, semaphore=asyncio.Semaphore(2)):
        row, result = await future
        assert row is rows[row["_rowidx"]]
        assert result["reward"] == EXPECTED_REWARD[row["_rowidx"]]
        seen.append(row["_rowidx"])
    assert sorted(seen) == list(range(5))
    assert set(rows[0]) == {*json.loads(EXAMPLE.read_text().splitlines()[0]), "agent_ref", "_rowidx"}, "unmodified"


async def test_run_examples_raises_with_status_on_4xx(fleet, close_http):
    bad = {"responses_create_params": {"input": 5}, "agent_ref": {"type": "responses_api_agents", "name": AGENT}}
    [future] = RolloutCollectionHelper().run_examples([bad], {"host": "127.0.0.1", "port": fleet.config.head_port})
    with pytest.raises(TransportError) as raised:
        await future
    assert raised.value.status == 422 and b"input" in raised.value.response_content


async def test_collection_turns_a_4xx_into_a_failure_row(fleet, close_http):
    client = await http.ServerClient.from_head("127.0.0.1", fleet.config.head_port)
    row = {"responses_create_params": {"input": 5}, "agent_ref": {"name": AGENT}, "_ng_task_index": 7,
           "_ng_rollout_index": 0}
    failure = await run_rollout(client, row, timeout_s=30)
    assert failure["_ng_failure_class"] == "http_4xx" and failure["_ng_failure_status"] == 422
    assert failure["_ng_task_index"] == 7 and failure["_ng_attempt_index"] == 0


def test_read_results_rejects_a_corrupt_middle_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(DataError, match=r"out\.jsonl:2: not a JSON object"):
        read_results(path)
    path.write_text('{"a": 1}\n{"a": 2}')  # complete last object without its newline: kept, newline restored
    assert read_results(path) == [{"a": 1}, {"a": 2}] and path.read_text().endswith("}\n")


def test_existing_outputs_are_refused_unless_resume_or_overwrite(fleet, capsys):
    assert collect("+limit=2", head=head_of(fleet)) == 0
    before = {path: path.read_bytes() for path in Path("results").iterdir()}
    assert len(before) == 4
    capsys.readouterr()

    assert collect("+limit=3") == 2, "refused before the (here unreachable) fleet is even contacted"
    err = capsys.readouterr().err
    assert "results/out.jsonl" in err and "results/out_aggregate_metrics.json" in err
    assert "+resume_from_cache=true" in err and "+overwrite=true" in err
    assert {path: path.read_bytes() for path in Path("results").iterdir()} == before, "nothing was touched"

    assert collect("+limit=3", "+resume_from_cache=true", "+overwrite=true", head=head_of(fleet)) == 2
    assert "contradict" in capsys.readouterr().err

    assert collect("+limit=3", "+overwrite=true", "+disable_aggregation=true", head=head_of(fleet)) == 0
    assert keys(lines("results/out.jsonl")) == [(0, 0), (1, 0), (2, 0)], "replaced, not appended to"
    assert len(lines("results/out_materialized_inputs.jsonl")) == 3
    assert not Path("results/out_aggregate_metrics.json").exists(), "no aggregate of the replaced rollouts is left"


def test_rows_their_environment_would_refuse_are_named_before_any_rollout(fleet, tmp_path, capsys):
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    rows[1]["expected_answer"] = 7
    rows[3]["options"] = "A: yes"
    data = tmp_path / "typed.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    if posts_to(fleet, AGENT) == 0:  # run on its own: collect once, elsewhere, so the counts below are live
        assert collect("+limit=1", head=head_of(fleet), output=str(tmp_path / "first/out.jsonl")) == 0
        capsys.readouterr()
    runs, model_calls = posts_to(fleet, AGENT), posts_to(fleet, "scripted_llm")
    assert runs > 0, "the module's fleet has collected before: the count is live"

    assert collect(f"+input_jsonl_fpath={data}", head=head_of(fleet)) == 2

    err = capsys.readouterr().err
    assert f"{data}:2: not a valid MCQARequest: expected_answer: Input should be a valid string" in err
    assert f"{data}:4: not a valid MCQARequest: options" in err
    assert f"{data}:1:" not in err and "2 rows do not fit" in err
    assert posts_to(fleet, AGENT) == runs and posts_to(fleet, "scripted_llm") == model_calls, "no /run was sent"
    assert not Path("results").exists(), "nothing is written"


def test_a_server_killed_mid_collection_costs_the_rollouts_in_flight_and_resume_completes_every_one_once(tmp_path):
    """Kill the environment while rollouts are in flight: the fleet restarts it and the agent's calls ride over the
    restart (`RetryPolicy.connect_retry_s`), so only rollouts in flight at the kill fail, typed; resume, and every
    rollout is done once and the failure rows are superseded."""
    total = 5 * 40
    parallel = 16
    with running_fleet([str(ROOT / "configs/quickstart.yaml")], {"restart_crashed_servers": 1}) as fleet:
        command, collector = start_collector(fleet.config.head_port, tmp_path, "+num_repeats=40",
                                             f"+num_samples_in_parallel={parallel}",
                                             f"+stop_after_connection_failures={4 * parallel}")
        output = tmp_path / "out.jsonl"
        wait_for_results(output, 30, collector)
        fleet.children["mcqa"].process.kill()
        out, err = collector.communicate(timeout=180)  # finishes: no hang
        assert collector.returncode in (0, 1), out.decode() + err.decode()
        failures = lines(tmp_path / "out_failures.jsonl")
        # At most: the rollouts in flight at the kill, plus one per keep-alive connection the agent held to the dead
        # process (a request sent on one is reset and may have reached it, so it is not resent).
        assert len(failures) <= 2 * parallel, f"{len(failures)} failed; {parallel} were in flight at the kill"
        assert {f["_ng_failure_class"] for f in failures} <= {"http_5xx", "connection_error"}
        assert len(lines(output)) + len(failures) == total, "every rollout ran: the collection did not stop"
        fleet.poll()  # the fleet restarted mcqa by itself (restart_crashed_servers=1); poll() does not raise
        assert fleet.process_table()["mcqa"]["restarts"] == 1
        fleet._wait_ready(60)
        resumed = subprocess.run([*command, "+resume_from_cache=true"], cwd=tmp_path, capture_output=True,
                                 timeout=120)
        assert resumed.returncode == 0, resumed.stdout.decode() + resumed.stderr.decode()
    results = lines(output)
    assert keys(results) == [(task, rollout) for task in range(5) for rollout in range(40)], "each exactly once"
    assert all(r["reward"] == EXPECTED_REWARD[r["_ng_task_index"]] for r in results)
    retried = [r for r in results if "_ng_attempt_index" in r]
    assert keys(retried) == keys(failures), "a failed rollout is retried as attempt 1; one never sent is not"
    assert all(r["_ng_attempt_index"] == 1 for r in retried)
    assert lines(tmp_path / "out_failures.jsonl") == [{**f, "_ng_superseded": True} for f in failures]


@contextlib.contextmanager
def ng_run(head_port: int, log: Path) -> Iterator[subprocess.Popen]:
    """A fleet started the way a user starts one: `ng_run` in its own process (the quickstart config)."""
    command = [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{ROOT / 'configs/quickstart.yaml'}]",
               f"+head_server={{host: 127.0.0.1, port: {head_port}}}"]
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while "servers ready" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        request = urllib.request.Request(f"http://127.0.0.1:{head_port}/server_instances",
                                         headers=fleet_headers(head_port))
        with urllib.request.urlopen(request, timeout=10) as answer:
            servers = [entry["pid"] for entry in json.loads(answer.read())]
        yield process
    finally:
        process.kill()
        process.wait(10)
        for pid in servers:  # they stop by themselves once ng_run is gone; make sure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_dead_fleet_stops_the_collection_with_one_message_and_resume_finishes_it(tmp_path):
    """`ng_run` is killed mid-collection (head server and all): the collector stops after a run of connection
    failures with one message, warnings summarized; a new fleet on the same head port and a resume finish the job."""
    total = 5 * 40
    port = free_port()
    output = tmp_path / "out.jsonl"
    with ng_run(port, tmp_path / "ng_run.log") as supervisor:
        # The fleet stays dead: a /run that cannot connect tries for 1 s, not 10 (`connect_retry_s`).
        command, collector = start_collector(port, tmp_path, "+num_repeats=40", "+num_samples_in_parallel=8",
                                             "+connect_retry_s=1")
        wait_for_results(output, 20, collector)
        supervisor.kill()
        out, err = collector.communicate(timeout=120)
    out, err = out.decode(), err.decode()
    assert collector.returncode == 3, out + err
    [message] = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"the head server at 127.0.0.1:{port} does not answer: the fleet is down" in message
    assert "Restart the fleet (ng_run \"+config_paths=[" in message and "+resume_from_cache=true" in message
    retry_warnings = [line for line in err.splitlines() if "WARNING gymfleet.http" in line]
    assert len(retry_warnings) <= 5 and "more warnings like this one were not shown" in err
    done_before, failed_before = len(lines(output)), len(lines(tmp_path / "out_failures.jsonl"))
    assert done_before + failed_before < total, "stopped: the rest was not sent"
    assert f"Not run (left for +resume_from_cache=true): {total - done_before - failed_before}" in out
    assert not (tmp_path / "out_aggregate_metrics.json").exists(), "no aggregate from a dead fleet"

    with ng_run(port, tmp_path / "ng_run_again.log"):
        resumed = subprocess.run([*command, "+resume_from_cache=true"], cwd=tmp_path, capture_output=True,
                                 timeout=120)
    assert resumed.returncode == 0, resumed.stdout.decode() + resumed.stderr.decode()
    assert keys(lines(output)) == [(task, rollout) for task in range(5) for rollout in range(40)], "each once"
    assert all(f["_ng_superseded"] for f in lines(tmp_path / "out_failures.jsonl"))
    [entry] = json.loads((tmp_path / "out_aggregate_metrics.json").read_text())
    assert entry["key_metrics"]["mean/reward"] == pytest.approx(0.6)
