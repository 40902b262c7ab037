"""`ng_reverify` (issue 16, item 2) on rollouts `ng_collect_rollouts` wrote from a real quickstart fleet.

The fleet (scripted model, vllm_model, mcqa, simple_agent) is real; 100 rollouts are collected once per module.
Against the fleet: every row is re-scored and unchanged, then a rerun sends nothing (mcqa's `/metrics` counts the
POSTs). In process: the same file plus math_with_judge rows (scored by the real server over HTTP) and rows of an
`unsupported` environment; changing mcqa's grading mode re-scores exactly mcqa's rows and reports the changed ones
with a `config_hash` diff.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import httpx
import pytest

from gymfleet import http
from gymfleet.cli.collect import main as collect_main
from gymfleet.cli.reverify import main as reverify_main
from gymfleet.fleet.config_instances import repository_root
from gymfleet.http import ServerClient
from gymfleet.rollouts.reverify import FleetBackend, ReverifyConfig, reverify
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.testing import fleet_headers, free_port, make_response, running_fleet, serve
from tests.test_provenance import build, example_rows

ROOT = repository_root()
MCQA_ROWS = ROOT / "resources_servers/mcqa/data/example.jsonl"
REPEATS = 20
CONFIGS = ("configs/quickstart.yaml,resources_servers/math_with_judge/configs/math_with_judge.yaml,"
           "resources_servers/example_weather/configs/example_weather.yaml")


@pytest.fixture(scope="module")
def fleet():
    with running_fleet([str(ROOT / "configs/quickstart.yaml")]) as running:
        yield running


@pytest.fixture(scope="module")
def rollouts(fleet, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reverify") / "mcqa.jsonl"
    with pytest.raises(SystemExit) as exited:
        collect_main(["+agent_name=mcqa_simple_agent", f"+input_jsonl_fpath={MCQA_ROWS}",
                      f"+output_jsonl_fpath={out}", f"+num_repeats={REPEATS}", "+num_samples_in_parallel=16",
                      f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}"])
    assert exited.value.code == 0
    return out


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verify_posts(fleet) -> float:
    request = urllib.request.Request(fleet.config.instance("mcqa").url + "/metrics", headers=fleet_headers(fleet))
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gymfleet_requests_total{") and 'route="/verify"' in line
               and 'method="POST"' in line)


def run(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        reverify_main(list(args))
    return exited.value.code


def test_the_collector_keeps_the_provenance_on_every_row(rollouts):
    rows = lines(rollouts)
    assert len(rows) == 5 * REPEATS
    for row in rows:
        provenance = row["reward_provenance"]
        assert provenance["environment"] == "mcqa" and provenance["version"] == "v2"
        assert set(provenance) == {"environment", "instance", "version", "config_hash", "libraries"}
    assert len({json.dumps(row["reward_provenance"], sort_keys=True) for row in rows}) == 1
    metrics = json.loads(rollouts.with_name("mcqa_aggregate_metrics.json").read_text())
    assert metrics[0]["agent_metrics"]["infra_failure_share"] == 0.0


def test_against_the_fleet_all_unchanged_then_all_from_the_cache(fleet, rollouts, capsys):
    head = f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}"
    before = verify_posts(fleet)
    assert run(f"+input_jsonl_fpath={rollouts}", head, "+concurrency=8") == 0
    first = capsys.readouterr().out
    assert verify_posts(fleet) - before == 5 * REPEATS
    total = next(line for line in first.splitlines() if line.startswith("total"))
    assert total.split() == ["total", "100", "100", "0", "100", "0", "0", "0"], first
    assert rollouts.with_name("mcqa_reverify.jsonl").read_text() == ""
    assert len(lines(rollouts.with_name("mcqa_reverify_cache.jsonl"))) == 5 * REPEATS

    before = verify_posts(fleet)
    assert run(f"+input_jsonl_fpath={rollouts}", head) == 0
    second = capsys.readouterr().out
    assert verify_posts(fleet) == before  # nothing re-POSTed
    total = next(line for line in second.splitlines() if line.startswith("total"))
    assert total.split() == ["total", "100", "0", "100", "100", "0", "0", "0"], second


def _mixed_rollouts(rollouts: Path, folder: Path) -> Path:
    """The fleet's mcqa rollouts, math_with_judge rows the real server scored, and example_weather rows."""
    math = build("math_with_judge")
    answers = ["\\boxed{400}", "\\boxed{1/6}", "no idea", "\\boxed{12}", "\\boxed{7}"]
    extra = []
    with serve(math.create_app()) as url, httpx.Client(base_url=url, timeout=60) as client:
        for index, (row, text) in enumerate(zip(example_rows("math_with_judge"), answers, strict=False)):
            body = {**row, "response": make_response(text), "agent_ref": {"name": "math_with_judge_simple_agent"},
                    "_ng_task_index": index, "_ng_rollout_index": 0}
            extra.append(client.post("/verify", json=body).json())
    for index, row in enumerate(example_rows("example_weather")[:3]):
        extra.append({**row, "response": make_response("sunny"), "reward": 0.0, "_ng_task_index": index,
                      "_ng_rollout_index": 0, "agent_ref": {"name": "example_weather_simple_agent"}})
    path = folder / "mixed.jsonl"
    path.write_text(rollouts.read_text() + "".join(json.dumps(row) + "\n" for row in extra))
    return path


