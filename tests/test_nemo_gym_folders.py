"""NeMo-Gym's own environment folders, unchanged, served by gymfleet through the `nemo_gym` surface.

The folders come from NeMo-Gym 0.7.0's published wheel (`gymfleet.testing.nemo_gym_wheel`), copied at test time into
a scratch tree (`gymfleet.testing.nemo_gym_folders.stage_folder`); each is built by `ng_run`'s own launcher
(`gymfleet.fleet.launch.build_server`, its entrypoint given by absolute path) and served on a real port. Real
`/seed_session`, tool routes, `/verify` and `/aggregate_metrics` calls use the folders' own example rows, and their
recorded rollouts (`data/example_rollouts.jsonl`) replayed through `/verify` must score the reward NeMo-Gym recorded.
The judge is `scripted_model` (a real server); a dead judge must give a `judge_failed` row, never a reward. One
fleet test starts folders under `ng_run`'s supervisor and kills one; the folders' own shipped tests run on this
surface through `ng_test +entrypoint=<folder>`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gymfleet.errors import ConfigError
from gymfleet.fleet.config import ServerInstance
from gymfleet.fleet.launch import build_server
from gymfleet.testing import fleet_headers, free_port, running_fleet, serve, wait_until
from gymfleet.testing.nemo_gym_folders import stage_folder
from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder, nemo_gym_wheel
from responses_api_models.scripted_model.app import ScriptedModel

REPLAYED = ["mcqa", "string_match", "equivalence_rule", "example_multi_step", "example_tool_call_multireward",
            "math_with_judge"]
"""Folders whose recorded rollouts are replayed: stateless rewards, Python and PyPI only."""
FOLDERS = [*REPLAYED, "example_session_state_mgmt"]
JUDGE_SCRIPT = {
    "name": "judge",
    "rules": [{"match": "SAME_VALUE", "text": "They are the same. [[A=B]]"}],
    "default": {"text": "They differ. [[A!=B]]"},
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nemo_gym_tree")
    for name in FOLDERS:
        stage_folder(nemo_gym_folder(name), root)
    return root


def folder_fields(root: Path, name: str) -> dict[str, Any]:
    """The folder's own instance fields (from its `configs/<name>.yaml`), its entrypoint made absolute."""
    configs = root / "resources_servers" / name / "configs"
    path = configs / f"{name}.yaml" if (configs / f"{name}.yaml").is_file() else sorted(configs.glob("*.yaml"))[0]
    config = yaml.safe_load(path.read_text())
    block = next(value for value in config.values() if "resources_servers" in value)
    fields = dict(next(iter(block["resources_servers"].values())))
    fields["entrypoint"] = str(root / "resources_servers" / name / "app.py")
    return {**fields, "host": "127.0.0.1", "port": 0}


@contextmanager
def served(root: Path, name: str, fields: dict[str, Any] | None = None,
           global_config: dict[str, Any] | None = None) -> Iterator[str]:
    """Build folder `name` as `ng_run`'s launcher does and serve it; yields its URL."""
    instance = ServerInstance(name=f"ng_{name}", server_type="resources_servers", impl=name,
                              fields={**folder_fields(root, name), **(fields or {})})
    server = build_server(instance, global_config or {})
    with serve(server.create_app()) as url:
        yield url


def rows(root: Path, name: str, file: str) -> list[dict[str, Any]]:
    path = root / "resources_servers" / name / "data" / file
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _prompt_key(row: dict[str, Any]) -> str:
    prompt = row["responses_create_params"]["input"]
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return json.dumps([(item.get("role"), item.get("content")) for item in messages], sort_keys=True)


def recorded_rollouts(root: Path, name: str) -> list[tuple[dict[str, Any], float]]:
    """`(verify request, recorded reward)` per recorded rollout: its example row (matched by prompt: NeMo-Gym
    records only the response model's fields, so task fields such as `options` come from `example.jsonl`) with the
    recorded `response`."""
    examples = {_prompt_key(row): row for row in rows(root, name, "example.jsonl")}
    return [({**examples[_prompt_key(rollout)], "response": rollout["response"]}, rollout["reward"])
            for rollout in rows(root, name, "example_rollouts.jsonl")]


def model_config(name: str, url: str) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    return {name: {"responses_api_models": {"scripted_model": {"host": host, "port": int(port)}}}}


