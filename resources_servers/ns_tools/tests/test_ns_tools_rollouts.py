r"""Whole rollouts through the real agent loop: scripted model ⇄ simple_agent ⇄ ns_tools ⇄ sandbox, math_with_judge.

The model builds a value over three tool calls (the third reads what the first two defined), then boxes an answer
only if the tool's last output reached it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from agents.simple_agent.app import SimpleAgent
from gymfleet.testing import serve
from gymfleet.testing.fleets import agent_fleet, server_block
from resources_servers.math_with_judge.app import MathWithJudgeServer
from resources_servers.ns_tools.app import NsToolsServer
from responses_api_models.scripted_model.app import ScriptedModel

ROW = json.loads((Path(__file__).parents[1] / "data/example.jsonl").read_text().splitlines()[0])  # gold: 130
CALLS = [
    "multiples = [k for k in range(1, 1000) if k % 7 == 0]",
    "count = sum(1 for k in multiples if k % 11)",
    "print(count)",
]
WRONG_ROW = {**ROW, "id": "asked-again", "responses_create_params": {
    **ROW["responses_create_params"],
    "input": [{"role": "user", "content": ROW["responses_create_params"]["input"][0]["content"] + " (asked again)"}]}}
FINAL_TEXTS = {ROW["id"]: r"The tool counted them: \boxed{130}.",
               WRONG_ROW["id"]: r"I will trust my head instead: \boxed{142}."}


def script(row: dict) -> list[dict]:
    """Three tool calls, one per turn; then the row's final text, but only if the last tool output was exactly 130
    (the transcript joins every message's text with newlines: the prompt, the turns, and the tool outputs)."""
    prompt = re.escape(row["responses_create_params"]["input"][0]["content"])
    rules = [{"match": prompt + r"\Z", "turn": turn, "tool_calls": [{"name": "stateful_python_code_exec",
                                                                     "arguments": {"code": code}}]}
             for turn, code in enumerate(CALLS)]
    return rules + [{"match": prompt + r"\n.*\n130\Z", "match_in": "transcript", "turn": len(CALLS),
                     "text": FINAL_TEXTS[row["id"]]}]


@pytest.fixture(scope="module")
def fleet(sandbox_url):
    """math_with_judge, ns_tools, the scripted model and simple_agent (max_steps 50, as shipped); yields /run's URL."""
    math = MathWithJudgeServer({"name": "math_with_judge", "domain": "math"})
    rules = script(ROW) + script(WRONG_ROW)
    model = ScriptedModel({"name": "llm", "rules": rules, "default": {"text": "I could not run the code."}})
    with serve(math.create_app()) as math_url:
        env = NsToolsServer({"name": "ns_tools", "domain": "agent", "sandbox_url": sandbox_url, "memory_mb": 256},
                            {"math_with_judge": server_block("resources_servers", "math_with_judge", math_url)})
        with agent_fleet(SimpleAgent, env, model, env_name="ns_tools", max_steps=50, model_timeout_s=30) as url:
            yield url + "/run", env


@pytest.mark.parametrize("row, reward", [(ROW, 1.0), (WRONG_ROW, 0.0)],
                         ids=["boxes-the-tools-answer", "boxes-a-wrong-answer"])
def test_a_rollout_with_three_tool_calls(fleet, row, reward):
    url, env = fleet
    answer = httpx.post(url, json=row, timeout=120)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert not env.rollouts, "the rollout's session was closed at /verify"
    outputs = [item["output"] for item in result["response"]["output"] if item["type"] == "function_call_output"]
    assert outputs == ["", "", "130"]
    assert result["response"]["output"][-1]["content"][0]["text"] == FINAL_TEXTS[row["id"]]
    assert result["reward"] == reward and result["delegated_response"]["reward"] == reward
    assert result["num_tool_calls"] == 3 and result["tool_timeout_count"] == 0
    assert result["total_tool_execution_time_seconds"] > 0
