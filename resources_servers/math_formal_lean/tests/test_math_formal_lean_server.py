"""math_formal_lean over real HTTP: the server (uvicorn) against a stand-in Lean checker (uvicorn) speaking
NeMo-Skills' `/execute`; verdicts, what reaches the checker, and every way the checker can fail."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gymfleet.errors import ConfigError
from gymfleet.testing import make_response, serve
from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder
from resources_servers.math_formal_lean.app import MathFormalLeanServer
from resources_servers.math_formal_lean.tests.stand_in_checker import checker_app

ROWS = [json.loads(line) for line in (Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()]
ROW = ROWS[0]  # theorem nat_add_zero_self (n : ℕ) : n + 0 = n := by


@pytest.fixture(scope="module")
def checker():
    app = checker_app(hang_s=5)
    with serve(app) as url:
        yield app, url


def _server(**fields):
    return MathFormalLeanServer({"name": "math_formal_lean", "domain": "math", **fields})


@pytest.fixture(scope="module")
def url(checker):
    with serve(_server(checker_url=checker[1], compilation_timeout=7, checker_max_attempts=2).create_app()) as url:
        yield url


@pytest.fixture
def requests(checker):
    checker[0].state.requests.clear()
    return checker[0].state.requests


def verify(url: str, text: str, row: dict | None = None) -> dict:
    answer = httpx.post(f"{url}/verify", json={**(row or ROW), "response": make_response(text)}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def lean(body: str, statement: str = "theorem nat_add_zero_self (n : ℕ) : n + 0 = n := by") -> str:
    return f"Plan: simplify.\n\n```lean4\nimport Mathlib\n\n{statement}\n{body}\n```"


def test_a_compiling_proof_scores_one_and_the_checker_gets_the_rows_statement(url, requests):
    result = verify(url, lean("  simp"))
    assert result["reward"] == 1.0 and result["proof_status"] == "completed"
    assert result["predicted_proof"] == ROW["header"] + ROW["formal_statement"] + "  simp"
    assert result["compiler_output"] == {"process_status": "completed", "stdout": "", "stderr": ""}
    assert result["needs_correction"] is False and result["reason"] is None
    assert requests == [{"generated_code": result["predicted_proof"], "language": "lean4", "timeout": 7,
                         "max_output_characters": 1000}]


def test_an_altered_statement_is_not_what_gets_proved(url, requests):
    result = verify(url, lean("  trivial", statement="theorem nat_add_zero_self : True := by"))
    assert result["predicted_proof"] == ROW["header"] + ROW["formal_statement"] + "  trivial"
    assert requests[0]["generated_code"].count("theorem") == 1


@pytest.mark.parametrize(("body", "status", "reason"), [
    ("  exact COMPILE_ERROR", "failed", "the proof does not compile"),
    ("  SLOW_PROOF", "timeout", "compiling took longer than the time limit"),
    ("  simp -- SORRY_WARNING", "has_sorry", "the compiler reports a sorry"),
])  # fmt: skip
def test_model_faults_score_zero_with_a_reason_and_feedback(url, body, status, reason):
    text = lean(body)
    result = verify(url, text)
    assert result["reward"] == 0.0 and result["proof_status"] == status and result["reason"] == reason
    assert "_ng_failure_class" not in result
    assert result["needs_correction"] is True and result["error_feedback"]
    assert text in result["correction_prompt"] and result["error_feedback"] in result["correction_prompt"]
    if status == "failed":
        assert "  exact <error>COMPILE_ERROR</error>" in result["error_feedback"]


@pytest.mark.parametrize(("text", "status", "forbidden"), [
    ("", "empty_generation", []),
    ("   \n", "empty_generation", []),
    ("```lean4\ntheorem nat_add_zero_self (n : ℕ) : n + 0 = n := by\n```", "no_proof", []),
    (lean("  sorry"), "forbidden", ["sorry"]),
    (lean("  exact «sorryAx» _ true"), "forbidden", ["sorryAx"]),
    (lean("  ѕorry"), "forbidden", ["sorry"]),
    (lean("  admit\n  exact (s!\"{sorryAx Nat true}\")"), "forbidden", ["admit", "sorryAx"]),
    ("```lean4\naxiom cheat : False\ntheorem nat_add_zero_self (n : ℕ) : n + 0 = n := by\n  exact cheat.elim\n```\n"
     "```lean4\nrun_tac pure ()\n```", "forbidden", ["run_tac"]),
    (lean("  simp\n#eval IO.println 1"), "forbidden", ["#eval"]),
])  # fmt: skip
def test_refused_without_compiling(url, requests, text, status, forbidden):
    result = verify(url, text)
    assert result["reward"] == 0.0 and result["proof_status"] == status and result["forbidden"] == forbidden
    assert result["needs_correction"] is True and result["correction_prompt"]
    assert requests == [], "nothing reached the checker"


def test_sorry_in_comments_and_strings_is_compiled_and_scores(url, requests):
    result = verify(url, lean('  -- no sorry needed\n  /- sorry -/\n  have : "sorry" = "sorry" := rfl\n  simp'))
    assert result["reward"] == 1.0 and result["forbidden"] == [] and len(requests) == 1


def test_a_statement_without_its_assignment_is_a_422_naming_the_field(url):
    row = {**ROW, "formal_statement": "theorem t : True"}
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response("  trivial")}, timeout=30)
    assert answer.status_code == 422 and "formal_statement" in answer.text


# --- the checker's failures are infrastructure, never a reward ----------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("body", "attempts", "says"), [
    ("  exact CHECKER_500", 2, "HTTP 500"),       # retried, then failed
    ("  exact CHECKER_ERROR", 1, "could not compile (process_status 'error')"),
    ("  exact CHECKER_GARBAGE", 1, "without a process_status"),
])  # fmt: skip
def test_a_failing_checker_is_a_sandbox_failed_row(url, requests, body, attempts, says):
    result = verify(url, lean(body))
    assert result["_ng_failure_class"] == "sandbox_failed", result
    assert says in result["failure"]
    assert len(requests) == attempts


def test_a_checker_past_its_deadline_is_sandbox_failed_and_not_retried(checker, requests):
    server = _server(checker_url=checker[1], checker_timeout_s=1, checker_max_attempts=3)
    with serve(server.create_app()) as url:
        result = verify(url, lean("  exact HANG_CHECKER"))
    assert result["_ng_failure_class"] == "sandbox_failed" and "within 1s" in result["failure"]
    assert len(requests) == 1, "a compile that may still be running is not sent again"


def test_a_checker_that_is_down_is_sandbox_failed(checker):
    server = _server(sandbox_host="127.0.0.1", sandbox_port=_closed_port(), checker_max_attempts=2)
    with serve(server.create_app()) as url:
        result = verify(url, lean("  simp"))
        assert result["_ng_failure_class"] == "sandbox_failed" and "cannot reach" in result["failure"]
        # the empty answer needs no checker: still scored
        assert verify(url, "")["reward"] == 0.0


def test_nemo_gyms_environment_variables_name_the_checker(checker, requests, monkeypatch):
    host, port = re.match(r"http://(.+):(\d+)", checker[1]).groups()
    monkeypatch.setenv("NEMO_SKILLS_SANDBOX_HOST", host)
    monkeypatch.setenv("NEMO_SKILLS_SANDBOX_PORT", port)
    with serve(_server().create_app()) as url:
        assert verify(url, lean("  simp"))["reward"] == 1.0
    assert len(requests) == 1
    monkeypatch.setenv("NEMO_SKILLS_SANDBOX_PORT", "six thousand")
    with pytest.raises(ConfigError, match="NEMO_SKILLS_SANDBOX_PORT='six thousand' is not a port number"):
        _server()


def test_a_checker_named_by_instance_reference(checker, requests):
    host, port = re.match(r"http://(.+):(\d+)", checker[1]).groups()
    fleet = {"lean_checker": {"checker_servers": {"nemo_skills": {"host": host, "port": int(port)}}}}
    server = MathFormalLeanServer({"name": "math_formal_lean", "checker": {"type": "checker_servers",
                                                                          "name": "lean_checker"}}, fleet)
    with serve(server.create_app()) as url:
        assert verify(url, lean("  simp"))["reward"] == 1.0
    assert len(requests) == 1


@pytest.mark.parametrize(("fields", "says"), [
    ({"restate_formal_statement": False}, "restate_formal_statement"),
    ({"refinement_prompt_template": "fix {proof}"}, "refinement_prompt_template"),
    ({"extract_code_mode": "middle"}, "extract_code_mode"),
    ({"sandbox_hostname": "x"}, "sandbox_hostname"),
])  # fmt: skip
def test_bad_config_names_the_field(fields, says):
    with pytest.raises(ValidationError) as error:
        _server(**fields)
    assert says in str(error.value)


def test_a_custom_correction_prompt(checker):
    server = _server(checker_url=checker[1], refinement_prompt_template="Fix:\n{proof_attempt}\n--\n{error_message}")
    with serve(server.create_app()) as url:
        result = verify(url, lean("  exact COMPILE_ERROR"))
    assert result["correction_prompt"].startswith("Fix:\nPlan: simplify.")


# --- NeMo-Gym's recorded rollouts, served: the same verdict from the same checker answer ----------------------------

def test_nemo_gym_recorded_rollouts_reach_the_same_verdict():
    folder = nemo_gym_folder("math_formal_lean") / "data"
    problems = {json.loads(line)["name"]: json.loads(line)
                for line in (folder / "minif2f_test.jsonl").read_text().splitlines()}
    recorded = [json.loads(line) for line in (folder / "example_rollouts.jsonl").read_text().splitlines()]
    replay = {row["predicted_proof"]: row["compiler_output"] for row in recorded}
    with serve(checker_app(replay=replay)) as checker_url, \
            serve(_server(checker_url=checker_url).create_app()) as url:
        for row in recorded:
            name = re.search(r"theorem (\S+)", row["predicted_proof"]).group(1)
            problem = {key: value for key, value in problems[name].items() if key != "responses_create_params"}
            body = {**problem, "responses_create_params": row["responses_create_params"], "response": row["response"]}
            result = httpx.post(f"{url}/verify", json=body, timeout=60).json()
            assert (result["reward"], result["proof_status"]) == (row["reward"], row["proof_status"]), name
            assert result["predicted_proof"] == row["predicted_proof"]
            assert result["compiler_output"] == row["compiler_output"]
    assert sorted(row["reward"] for row in recorded) == [0.0, 0.0, 0.0, 0.0, 1.0]