def test_in_process_a_config_change_rescores_exactly_that_environment(rollouts, tmp_path, capsys):
    mixed = _mixed_rollouts(rollouts, tmp_path)
    args = [f"+input_jsonl_fpath={mixed}", f"+config_paths=[{CONFIGS}]"]
    assert run(*args) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line and line[0].isalpha()}
    assert table["mcqa"] == ["stateless", "100", "100", "0", "100", "0", "0", "0"], out
    assert table["math_with_judge"] == ["stateless", "5", "5", "0", "5", "0", "0", "0"], out
    assert table["example_weather"] == ["unsupported", "3", "0", "0", "0", "0", "3", "0"], out
    assert "example_weather: reverify_mode is unsupported (3)" in out

    assert run(*args) == 0  # again: everything from the cache
    out = capsys.readouterr().out
    assert next(line for line in out.splitlines() if line.startswith("total")).split()[1:] == [
        "108", "0", "105", "105", "0", "3", "0"], out

    lenient = "++mcqa.resources_servers.mcqa.grading_mode=lenient_answer_colon"
    assert run(*args, lenient) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line and line[0].isalpha()}
    assert table["mcqa"][:3] == ["stateless", "100", "100"], out  # every mcqa row re-scored ...
    assert table["math_with_judge"] == ["stateless", "5", "0", "5", "5", "0", "0", "0"], out  # ... no other
    changes = lines(mixed.with_name("mixed_reverify.jsonl"))
    assert len(changes) == int(table["mcqa"][5]) > 0
    stored = lines(mixed)
    # Each change is a real difference from what the lenient server answers, explained by the config hash.
    server = build("mcqa", grading_mode="lenient_answer_colon")
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=30) as client:
        for change in changes:
            row = stored[change["line"] - 1]
            assert change["environment"] == "mcqa" and change["why"] == ["config_hash"]
            assert change["old_reward"] == row["reward"] != change["new_reward"]
            answer = client.post("/verify", json={k: v for k, v in row.items() if k != "reward"}).json()
            assert answer["reward"] == change["new_reward"]
    changed_lines = {change["line"] for change in changes}
    unchanged_mcqa = [row for lineno, row in enumerate(stored, 1)
                      if row["agent_ref"]["name"] == "mcqa_simple_agent" and lineno not in changed_lines]
    assert len(unchanged_mcqa) == int(table["mcqa"][4])


async def test_a_resources_server_that_is_down_gives_typed_failures_not_changed_rewards(rollouts, tmp_path):
    config = {"mcqa_simple_agent": {"responses_api_agents": {"simple_agent": {"resources_server": "mcqa"}}},
              "mcqa": {"resources_servers": {"mcqa": {"host": "127.0.0.1", "port": free_port()}}}}
    settings = ReverifyConfig(input_jsonl_fpath=str(rollouts), cache_jsonl_fpath=str(tmp_path / "cache.jsonl"),
                              output_jsonl_fpath=str(tmp_path / "changes.jsonl"))
    try:
        summary = await reverify(settings, FleetBackend(ServerClient(config)), progress=False)
    finally:
        await http.close()
    assert summary.total("failed") == 5 * REPEATS
    assert summary.total("changed") == summary.total("unchanged") == 0
    assert summary.failure_classes == {"connection_error": 5 * REPEATS}
    assert summary.exit_code == 1
    assert (tmp_path / "changes.jsonl").read_text() == ""
    assert (tmp_path / "cache.jsonl").read_text() == ""  # failures are never cached


def test_a_truncated_line_is_an_error_naming_file_and_line(rollouts, tmp_path, capsys):
    broken = tmp_path / "broken.jsonl"
    text = rollouts.read_text().splitlines()
    broken.write_text("\n".join(text[:3]) + "\n" + text[3][: len(text[3]) // 2] + "\n")
    assert run(f"+input_jsonl_fpath={broken}", f"+head_server={{port: {free_port()}}}") == 2
    assert f"{broken}:4" in capsys.readouterr().err
    not_rollout = tmp_path / "rows.jsonl"
    not_rollout.write_text(MCQA_ROWS.read_text())
    assert run(f"+input_jsonl_fpath={not_rollout}", f"+head_server={{port: {free_port()}}}") == 2
    err = capsys.readouterr().err
    assert f"{not_rollout}:1" in err and "response" in err


class Unknown(ResourcesServer):
    """An environment that does not say whether it can be re-verified."""

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=1.0)


def test_unknown_mode_is_skipped_unless_forced(tmp_path):
    server = Unknown({"name": "mystery", "domain": "other"})
    row = {"responses_create_params": {"input": "q"}, "response": make_response("a"), "reward": 1.0,
           "agent_ref": {"name": "mystery_agent"}}
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text(json.dumps(row) + "\n")
    with serve(server.create_app()) as url:
        port = int(url.rsplit(":", 1)[1])
        config = {"mystery_agent": {"responses_api_agents": {"simple_agent": {"resources_server": "mystery"}}},
                  "mystery": {"resources_servers": {"x": {"host": "127.0.0.1", "port": port}}}}

        async def go(force: bool):
            settings = ReverifyConfig(input_jsonl_fpath=str(rollouts), reverify_unknown=force)
            try:
                return await reverify(settings, FleetBackend(ServerClient(config)), progress=False)
            finally:
                await http.close()

        skipped = asyncio.run(go(False))
        forced = asyncio.run(go(True))
    assert skipped.total("skipped") == 1 and "+reverify_unknown=true" in skipped.table()
    assert forced.total("rescored") == 1 and forced.total("unchanged") == 1