STALE_RECORDINGS = {
    ("mcqa", 2): "recorded before 0.7.0's boxed-letter parsing: `\\boxed{C: <option text>}` was extracted_answer None "
                 "(reward 0); 0.7.0's mcqa/app.py extracts C (reward 1)",
}
"""Recorded rollouts whose reward the folder's own 0.7.0 code no longer gives (the recording predates it). For these
the test asserts that the served `/verify` gives what the folder's `verify` gives called in process, and that the
recording still disagrees (so this table cannot outlive the reason)."""
MACHINE_BOUND = {
    ("math_with_judge", 1): "math-verify needs ~12 CPU seconds to prove this pair equal (a 4033rd power), past "
                            "its own 5 s bound inside the folder's verifier on a busy machine: then reward 0 by the "
                            "folder's rule, else the recorded 1",
}
"""Recorded rollouts whose reward depends on the machine's speed: the served reward is the recorded one or 0.0."""


def load_folder_class(root: Path, name: str) -> Any:
    """The folder's server class, from its `app.py` imported afresh under a name of its own."""
    import importlib.util

    from gymfleet.serving.nemo_gym_server import nemo_gym_server_classes

    spec = importlib.util.spec_from_file_location(f"direct_{name}", root / "resources_servers" / name / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    (cls,) = nemo_gym_server_classes(module)
    return cls


def folder_verify_in_process(root: Path, name: str, row: dict[str, Any]) -> float:
    """The reward the folder's own `verify` gives `row`, called directly (no HTTP, no gymfleet host)."""
    import asyncio

    from nemo_gym.server_utils import ServerClient

    cls = load_folder_class(root, name)
    config_class = cls.model_fields["config"].annotation
    folder = cls(config=config_class.model_validate({**folder_fields(root, name), "name": name}),
                 server_client=ServerClient())
    request_model = next(hint for key, hint in typing.get_type_hints(cls.verify).items() if key != "return")
    return asyncio.run(folder.verify(request_model.model_validate(row))).reward


def echoes_undeclared_fields(root: Path, name: str) -> bool:
    """Whether the folder's verify response model keeps fields it does not declare (`extra="allow"`)."""
    answer = typing.get_type_hints(load_folder_class(root, name).verify)["return"]
    return answer.model_config.get("extra") == "allow"


@pytest.mark.parametrize("name", REPLAYED)
def test_recorded_rollouts_score_their_recorded_reward(tree, name):
    recorded = recorded_rollouts(tree, name)
    assert len(recorded) == 5, f"{name} ships 5 recorded rollouts"
    dead_judge = model_config("policy_model", f"http://127.0.0.1:{free_port()}")  # config only: never called
    echoes = echoes_undeclared_fields(tree, name)
    with served(tree, name, global_config=dead_judge) as url:
        for index, (row, reward) in enumerate(recorded):
            answer = httpx.post(f"{url}/verify", json={**row, "zz_not_declared": 1}, timeout=600)
            assert answer.status_code == 200, answer.text
            result = answer.json()
            if (name, index) in STALE_RECORDINGS:
                assert result["reward"] != pytest.approx(reward), f"no longer stale: {(name, index)}"
                assert result["reward"] == folder_verify_in_process(tree, name, row)
            elif (name, index) in MACHINE_BOUND:
                assert result["reward"] in (pytest.approx(reward), 0.0)
            else:
                assert result["reward"] == pytest.approx(reward), f"{name} row {index}"
            assert ("zz_not_declared" in result) == echoes, "the answer holds the response model's fields only"
            assert "_ng_failure_class" not in result
            provenance = result["reward_provenance"]
            assert provenance["environment"] == name and provenance["instance"] == f"ng_{name}"
            assert provenance["version"].startswith("folder@") and len(provenance["config_hash"]) == 16
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert f'gymfleet_verify_results_total{{environment="ng_{name}"' in metrics


def test_folder_content_is_the_version(tree, tmp_path):
    copy = stage_folder(tree / "resources_servers" / "mcqa", tmp_path)
    with served(tmp_path, "mcqa") as url:
        before = httpx.get(f"{url}/reward_provenance", timeout=10).json()
    (copy / "app.py").write_text((copy / "app.py").read_text() + "\n# changed\n")
    with served(tmp_path, "mcqa") as url:
        after = httpx.get(f"{url}/reward_provenance", timeout=10).json()
    assert before["version"] != after["version"] and before["config_hash"] == after["config_hash"]


def test_session_cookies_carry_state_between_seed_tools_and_verify(tree):
    row = rows(tree, "example_session_state_mgmt", "example.jsonl")[0]
    with served(tree, "example_session_state_mgmt") as url:
        seeded = httpx.post(f"{url}/seed_session", json=row, timeout=30)
        assert seeded.status_code == 200 and seeded.json() == {}
        cookies = dict(seeded.cookies)
        assert list(cookies) == ["StatefulCounterResourcesServer___ng_example_session_state_mgmt"], "NeMo-Gym's name"
        missing = row["expected_count"] - row["initial_count"]
        tool = httpx.post(f"{url}/increment_counter", json={"count": missing}, cookies=cookies, timeout=30)
        assert tool.json() == {"success": True}
        count = httpx.post(f"{url}/get_counter_value", cookies=cookies, timeout=30).json()
        assert count == {"count": row["expected_count"]}
        response = {"id": "r", "output": [], "created_at": 0, "model": "m", "object": "response"}
        scored = httpx.post(f"{url}/verify", json={**row, "response": response}, cookies=cookies, timeout=30).json()
        assert scored["reward"] == 1.0
        fresh = httpx.post(f"{url}/verify", json={**row, "response": response}, timeout=30).json()
        assert fresh["reward"] == 0.0, "another session starts from nothing"
        bad = httpx.post(f"{url}/increment_counter", json={"count": "many"}, cookies=cookies, timeout=30)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "count"]


