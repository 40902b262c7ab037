"""configs/nano3_rlvr.yaml as `ng_run` starts it: one fleet, eight environments, one rollout through each agent.

The policy is the scripted model (a real vLLM-compatible server), reached through the recipe's own `policy_model`
(`vllm_model_for_training`, token capture on), exactly as NeMo-RL would point it at vLLM.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
import yaml

from gymfleet.testing import fleet_headers, running_fleet, scripted_policy

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs/nano3_rlvr.yaml"
ENVS = ("math_with_judge", "code_gen", "instruction_following", "structured_outputs", "reasoning_gym", "calendar",
        "mcqa", "workplace_assistant")

# One reply per environment, for the first row of its data/example.jsonl (matched on the last user message), each a
# right answer; so every rollout must score 1.0 and any other reward points at the wiring. workplace_assistant is
# multi-step: the reference solution's tool call at the first turn, a closing message at the second.
SCRIPT = [
    {"match": "sum of the first 20 positive odd integers",
     "reasoning": "The first n odd numbers add up to n squared.",
     "text": "1 + 3 + ... + 39 = 20^2, so the sum is $\\boxed{400}$."},
    {"match": "largest value of a_j - a_i",
     "text": "Track the smallest value so far.\n\n```python\nn = int(input())\nbest, low = 0, None\n"
             "for x in map(int, input().split()):\n    if low is not None:\n        best = max(best, x - low)\n"
             "    low = x if low is None else min(low, x)\nprint(best)\n```"},
    {"match": "new neighbour inviting them to a weekend barbecue",
     "text": "<<Welcome to the Street>>\nHi [neighbour name], come over for a barbecue on Saturday at [time]. "
             "We will handle the grill; just bring your appetite."},
    {"match": "lentil soup",
     "text": json.dumps({"name": "Lentil soup", "servings": 4, "prep_minutes": 25, "vegetarian": True,
                         "ingredients": [{"item": "red lentils", "quantity": "250 g"},
                                         {"item": "onion", "quantity": "1"},
                                         {"item": "carrots", "quantity": "2"},
                                         {"item": "vegetable stock", "quantity": "1 litre"}]})},
    {"match": "You meet 2 inhabitants: Harper, and Victoria",
     "text": "If Harper were a hero, Victoria would be both. So <answer>Harper is a villain, and Victoria is a "
             "hero.</answer>"},
    {"match": "one-hour budget review",
     "text": '[{"event_id": 0, "event_name": "Supplier call", "start_time": "11:00", "duration": 30}, '
             '{"event_id": 1, "event_name": "Budget review", "start_time": "10:00", "duration": 60}]'},
    {"match": "shortest orbital period",
     "text": "Mercury is closest to the Sun, so its year is shortest.\n\n\\boxed{B}"},
    {"match": "Reply to Priya's latest email", "turn": 0,
     "tool_calls": [{"name": "email_reply_email",
                     "arguments": {"email_id": "00000138", "body": "Thanks, I will read it tonight."}}]},
    {"match": "Reply to Priya's latest email", "turn": 1, "text": "I replied to Priya."},
]
SCRIPTED_POLICY = scripted_policy(SCRIPT)


def _first_row(env: str) -> dict:
    return json.loads((ROOT / "resources_servers" / env / "data" / "example.jsonl").read_text().splitlines()[0])


@pytest.fixture(scope="module")
def published():
    """The running fleet's resolved config, as the head server publishes it to clients."""
    with running_fleet([str(RECIPE)], SCRIPTED_POLICY) as fleet:
        head = f"http://127.0.0.1:{fleet.config.head_port}"
        yield yaml.safe_load(httpx.get(head + "/global_config_dict_yaml", timeout=30, headers=fleet_headers()).json())


def test_recipe_lists_the_eight_environments_and_the_training_policy():
    recipe = yaml.safe_load(RECIPE.read_text())
    assert recipe["config_paths"][0] == "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
    for path in recipe["config_paths"]:
        assert (ROOT / path).is_file(), path
    envs = {Path(path).parts[1] for path in recipe["config_paths"][1:] if path.startswith("resources_servers/")}
    assert envs == set(ENVS)
    assert "sandbox/configs/sandbox.yaml" in recipe["config_paths"], "code_gen needs the sandbox in the fleet"


def test_fleet_serves_every_environment_behind_its_agent(published):
    policy = published["policy_model"]["responses_api_models"]["vllm_model"]
    assert policy["return_token_id_information"] is True
    for env in ENVS:
        agent = published[f"{env}_simple_agent"]["responses_api_agents"]["simple_agent"]
        assert agent["resources_server"]["name"] == env and agent["model_server"]["name"] == "policy_model"
    math_server = published["math_with_judge"]["resources_servers"]["math_with_judge"]
    assert math_server["should_use_judge"] is False


@pytest.mark.parametrize("env", ENVS)
def test_one_rollout_per_environment_through_its_agent(published, env):
    agent = published[f"{env}_simple_agent"]["responses_api_agents"]["simple_agent"]
    row = {**_first_row(env), "agent_ref": {"type": "responses_api_agents", "name": f"{env}_simple_agent"}}
    answer = httpx.post(f"http://{agent['host']}:{agent['port']}/run", json=row, timeout=120, headers=fleet_headers())
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert isinstance(result["reward"], float | int) and math.isfinite(result["reward"])
    assert "_ng_failure_class" not in result, result.get("failure")
    assert result["reward"] == 1.0, {key: value for key, value in result.items() if key != "responses_create_params"}
    assert result["response"]["model"] == "scripted", "the answer came from the policy through the agent"
    message = next(item for item in result["response"]["output"] if item["type"] == "message")
    assert message["generation_token_ids"], "the training policy model captured token ids"
