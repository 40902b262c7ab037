"""proof_refinement_agent over real HTTP: scripted model ⇄ math_formal_lean ⇄ the stand-in Lean checker."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import pytest

from agents.proof_refinement_agent.app import ProofRefinementAgent
from gymfleet.testing import serve
from resources_servers.math_formal_lean.app import MathFormalLeanServer
from resources_servers.math_formal_lean.tests.stand_in_checker import checker_app
from responses_api_models.scripted_model.app import ScriptedModel

ROWS = [json.loads(line) for line in
        (Path(__file__).parents[3] / "resources_servers/math_formal_lean/data/example.jsonl").read_text().splitlines()]


def _answer(row: dict, body: str) -> str:
    return f"```lean4\n{row['formal_statement']}{body}\n```"


RULES = [
    # Row 1's model never learns: every answer (the correction prompt quotes the last one) fails again.
    {"match": "STUBBORN", "match_in": "last_message", "text": _answer(ROWS[1], "  exact COMPILE_ERROR -- STUBBORN")},
    # Row 0's model fixes its proof once told what failed.
    {"match": "does not compile", "match_in": "last_message", "text": _answer(ROWS[0], "  simp")},
    {"match": "Adding zero", "match_in": "last_message", "text": _answer(ROWS[0], "  exact COMPILE_ERROR")},
    {"match": "sum of the squares", "match_in": "last_message",
     "text": _answer(ROWS[1], "  exact COMPILE_ERROR -- STUBBORN")},
    {"match": "twice it is at least 6", "match_in": "last_message", "text": _answer(ROWS[2], "  CHECKER_500")},
    {"match": "3x \\+ 2 = 11", "match_in": "last_message", "text": _answer(ROWS[3], "  linarith")},
]


@contextlib.contextmanager
def _fleet(**agent_fields):
    checker = checker_app()
    model = ScriptedModel({"name": "llm", "rules": RULES})
    with serve(checker) as checker_url, serve(model.create_app()) as model_url:
        env = MathFormalLeanServer({"name": "lean", "checker_url": checker_url, "checker_max_attempts": 1})
        with serve(env.create_app()) as env_url:
            def block(kind, impl, url):
                return {kind: {impl: {"host": "127.0.0.1", "port": int(url.rsplit(":", 1)[1])}}}

            config = {"lean": block("resources_servers", "math_formal_lean", env_url),
                      "llm": block("responses_api_models", "scripted_model", model_url)}
            agent = ProofRefinementAgent({"name": "agent", "resources_server": {"type": "resources_servers",
                                                                                "name": "lean"},
                                          "model_server": "llm", **agent_fields}, config)
            with serve(agent.create_app()) as agent_url:
                yield agent_url, checker.state.requests


@pytest.fixture(scope="module")
def fleet():
    with _fleet(max_correction_turns=2) as running:
        yield running


def run(url: str, row: dict) -> dict:
    answer = httpx.post(f"{url}/run", json=row, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_failed_proof_is_corrected_and_the_last_attempt_scores(fleet):
    url, requests = fleet
    requests.clear()
    result = run(url, ROWS[0])
    assert result["reward"] == 1.0 and result["proof_status"] == "completed" and result["total_turns"] == 2
    first, second = result["all_attempts"]
    assert (first["turn_index"], first["proof_status"], first["reward"]) == (0, "failed", 0.0)
    assert (second["turn_index"], second["proof_status"], second["reward"]) == (1, "completed", 1.0)
    assert second["input"] == [{"role": "user", "content": first["correction_prompt"]}]
    assert "<error>COMPILE_ERROR</error>" in first["error_feedback"]
    assert first["generation"] in first["correction_prompt"]
    assert result["turn_index"] == 1 and result["name"] == ROWS[0]["name"], "the last verify answer, row echoed"
    compiled = [body["generated_code"] for body in requests]
    assert len(compiled) == 2 and compiled[0].endswith("COMPILE_ERROR") and compiled[1].endswith("  simp")


def test_corrections_stop_after_max_correction_turns(fleet):
    url, requests = fleet
    requests.clear()
    result = run(url, ROWS[1])
    assert result["reward"] == 0.0 and result["total_turns"] == 3 and len(requests) == 3
    assert [attempt["turn_index"] for attempt in result["all_attempts"]] == [0, 1, 2]
    assert result["needs_correction"] is True, "the environment would go on; the agent's budget stops it"


def test_a_solved_proof_takes_one_turn(fleet):
    url, _ = fleet
    result = run(url, ROWS[3])
    assert result["reward"] == 1.0 and result["total_turns"] == 1 and len(result["all_attempts"]) == 1


def test_a_checker_failure_ends_the_rollout_as_a_failure_row_not_a_correction(fleet):
    url, requests = fleet
    requests.clear()
    result = run(url, ROWS[2])
    assert result["_ng_failure_class"] == "sandbox_failed" and result["total_turns"] == 1
    assert len(requests) == 1


def test_no_corrections_and_no_attempt_log_when_configured():
    with _fleet(max_correction_turns=0, include_all_attempts=False) as (url, requests):
        result = run(url, ROWS[0])
    assert result["reward"] == 0.0 and result["total_turns"] == 1 and "all_attempts" not in result
    assert len(requests) == 1