def test_tool_routes_answer_with_the_folders_models(tree):
    with served(tree, "example_multi_step") as url:
        value = httpx.post(f"{url}/get_synonym_value", json={"synonym": "Warm"}, timeout=30)
        assert value.json() == {"synonym_value": sum(map(ord, "Warm"))}
    with served(tree, "example_tool_call_multireward") as url:
        weather = httpx.post(f"{url}/get_weather", json={"city": "Oslo"}, timeout=30)
        assert weather.status_code == 200 and "Oslo" in json.dumps(weather.json())
        assert httpx.get(f"{url}/reverify_mode", timeout=10).json() == "unknown"


def test_aggregate_metrics_use_the_folders_compute_metrics_and_key_metrics(tree):
    recorded = recorded_rollouts(tree, "mcqa")
    with served(tree, "mcqa") as url:
        scored = [httpx.post(f"{url}/verify", json=row, timeout=60).json() for row, _ in recorded]
        for index, row in enumerate(scored):
            row["_ng_task_index"], row["_ng_rollout_index"] = index // 2, index % 2
        answer = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": scored}, timeout=60).json()
    expected_pass1 = 100.0 * sum(row["reward"] for row in scored) / len(scored)
    agent = answer["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(expected_pass1 / 100)
    assert "pass@1[avg-of-2]/accuracy" in agent and "majority@2/accuracy" in agent, "mcqa's compute_metrics"
    assert set(answer["key_metrics"]) >= {"mean/reward", "pass@1[avg-of-2]/accuracy", "majority@2/accuracy"}
    assert "pass@1[avg-of-1]/accuracy" not in answer["key_metrics"], "mcqa's get_key_metrics keeps the highest k"


def _math_row(expected: str, answer: str, question: str) -> dict[str, Any]:
    output = [{"id": "m", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": f"The answer is \\boxed{{{answer}}}", "annotations": []}]}]
    return {"responses_create_params": {"input": [{"role": "user", "content": question}]},
            "question": question, "expected_answer": expected,
            "response": {"id": "r", "output": output, "created_at": 0, "model": "m", "object": "response"}}


def test_a_judge_folder_calls_the_fleets_judge_and_a_dead_judge_is_a_failure_row(tree):
    judge_fields = {"should_use_judge": True, "judge_model_server": {"type": "responses_api_models", "name": "judge"}}
    with serve(ScriptedModel(JUDGE_SCRIPT).create_app()) as judge_url:
        with served(tree, "math_with_judge", judge_fields, model_config("judge", judge_url)) as url:
            same = httpx.post(f"{url}/verify", json=_math_row("1/2", "0.5 wrong", "SAME_VALUE?"), timeout=60).json()
            differ = httpx.post(f"{url}/verify", json=_math_row("1/2", "3", "Which?"), timeout=60).json()
    assert same["reward"] == 1.0 and len(same["judge_evaluations"]) == 2, "asked in both orders, both said A=B"
    assert differ["reward"] == 0.0 and differ["library_reward"] == 0.0
    dead = model_config("judge", f"http://127.0.0.1:{free_port()}")
    with served(tree, "math_with_judge", judge_fields, dead) as url:
        failed = httpx.post(f"{url}/verify", json=_math_row("1/2", "3", "Which?"), timeout=120)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert failed.status_code == 200
    row = failed.json()
    assert row["_ng_failure_class"] == "judge_failed" and row["mask_sample"] is True
    assert row["failure_kind"] == "judge_failed" and "cannot reach" in row["failure_reason"]
    assert "reward_provenance" in row
    assert 'gymfleet_failures_total{failure_class="judge_failed"' in metrics


def test_a_bad_folder_config_names_the_instance_and_field(tree):
    with pytest.raises(ConfigError, match=r"ng_math_with_judge\.judge_model_server: Input should be .* \(got 'not a"):
        with served(tree, "math_with_judge", {"judge_model_server": "not a reference"}):
            pass


def _fleet_config(root: Path, path: Path) -> Path:
    config = {}
    for name in ("mcqa", "example_session_state_mgmt"):
        fields = folder_fields(root, name)
        fields.pop("host"), fields.pop("port")
        config[f"ng_{name}"] = {"resources_servers": {name: fields}}
    path.write_text(yaml.safe_dump(config))
    return path


POLICY_SCRIPT = {"rules": [{"match": "cystic fibrosis", "text": "It is PCR. \\boxed{B}"},
                           {"match": "playing Blackjack", "match_in": "transcript", "text": "<action>stand</action>"}],
                 "default": {"text": "\\boxed{A}"}}
"""The policy for mcqa's first two example rows (the first answered right, B, the second wrong) and for blackjack
(it stands)."""


@pytest.fixture(scope="module")
def fleet(tree):
    """One `ng_run` fleet: mcqa and example_session_state_mgmt from the tree, NeMo-Gym's own simple_agent from the tree
    (its config inside its folder, as the wheel ships it) and gymfleet's simple_agent, both on mcqa, the wheel's
    blackjack with the agent its config names, NeMo-Gym's gymnasium_agent (gymfleet has none of that name), and a
    scripted policy model."""
    agent = tree / "responses_api_agents" / "simple_agent"
    shutil.copytree(nemo_gym_wheel() / "responses_api_agents" / "simple_agent", agent,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    mcqa = {"type": "resources_servers", "name": "ng_mcqa"}
    policy = {"type": "responses_api_models", "name": "policy_model"}
    extra = {
        "folder_requirements": "venv",
        "simple_agent": {"responses_api_agents": {"simple_agent": {"resources_server": mcqa}}},  # its `???`
        "gymfleet_agent": {"responses_api_agents": {"simple_agent": {
            "entrypoint": "app.py", "resources_server": mcqa, "model_server": policy}}},
        "policy_model": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py", **POLICY_SCRIPT}}},
    }
    configs = [str(_fleet_config(tree, tree / "fleet.yaml")), str(agent / "configs" / "simple_agent.yaml"),
               str(nemo_gym_folder("blackjack") / "configs" / "blackjack.yaml")]  # and its gymnasium_agent
    with running_fleet(configs, extra) as started:
        yield started


def test_nemo_gyms_own_simple_agent_runs_beside_gymfleets_with_the_same_rewards(tree, fleet):
    token = fleet_headers(fleet)
    nemo_gym_agent = fleet.config.instance("simple_agent")
    assert nemo_gym_agent.folder == tree / "responses_api_agents" / "simple_agent", "the tree's agent, not gymfleet's"
    examples = rows(tree, "mcqa", "example.jsonl")[:2]
    rewards = {}
    for name in ("simple_agent", "gymfleet_agent"):
        url = fleet.config.instance(name).url
        for index, row in enumerate(examples):
            answer = httpx.post(f"{url}/run", json=row, headers=token, timeout=120)
            assert answer.status_code == 200, answer.text
            result = answer.json()
            assert "_ng_failure_class" not in result and result["response"]["output"], result
            rewards[name, index] = result["reward"]
    assert rewards["simple_agent", 0] == rewards["gymfleet_agent", 0] == 1.0
    assert rewards["simple_agent", 1] == rewards["gymfleet_agent", 1] == 0.0

    url = nemo_gym_agent.url  # 0.7.0's agent-session lifecycle over HTTP: idempotent seed, bound id, kept close
    seed = {"agent_session_id": "s1", "episode_id": {"rollout_id": "r1"},
            "task_id": {"taskset": "mcqa", "task_id": "0"}}
    with httpx.Client(headers=token, timeout=30) as client:
        assert client.post(f"{url}/v1/agent_sessions", json=seed).json() == {"agent_session_id": "s1"}
        assert client.post(f"{url}/v1/agent_sessions", json=seed).status_code == 200, "the same seed again: reused"
        other = {**seed, "task_id": {"taskset": "mcqa", "task_id": "1"}}
        assert client.post(f"{url}/v1/agent_sessions", json=other).status_code == 409
        close = {"agent_session_id": "s1", "episode_id": {"rollout_id": "r1"}}
        closed = client.post(f"{url}/v1/agent_sessions/close", json=close)
        assert closed.status_code == 200 and closed.json()["agent_session_id"] == "s1"
        assert client.post(f"{url}/v1/agent_sessions/close", json=close).json() == closed.json(), "kept for retries"
        assert client.post(f"{url}/v1/agent_sessions", json=seed).status_code == 409, "closed: never seeded again"


def test_nemo_gyms_gymnasium_agent_plays_a_gymnasium_folders_episode(fleet):
    agent = fleet.config.instance("blackjack_gymnasium_agent")
    assert agent.folder == nemo_gym_folder("blackjack").parents[1] / "responses_api_agents" / "gymnasium_agent"
    row = rows(nemo_gym_folder("blackjack").parents[1], "blackjack", "example.jsonl")[0]
    answer = httpx.post(f"{agent.url}/run", json=row, headers=fleet_headers(fleet), timeout=120)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert "_ng_failure_class" not in result and result["reward"] in (-1.0, 0.0, 1.0), result
    assert "<action>stand</action>" in json.dumps(result["response"]["output"]), "the policy's move was played"


def test_folders_start_under_ng_run_and_come_back_after_a_crash(tree, fleet):
    recorded, reward = recorded_rollouts(tree, "mcqa")[0]
    session_row = rows(tree, "example_session_state_mgmt", "example.jsonl")[0]
    token = fleet_headers(fleet)
    mcqa = fleet.config.instance("ng_mcqa").url
    counter = fleet.config.instance("ng_example_session_state_mgmt").url
    assert httpx.post(f"{mcqa}/verify", json=recorded, timeout=60, headers=token).json()["reward"] == reward
    cookies = dict(httpx.post(f"{counter}/seed_session", json=session_row, timeout=30, headers=token).cookies)

    for name in ("ng_example_session_state_mgmt", "ng_mcqa"):
        process = fleet.children[name].process
        process.kill()
        process.wait(10)
    table = fleet.process_table
    wait_until(lambda: all((row["status"], row["restarts"]) == ("running", 1)
                           for instance, row in table().items() if instance.startswith("ng_")), "both back once")
    assert httpx.post(f"{mcqa}/verify", json=recorded, timeout=60, headers=token).json()["reward"] == reward
    lost = httpx.post(f"{counter}/increment_counter", json={"count": 1}, cookies=cookies, timeout=30,
                      headers=token)
    assert lost.status_code == 410 and lost.json()["error_type"] == "session_lost", "never a reward on nothing"


OWN_TESTS = ["example_session_state_mgmt", "equivalence_rule",
             "example_single_tool_call",  # nemo_gym.testing.session_conformance
             "equivalence_llm_judge",  # GlobalConfigDictParser over its tree's benchmarks/ config
             "deepswe"]  # nemo_gym.sandbox types, provider config and cpu_cap_env
"""Folders whose own shipped tests run here, one of each kind of surface they need (a few seconds each)."""


@pytest.mark.parametrize("name", OWN_TESTS)
def test_ng_test_runs_a_folders_own_tests_on_the_surface(name):
    folder = nemo_gym_folder(name)  # in the wheel's tree, as a NeMo-Gym checkout has it
    done = subprocess.run([sys.executable, "-m", "gymfleet.cli.test", f"+entrypoint={folder}",
                           "+pytest_args=[-q,-p,no:warnings]"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_genrm_compares_own_http_lifecycle_tests_serve_nemo_gyms_simple_agent():
    """genrm_compare's own tests that serve NeMo-Gym's simple_agent over TCP beside the folder and read
    `nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT` (6 of its 24): a failed `/verify` through `/run`, the folder's own
    judge retries on an answer (a 503, handed back within its 0.2 s deadline) and on a body that broke off
    (`ClientPayloadError`), and a client disconnect that cancels the handler."""
    folder = nemo_gym_folder("genrm_compare")
    chosen = "test_http_lifecycle and (incomplete or 503 or interrupted or disconnect)"
    done = subprocess.run([sys.executable, "-m", "gymfleet.cli.test", f"+entrypoint={folder}",
                           f"+pytest_args=[-q,-p,no:warnings,-k,'{chosen}']"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^6 passed", done.stdout, re.MULTILINE) and " failed" not in done.stdout, done.stdout[-3000:]

