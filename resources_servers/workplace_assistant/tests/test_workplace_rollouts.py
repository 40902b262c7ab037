"""Whole rollouts through the real agent loop: scripted model (one tool call per turn) ⇄ simple_agent ⇄ the server.

A script replaying a row's ground-truth calls scores 1.0; a wrong call, a missing call or an extra state-changing
call scores 0.0. Run on NeMo-Gym's rows over WorkBench's tables, and on our own rows over the synthetic tables.
"""

from __future__ import annotations

import contextlib
import json
import re

import httpx
import pytest

from agents.simple_agent.app import SimpleAgent
from gymfleet.testing.fleets import agent_fleet
from resources_servers.workplace_assistant.tests.conftest import NEMO_GYM_ROWS, OWN_ROWS, WORKBENCH_CSV, make_server
from responses_api_models.scripted_model.app import ScriptedModel


def script(row: dict, calls: list[dict]) -> list[dict]:
    """Rules making `calls` one per model turn for `row`'s request, then a closing message."""
    match = re.escape(row["responses_create_params"]["input"][-1]["content"])
    rules = [{"match": match, "turn": turn, "tool_calls": [{"name": call["name"], "arguments": call["arguments"]}]}
             for turn, call in enumerate(calls)]
    return rules + [{"match": match, "turn": len(calls), "text": "Done."}]


@contextlib.contextmanager
def fleet(rules: list[dict], **env_fields):
    """Server, scripted model and simple_agent (max_steps 6, as shipped), each on its own port; yields /run's URL."""
    env = make_server(**env_fields)
    model = ScriptedModel({"name": "llm", "rules": rules})
    with agent_fleet(SimpleAgent, env, model, env_name="workplace_assistant", max_steps=6,
                     model_timeout_s=30) as agent_url:
        yield agent_url + "/run", env


def run(url: str, row: dict) -> dict:
    answer = httpx.post(url, json=row, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _variants(row: dict) -> dict[str, list[dict]]:
    """Ground truth, and three ways of getting it wrong."""
    truth = row["ground_truth"]
    first = json.loads(truth[0]["arguments"])
    wrong = dict(first)
    key = "body" if "body" in first else "new_value" if "new_value" in first else next(iter(first))
    wrong[key] = "something else entirely"
    if truth[0]["name"].endswith("delete_customer"):  # deleting another customer is the wrong call here
        wrong = {"customer_id": "00000001"}
    extra = {"name": "calendar_delete_event", "arguments": json.dumps({"event_id": "00000001"})}
    return {
        "ground_truth": truth,
        "wrong_call": [{"name": truth[0]["name"], "arguments": json.dumps(wrong)}, *truth[1:]],
        "missing_call": truth[:-1],
        "extra_call": [*truth, extra],
    }


def _cases(rows: list[dict], label: str) -> list:
    expected = {"ground_truth": 1.0, "wrong_call": 0.0, "missing_call": 0.0, "extra_call": 0.0}
    return [pytest.param(row, variant, expected[variant], id=f"{label}-{row['id']}-{variant}")
            for row in rows for variant in expected]


def _rollout(row: dict, calls: list[dict], **env_fields) -> dict:
    with fleet(script(row, calls), **env_fields) as (url, env):
        result = run(url, row)
        assert len(env.sessions) == 0, "the session was dropped at /verify"
    return result


@pytest.mark.parametrize("row, variant, reward", _cases(NEMO_GYM_ROWS, "nemo_gym"))
def test_nemo_gym_rows_on_workbench_tables(row, variant, reward):
    calls = _variants(row)[variant]
    result = _rollout(row, calls, data_dir=str(WORKBENCH_CSV))
    made = [item for item in result["response"]["output"] if item["type"] == "function_call"]
    assert [item["name"] for item in made] == [call["name"] for call in calls], "every call went through the agent"
    outputs = [item["output"] for item in result["response"]["output"] if item["type"] == "function_call_output"]
    assert all(output.startswith('{"output":') for output in outputs), outputs
    assert result["reward"] == reward, result["tables_differing"]
    assert (result["tables_differing"] == []) == (reward == 1.0)


@pytest.mark.parametrize("row, variant, reward", _cases(OWN_ROWS, "own"))
def test_own_rows_on_the_synthetic_tables(row, variant, reward):
    result = _rollout(row, _variants(row)[variant])
    assert result["reward"] == reward, result["tables_differing"]


def test_reply_rollout_reads_the_reference_wording():
    row = NEMO_GYM_ROWS[0]
    result = _rollout(row, row["ground_truth"], data_dir=str(WORKBENCH_CSV))
    outputs = [item["output"] for item in result["response"]["output"] if item["type"] == "function_call_output"]
    assert outputs == ['{"output":"Email replied successfully."}']
