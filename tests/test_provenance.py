"""`reward_provenance` on every `/verify` answer (issue 16, item 1), over real HTTP, and its aggregation.

Servers are real (uvicorn on an ephemeral port); the environments are the shipped ones, built from their configs.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
import yaml

from gymfleet.errors import JudgeError
from gymfleet.fleet.config_instances import ServerInstance, repository_root
from gymfleet.fleet.launch import build_server
from gymfleet.serving.aggregate import aggregate_metrics, infra_failures
from gymfleet.serving.provenance import config_hash, docstring_version, library_versions, provenance_diff
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.testing import check_resources_server, make_response, serve

ROOT = repository_root()


def build(env: str, global_config: dict | None = None, **overrides) -> ResourcesServer:
    config = yaml.safe_load((ROOT / "resources_servers" / env / "configs" / f"{env}.yaml").read_text())
    name, fields = next((name, block["resources_servers"][env]) for name, block in config.items()
                        if isinstance(block, dict) and env in (block.get("resources_servers") or {}))
    instance = ServerInstance(name=name, server_type="resources_servers", impl=env,
                              fields={**fields, "host": "127.0.0.1", "port": 0, **overrides})
    return build_server(instance, global_config or {})


def example_rows(env: str) -> list[dict]:
    text = (ROOT / "resources_servers" / env / "data" / "example.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_scored_rows_carry_the_environment_version_config_hash_and_libraries():
    server = build("math_with_judge")
    row = example_rows("math_with_judge")[0]
    with serve(server.create_app()) as url:
        answer = httpx.post(f"{url}/verify", json={**row, "response": make_response("\\boxed{7}")}, timeout=60).json()
    provenance = answer["reward_provenance"]
    assert provenance["environment"] == "math_with_judge"
    assert provenance["instance"] == "math_with_judge"
    history = re.findall(r"^- (v\d+):", (ROOT / "resources_servers/math_with_judge/app.py").read_text(), re.M)
    assert provenance["version"] == history[-1]  # the last entry of app.py's `## Version history`
    assert len(provenance["config_hash"]) == 16
    assert set(provenance["libraries"]) == {"gymfleet", "math-verify", "sympy", "latex2sympy2_extended"}
    assert provenance["libraries"]["sympy"] == library_versions(["sympy"])["sympy"]
    assert "judge" not in provenance  # should_use_judge is off in the shipped config
    assert len(json.dumps(provenance)) < 1024


def test_a_stored_provenance_in_the_request_is_replaced_by_the_servers_own():
    server = build("mcqa")
    row = {**example_rows("mcqa")[0], "response": make_response("\\boxed{A}"),
           "reward_provenance": {"environment": "mcqa", "version": "v1", "config_hash": "stale"}}
    with serve(server.create_app()) as url:
        answer = httpx.post(f"{url}/verify", json=row, timeout=30).json()
    assert answer["reward_provenance"] == server.reward_provenance()
    assert answer["reward_provenance"]["config_hash"] != "stale"


class Flaky(VerifyRequest):
    judge_down: bool = False


class FlakyServer(ResourcesServer):
    """A judge environment stand-in whose judge fails on request."""

    async def verify(self, body: Flaky) -> VerifyResponse:
        if body.judge_down:
            raise JudgeError("judge unreachable")
        return VerifyResponse.echo(body, reward=1.0)


def test_failure_rows_carry_provenance_too():
    server = FlakyServer({"name": "flaky", "domain": "other"})
    body = {"responses_create_params": {"input": "q"}, "response": make_response("a"), "judge_down": True}
    with serve(server.create_app()) as url:
        failed = httpx.post(f"{url}/verify", json=body, timeout=10).json()
        scored = httpx.post(f"{url}/verify", json={**body, "judge_down": False}, timeout=10).json()
    assert failed["_ng_failure_class"] == "judge_failed"
    assert failed["reward_provenance"] == scored["reward_provenance"] == server.reward_provenance()
    assert failed["reward_provenance"]["environment"] == __name__  # not in resources_servers/: its module
    assert failed["reward_provenance"]["libraries"] == {"gymfleet": library_versions([])["gymfleet"]}


def test_an_environment_without_a_version_history_fails_the_conformance_check():
    server = FlakyServer({"name": "flaky", "domain": "other"})
    assert server.reward_provenance()["version"] == "v0"  # this module's docstring has no history
    rows = [{"responses_create_params": {"input": "q"}}]
    with serve(server.create_app()) as url, pytest.raises(AssertionError, match="Version history"):
        check_resources_server(url, rows)


@pytest.mark.parametrize(
    ("doc", "version"),
    [
        ("X.\n\n## Version history\n- v1: initial.\n- v2: stricter.\n", "v2"),
        ("X.\n\n## Version history\n- v1: a.\n- v2 (fix, no reward changes): b.\n", "v2"),
        ("X.\n\n## Version history\n- v1: a\n\n## Notes\n- v9: not a history entry\n", "v1"),
        ("X.\n\n## Version history\nnone yet\n", "v0"),
        ("X.\n- v3: outside the section\n", "v0"),
        (None, "v0"),
    ],
    ids=["last_entry", "annotated_entry", "next_section_ignored", "empty_section", "no_section", "no_docstring"],
)
def test_docstring_version(doc, version):
    assert docstring_version(doc) == version


def test_config_hash_ignores_where_and_how_the_server_runs_but_not_grading():
    base = build("mcqa").reward_provenance()["config_hash"]
    elsewhere = build("mcqa", host="10.0.0.7", port=18000, num_workers=4, description="moved", verify_timeout_s=9,
                      num_replicas=2, ray_resources={"num_cpus": 2})
    assert elsewhere.reward_provenance()["config_hash"] == base
    lenient = build("mcqa", grading_mode="lenient_answer_colon")
    assert lenient.reward_provenance()["config_hash"] != base
    assert config_hash({"judge_model_server": "j", "api_key": "a", "sandbox_url": "http://h:1"}) == config_hash(
        {"judge_model_server": "j", "api_key": "b", "sandbox_url": "http://other:2"})


def test_judge_environments_record_the_judge_model_prompt_version_and_seed():
    fleet = {"judge_model": {"responses_api_models": {"vllm_model": {"model": "judge-70b", "host": "127.0.0.1"}}}}
    server = build("equivalence_llm_judge", fleet, judge_model_server="judge_model",
                   judge_responses_create_params={"input": [], "seed": 7})
    judge = server.reward_provenance()["judge"]
    assert judge == {"server": "judge_model", "model": "judge-70b", "prompt_version": server.prompt_version,
                     "seed": 7}
    # A judge environment without a version attribute: its prompt files decide the prompt version.
    jailbreak = build("jailbreak_detection", fleet, judge_model_server="judge_model").reward_provenance()["judge"]
    assert jailbreak["model"] == "judge-70b" and jailbreak["prompt_version"].startswith("prompts@")
    assert jailbreak["seed"] is None


def test_every_environment_declares_its_libraries_and_has_a_version():
    envs = sorted(p.name for p in (ROOT / "resources_servers").iterdir() if (p / "app.py").is_file())
    for env in envs:
        source = (ROOT / "resources_servers" / env / "app.py").read_text()
        assert "    reward_libraries = (" in source, f"{env}/app.py declares no reward_libraries"
    assert build("structured_outputs").reward_provenance()["libraries"].keys() >= {"jsonschema", "PyYAML"}
    assert build("instruction_following").reward_provenance()["libraries"].keys() >= {"nltk", "langdetect"}


def test_provenance_diff_names_what_changed():
    now = {"version": "v2", "config_hash": "a", "libraries": {"gymfleet": "1", "sympy": "1.14"}, "judge": None}
    assert provenance_diff(now, now) == []
    assert provenance_diff({**now, "config_hash": "b"}, now) == ["config_hash"]
    assert provenance_diff({**now, "libraries": {"gymfleet": "1", "sympy": "1.13"}}, now) == ["libraries:sympy"]
    assert provenance_diff({**now, "version": "v1", "judge": {"model": "m"}}, now) == ["version", "judge"]
    assert provenance_diff(None, now) == ["no stored provenance"]


def _result(env: str, config: str, reward: float | None, failure: str | None = None, agent: str = "a") -> dict:
    row = {"reward": reward or 0.0, "agent_ref": {"name": agent},
           "reward_provenance": {"environment": env, "instance": env, "version": "v1", "config_hash": config}}
    if failure:
        row["_ng_failure_class"] = failure
    return row


def test_aggregate_metrics_count_rows_per_provenance_and_the_infra_failure_share():
    results = [_result("mcqa", "h1", 1.0), _result("mcqa", "h1", 0.0), _result("mcqa", "h2", 1.0),
               _result("mcqa", "h1", None, "judge_failed"),
               {"agent_ref": {"name": "a"}, "_ng_failure_class": "connection_error", "reward": 0.0},  # before verify
               {**_result("mcqa", "h1", None, "timeout"), "_ng_superseded": True}]
    metrics = aggregate_metrics(results)
    assert set(metrics) == {"agent_metrics", "key_metrics", "group_level_metrics"}  # NeMo-Gym's keys only
    agent = metrics["agent_metrics"]
    assert all(isinstance(value, float) for value in agent.values())  # flat numbers, as loggers expect
    assert agent["mean/reward"] == pytest.approx(2 / 3)  # failure rows are still left out
    assert agent["infra_failure_count"] == agent["infra_failure_count/mcqa"] == 2
    assert agent["infra_failure_share"] == agent["infra_failure_share/mcqa"] == pytest.approx(2 / 5)
    assert not any(key.startswith(("infra_", "provenance/")) for key in metrics["key_metrics"])
    assert {key: value for key, value in agent.items() if key.startswith("provenance/")} == {
        "provenance/mcqa/v1/h1/rows": 2, "provenance/mcqa/v1/h1/infra_failures": 1,
        "provenance/mcqa/v1/h1/mean_reward": 0.5,
        "provenance/mcqa/v1/h2/rows": 1, "provenance/mcqa/v1/h2/infra_failures": 0,
        "provenance/mcqa/v1/h2/mean_reward": 1.0,
    }
    assert infra_failures(results) == [{
        "environment": "mcqa", "agent": "a", "rollouts": 5, "infra_failures": 2, "infra_failure_share": 0.4,
        "failure_classes": {"connection_error": 1, "judge_failed": 1}}]


def test_aggregate_metrics_route_reports_provenance_of_real_answers():
    server = build("mcqa")
    rows = example_rows("mcqa")[:3]
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=30) as client:
        answers = [client.post("/verify", json={**row, "response": make_response("\\boxed{A}")}).json()
                   for row in rows]
        metrics = client.post("/aggregate_metrics", json={"verify_responses": answers}).json()
    prefix = f"provenance/mcqa/v2/{server.reward_provenance()['config_hash']}"
    agent = metrics["agent_metrics"]
    assert agent[f"{prefix}/rows"] == 3 and agent[f"{prefix}/infra_failures"] == 0
    assert agent[f"{prefix}/mean_reward"] == pytest.approx(sum(a["reward"] for a in answers) / 3)
    assert agent["infra_failure_share"] == agent["infra_failure_share/mcqa"] == 0.0
